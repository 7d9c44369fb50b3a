"""Static registration of the ``kinesis-kcl`` streaming source: at its first data-source lookup
Spark imports every top-level module named ``pyspark_*`` and registers its ``DefaultSource``,
so ``spark.readStream.format("kinesis-kcl")`` works after ``pip install 'kclpy-spark[spark]'``
with no registration line (``kclpy_spark/readstream/data_source.py`` is the source). Without the
``[spark]`` extra (pyarrow missing) this module defines nothing: Spark's lookup of every other
data source must not fail because of it."""

try:
    from kclpy_spark.readstream.data_source import KinesisKclDataSource as DefaultSource
except ImportError:  # pragma: no cover - a core install beside a pyspark without pyarrow
    pass
else:
    __all__ = ["DefaultSource"]
