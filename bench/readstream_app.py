"""A Spark user's job for ``bench_readstream.py``: ``spark.readStream.format("kinesis-kcl")``
with Trigger.AvailableNow into Spark's Parquet file sink, as the docs show it.

    python bench/readstream_app.py ENDPOINT STREAM OUT_FOLDER TARGET
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def main() -> None:
    endpoint, stream, out, target = sys.argv[1:5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    spark = (SparkSession.builder.master(target).appName("kclpy-spark-readstream-bench")
             .config("spark.ui.enabled", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("WARN")
    # The explicit line (an installed wheel needs none; the checkout's editable install hides
    # the top-level module from Spark's lookup when the job runs outside the checkout).
    from kclpy_spark.readstream.source import KinesisKclDataSource

    spark.dataSource.register(KinesisKclDataSource)
    df = (spark.readStream.format("kinesis-kcl").option("streamName", stream)
          .option("endpointUrl", endpoint).option("initialPosition", "TRIM_HORIZON")
          .option("pinLocation", f"{out}-pins").load())  # fmt: skip
    query = (df.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", f"{out}-checkpoint")
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
