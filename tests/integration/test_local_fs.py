"""The Parquet sink's local filesystem without a chmod process (kclpy_spark/spark/local_fs.py): the
shipped jar is its source compiled, the class sets exactly the modes Hadoop asks for, and a real
``local[2]`` session's sink writes go through it (no ``.crc`` files: it is the raw filesystem)
with the modes Hadoop's default filesystem gives."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark import local_fs
from kclpy_spark.spark.pieces import SCHEMA, Piece, PieceKey, batch_id_of
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sinks import ParquetSink

REPO = Path(__file__).resolve().parents[2]
CLASS_ENTRY = "kclpyspark/NoForkLocalFileSystem.class"
BUILT_WITH = "javac 17.0.15"  # scripts/build_localfs_jar.sh, last run with this


def _batch(spark: Any, pieces: int, rows: int = 50) -> SinkBatch:
    total = pieces * rows
    table = pa.table(
        [
            pa.array(["s"] * total),
            pa.array([f"shardId-{n // rows:012d}" for n in range(total)]),
            pa.array([str(10**20 + n) for n in range(total)]),
            pa.array([0] * total, pa.int64()),
            pa.array([f"pk-{n}" for n in range(total)]),
            pa.array([1_700_000_000_000] * total, pa.int64()).cast(SCHEMA.field(5).type),
            pa.array([str(n).encode() for n in range(total)], pa.binary()),
        ],
        schema=SCHEMA,
    )
    parts = []
    for i in range(pieces):
        first, last = str(10**20 + i * rows), str(10**20 + (i + 1) * rows - 1)
        ends = ExtendedSequenceNumber(first, 0), ExtendedSequenceNumber(last, 0)
        key = PieceKey(f"lease-{i}", *ends)
        parts.append(Piece(key, f"shardId-{i:012d}", rows))
    holder = SparkSessionHolder.adopt(spark)
    return SinkBatch(batch_id_of([p.key for p in parts]), tuple(parts), table, to_df=holder.to_df)


def _modes(root: Path) -> tuple[set[int], set[int]]:
    """The permission bits of the files and of the folders under ``root`` (itself included)."""
    files, folders = set(), {stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        (folders if path.is_dir() else files).add(stat.S_IMODE(path.stat().st_mode))
    return files, folders


def _javac() -> str | None:
    if shutil.which("javac") is None:
        return None
    answer = subprocess.run(["javac", "-version"], capture_output=True, text=True, check=False)
    return (answer.stdout + answer.stderr).strip()


def test_the_shipped_jar_is_its_java_source_compiled(tmp_path: Path) -> None:
    """Built again from the source, the class is byte for byte the one shipped (with the javac
    that built it: another version may order a class file differently)."""
    javac = _javac()
    if javac != BUILT_WITH:
        pytest.skip(f"the jar was built with {BUILT_WITH}; here: {javac or 'no javac'}")
    built = tmp_path / "built.jar"
    subprocess.run(["bash", str(REPO / "scripts" / "build_localfs_jar.sh"), str(built)],
                   check=True, capture_output=True,
                   env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    with zipfile.ZipFile(built) as fresh, zipfile.ZipFile(local_fs.JAR) as shipped:
        assert fresh.namelist() == shipped.namelist()
        assert fresh.read(CLASS_ENTRY) == shipped.read(CLASS_ENTRY), (
            "the jar is stale: run scripts/build_localfs_jar.sh"
        )


def _set_mode(spark: Any, target: Path, mode: int) -> None:
    jvm = spark.sparkContext._jvm
    fs = jvm.kclpyspark.NoForkLocalFileSystem()
    fs.initialize(jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration())
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission(mode)
    fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(target)), permission)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644, 0o700, 0o755, 0o000, 0o777])
def test_the_class_sets_exactly_the_mode_asked(spark: Any, tmp_path: Path, mode: int) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x")
    _set_mode(spark, target, mode)
    assert stat.S_IMODE(target.stat().st_mode) == mode


def test_a_folders_setgid_bit_stays_as_chmod_keeps_it(spark: Any, tmp_path: Path) -> None:
    """A group-shared output folder (setgid: new files get its group) keeps the bit, as
    Hadoop's ``chmod 0755`` keeps it; java.nio alone would clear it."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o2775)
    _set_mode(spark, folder, 0o755)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o2755


@pytest.mark.parametrize("pieces", [1, 3])
def test_the_parquet_sink_writes_through_it_with_hadoops_modes(
    spark: Any, tmp_path: Path, pieces: int
) -> None:
    """One piece (unpartitioned) and several (partitioned by piece): the records all there,
    written by the class (its own statistics count the bytes; no checksum files), with the
    modes Hadoop asks for (0666 files and 0777 folders under its umask, here 077)."""
    assert local_fs.write_options(spark.range(1)) == local_fs.OPTIONS  # local[2], jar on the path
    jvm = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    fs_class = jvm.java.lang.Class.forName(local_fs.CLASS, False, loader)
    stats = jvm.org.apache.hadoop.fs.FileSystem.getStatistics("file", fs_class)
    written_before = stats.getBytesWritten()
    spark.conf.set("fs.permissions.umask-mode", "077")  # into each write's Hadoop configuration
    try:
        ParquetSink(tmp_path / "out").write(_batch(spark, pieces))
    finally:
        spark.conf.unset("fs.permissions.umask-mode")
    assert stats.getBytesWritten() > written_before, "the class wrote nothing"
    out = tmp_path / "out"
    published = sorted(out.glob("kcl_piece=*"))
    assert len(published) == pieces
    assert not list(out.rglob("*.crc")), "written by Hadoop's checksummed filesystem"
    files, folders = _modes(published[0])
    assert files == {0o600} and folders == {0o700}
    back = spark.read.parquet(str(out)).select("data").collect()
    assert sorted(int(bytes(r[0]).decode()) for r in back) == list(range(pieces * 50))


def test_without_it_the_same_write_has_checksum_files(spark: Any, tmp_path: Path) -> None:
    """What the checks above tell apart: Hadoop's default filesystem writes ``.crc`` files."""
    df = spark.range(10)
    df.write.parquet(str(tmp_path / "default"))
    df.write.options(**local_fs.OPTIONS).parquet(str(tmp_path / "nofork"))
    assert list((tmp_path / "default").rglob("*.crc"))
    assert not list((tmp_path / "nofork").rglob("*.crc"))
