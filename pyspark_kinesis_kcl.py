"""Static registration of the ``kinesis-kcl`` streaming source: at its first data-source lookup
Spark imports every top-level module named ``pyspark_*`` and registers its ``DefaultSource``,
so ``spark.readStream.format("kinesis-kcl")`` works after ``pip install 'kclpy-spark[spark]'``
with no registration line (``kclpy_spark/readstream/source.py`` is the source)."""

from kclpy_spark.readstream.source import KinesisKclDataSource as DefaultSource

__all__ = ["DefaultSource"]
