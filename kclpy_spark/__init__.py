"""kclpy-spark: a pure-Python, KCL-style Kinesis consumer with amazon-kclpy's processor API.

Import-light on purpose: a worker that only runs RecordProcessors must start fast, so nothing here
may import pyspark, boto3, botocore or aiobotocore. Import the Spark sink and the AWS adapters from
their own modules.
"""

from kclpy_spark._version import __version__
from kclpy_spark.processor import (
    Checkpointer,
    CheckpointError,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    Record,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
    is_async,
)

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "InitializeInput",
    "LeaseLostInput",
    "ProcessRecordsInput",
    "Record",
    "RecordProcessor",
    "ShardEndedInput",
    "ShutdownRequestedInput",
    "__version__",
    "is_async",
]
