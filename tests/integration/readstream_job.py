"""A Spark job for test_readstream_kill9.py: ``format("kinesis-kcl")`` with Trigger.AvailableNow
into Spark's Parquet file sink (its own commit log: what makes it exactly once).

    python readstream_job.py ENDPOINT STREAM OUT PINS
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from kclpy_spark.readstream.source import KinesisKclDataSource


def main() -> None:
    endpoint, stream, out, pins = sys.argv[1:5]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(KinesisKclDataSource)
    df = (spark.readStream.format("kinesis-kcl").option("streamName", stream)
          .option("endpointUrl", endpoint).option("initialPosition", "TRIM_HORIZON")
          .option("maxRecordsPerShard", "40").option("pinLocation", pins).load())  # fmt: skip
    query = (df.writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", f"{out}-checkpoint")
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
