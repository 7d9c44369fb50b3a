"""A read round's ranges travel in its Spark job's function. PySpark broadcasts a function pickled
past ``spark.broadcast.UDFCompressionThreshold`` (1 MiB by default) through a temporary file on
the driver that nothing deletes: from ~1,150 leases a round (multi-stream keys; ~1,550
single-stream), one file a round (gigabytes an hour). A round is cut into jobs of at most
``CLOSURE_BYTES`` of ranges, each pickled below it."""

from __future__ import annotations

import functools
import secrets

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.cluster_read import CLOSURE_BYTES, _closure_sized
from kclpy_spark.spark.range_tasks import AwsTarget, read_partition
from kclpy_spark.spark.ranges import ReadRange

UDF_COMPRESSION_THRESHOLD = 1024 * 1024  # Spark's default


def ranges_json(n: int) -> tuple[str, ...]:
    """``n`` ranges as a round plans them: multi-stream keys, each with a live iterator."""
    stream = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders-events-production"
    return tuple(
        ReadRange(
            lease_key=f"123456789012:orders-events-production:1700000000:shardId-{i:012d}",
            stream=stream,
            stream_arg={"StreamARN": stream},
            shard_id=f"shardId-{i:012d}",
            after=ExtendedSequenceNumber(str(49650000000000000000000000000000000000000000 + i)),
            iterator=secrets.token_urlsafe(260),  # as long and as random as Kinesis's
            max_seconds=20.0,
        ).to_json()
        for i in range(n)
    )


def test_a_round_of_many_leases_is_cut_into_jobs_each_pickled_below_the_threshold() -> None:
    from pyspark.serializers import CloudPickleSerializer

    payload = ranges_json(3000)
    runs = _closure_sized(payload)
    assert len(runs) > 1 and sum(runs, ()) == payload  # every range once, in order
    aws = AwsTarget("eu-west-1", None)
    for run in runs:
        assert sum(map(len, run)) <= CLOSURE_BYTES
        pickled = CloudPickleSerializer().dumps(functools.partial(read_partition, run, aws))
        assert len(pickled) < UDF_COMPRESSION_THRESHOLD
    assert len(_closure_sized(ranges_json(500))) == 1  # a round of 500 leases: one job


def test_a_range_larger_than_the_budget_is_a_job_of_its_own() -> None:
    big, small = "x" * (CLOSURE_BYTES + 1), "y" * 10
    assert _closure_sized((small, big, small)) == [(small,), (big,), (small,)]
