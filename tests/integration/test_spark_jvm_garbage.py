"""Counted on real local Spark: the py4j objects that pin dead batches in the driver JVM stay
bounded however many batches are written, even where Python's own cyclic collector never runs
(a daemon whose heap is stable), and grow with the batches without the sink's collections."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from py4j.java_gateway import JavaObject

from kclpy_spark.spark.jvm_garbage import JvmGarbage
from kclpy_spark.spark.pieces import SCHEMA
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.sinks import WRITE_OPTIONS


def _table(rows: int, start: int, *, payloads: int | None = None) -> pa.Table:
    """Rows ``start``...; ``payloads``: that many distinct payloads and sequence numbers,
    repeated (else unique; repeated sequence numbers only test how columns are written)."""
    numbers = range(start, start + rows)
    kinds = payloads or rows + start
    return pa.table(
        [
            pa.array(["s"] * rows),
            pa.array(["shardId-000000000000"] * rows),
            pa.array([str(10**20 + n % kinds) for n in numbers]),
            pa.array([0] * rows, pa.int64()),
            pa.array([f"pk-{n % 7}" for n in numbers]),
            pa.array([1_700_000_000_000 + n for n in numbers], pa.int64()).cast(
                SCHEMA.field(5).type
            ),
            pa.array([f"{n % kinds:012d}".encode() * 10 for n in numbers], pa.binary()),
        ],
        schema=SCHEMA,
    )


def _py4j_objects() -> int:
    """JavaObjects Python still tracks, alive or dead in a cycle: each pins a JVM object."""
    return sum(1 for o in gc.get_objects() if isinstance(o, JavaObject))


@pytest.fixture
def no_automatic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


def _write_batches(holder: SparkSessionHolder, out: Path, batches: int) -> list[int]:
    counts = []
    for i in range(batches):
        df = holder.to_df(_table(500, i * 500))
        df.write.options(**WRITE_OPTIONS).parquet(str(out / f"b{i}"))
        del df
        counts.append(_py4j_objects())
    return counts


def test_py4j_objects_stay_bounded_over_many_batches(
    spark: Any, tmp_path: Path, no_automatic_gc: None
) -> None:
    garbage = JvmGarbage(max_frames=8)
    holder = SparkSessionHolder.adopt(spark, jvm_garbage=garbage)
    counts = _write_batches(holder, tmp_path, 32)
    assert garbage.collections == 3
    # After the first cycle of eight frames the count never rises above that cycle's peak. (The
    # count is process-wide: the threads alive are named in case a thread an earlier test in
    # this process left behind made JavaObjects meanwhile; failed once in a CI trial.)
    threads = sorted(t.name for t in threading.enumerate())
    assert max(counts[8:]) <= max(counts[:8]), (counts, threads)


def test_without_the_collections_they_grow_with_every_batch(
    spark: Any, tmp_path: Path, no_automatic_gc: None
) -> None:
    garbage = JvmGarbage(max_frames=10**9, max_bytes=10**15)
    holder = SparkSessionHolder.adopt(spark, jvm_garbage=garbage)
    counts = _write_batches(holder, tmp_path, 16)
    assert garbage.collections == 0
    assert counts[-1] - counts[0] >= 15 * 4  # several JavaObjects per batch (8 here), never freed


@pytest.mark.parametrize("pieces", [1, 3])
def test_the_parquet_sink_writes_unique_columns_without_a_dictionary(
    spark: Any, tmp_path: Path, pieces: int
) -> None:
    """Sequence numbers, partition keys and payloads are written plain (no dictionary to build
    and drop): here their values repeat, so Parquet would keep a dictionary for them if it
    built one; the other columns keep theirs. One piece: unpartitioned; several: partitioned."""
    import pyarrow.parquet as pq

    from checkpoint.sequence import ExtendedSequenceNumber
    from kclpy_spark.spark.pieces import Piece, PieceKey, batch_id_of
    from kclpy_spark.spark.sink_batch import SinkBatch
    from kclpy_spark.spark.sinks import ParquetSink

    holder = SparkSessionHolder.adopt(spark)
    table = _table(300 * pieces, 0, payloads=5)
    parts = []
    for i in range(pieces):
        seqs = table.column("sequence_number").to_pylist()[i * 300 : (i + 1) * 300]
        key = PieceKey(
            f"shard-{i}", ExtendedSequenceNumber(seqs[0], 0), ExtendedSequenceNumber(seqs[-1], 0)
        )
        parts.append(Piece(key, f"shard-{i}", 300))
    sink = ParquetSink(tmp_path / "out")
    batch = SinkBatch(batch_id_of([p.key for p in parts]), tuple(parts), table, to_df=holder.to_df)
    sink.write(batch)
    files = sorted((tmp_path / "out").glob("kcl_piece=*/*.parquet"))
    assert len({f.parent for f in files}) == pieces
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for i in range(meta.num_columns):
            column = meta.row_group(0).column(i)
            plain = column.path_in_schema in {"sequence_number", "partition_key", "data"}
            assert column.has_dictionary_page is not plain, column.path_in_schema


def test_the_driver_heap_figures_come_from_the_real_jvm(spark: Any, tmp_path: Path) -> None:
    from kclpy_spark.spark.jvm_heap import read_heap

    jvm = spark.sparkContext._jvm
    jvm.java.lang.System.gc()  # so that every heap pool has a "after its last collection" figure
    figures = read_heap(jvm)
    assert figures.live is not None and 0 < figures.live <= figures.limit
    assert 0 < figures.used <= figures.limit
    holder = SparkSessionHolder.adopt(spark)
    assert holder.heap is not None and holder.heap.figures is None
    holder.to_df(_table(10, 0)).count()
    assert holder.heap.figures is not None and holder.heap.figures.limit == figures.limit
