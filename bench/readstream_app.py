"""A Spark user's job: ``spark.readStream.format("kinesis-kcl")`` with Trigger.AvailableNow
into Spark's Parquet file sink, as the docs show it (``bench_readstream.py`` times it;
``tests/integration/test_readstream_kill9.py`` kills it). Further source options as
``name=value`` after the four arguments.

    python bench/readstream_app.py ENDPOINT STREAM OUT_FOLDER TARGET [option=value ...]
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def main() -> None:
    endpoint, stream, out, target = sys.argv[1:5]
    extra = dict(arg.split("=", 1) for arg in sys.argv[5:])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    spark = (SparkSession.builder.master(target).appName("kclpy-spark-readstream-bench")
             .config("spark.ui.enabled", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("WARN")
    # The explicit line (an installed wheel needs none; the checkout's editable install hides
    # the top-level module from Spark's lookup when the job runs outside the checkout).
    from kclpy_spark.readstream.data_source import KinesisKclDataSource

    spark.dataSource.register(KinesisKclDataSource)
    options = {"streamName": stream, "endpointUrl": endpoint, "initialPosition": "TRIM_HORIZON",
               "pinLocation": f"{out}-pins", **extra}  # fmt: skip
    df = spark.readStream.format("kinesis-kcl").options(**options).load()
    query = (df.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", f"{out}-checkpoint")
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
