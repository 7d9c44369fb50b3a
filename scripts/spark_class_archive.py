"""Make the class-data archive the test suite's JVMs map (scripts/_test_jvm.sh; tests only).

Runs one local Spark session configured as the daemon's own (``SparkSessionHolder``) through the
kinds of work the tests give Spark (a DataFrame from Arrow, a Python ``mapInArrow``, a Parquet
write and read, a collect) with ``-XX:ArchiveClassesAtExit``: the JVM writes every class it
loaded to the archive when it exits. A later JVM started with the same class path maps them
instead of loading and verifying each again (about half a Spark driver's start-up CPU on two
cores). Usage: ``python scripts/spark_class_archive.py ARCHIVE`` (written whole or not at all).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _work(folder: Path, archive: Path) -> int:
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    from kclpy_spark.spark.session import SparkSessionHolder

    # The driver's own option (the launcher JVM that spark-submit runs first must not dump).
    conf = {"spark.driver.extraJavaOptions": f'-XX:ArchiveClassesAtExit="{archive}"'}
    holder = SparkSessionHolder("local[2]", conf=conf)
    spark = holder.session()
    try:
        numbers = list(range(2000))
        parts = [n % 4 for n in numbers]
        table = pa.table({"n": numbers, "p": parts, "s": list(map(str, numbers))})
        frame = spark.createDataFrame(table)

        def same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            yield from batches

        frame = frame.mapInArrow(same, frame.schema)
        for i in range(3):
            frame.write.mode("overwrite").partitionBy("p").parquet(str(folder / f"out{i % 2}"))
        spark.read.parquet(str(folder / "out0")).groupBy("s").count().collect()
    finally:
        holder.stop()
    return _wait_for_jvm_exit()


def _wait_for_jvm_exit() -> int:
    """The driver JVM writes the archive as it exits, which it does once its stdin closes;
    returns its exit status (an archive of a JVM that failed is not used)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return 1
    if proc.stdin is not None:
        proc.stdin.close()
    return int(proc.wait(timeout=300))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: spark_class_archive.py ARCHIVE", file=sys.stderr)
        return 2
    target = Path(argv[1]).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix=".cds-", dir=target.parent) as tmp:
        partial = Path(tmp) / "spark.jsa"
        status = _work(Path(tmp), partial)
        if status != 0 or not partial.exists():
            print(f"spark_class_archive: no archive (JVM exit status {status})", file=sys.stderr)
            return 1
        os.replace(partial, target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
