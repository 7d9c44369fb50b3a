"""A batch's DataFrame of records read on the executors (``frames.ExecutorFrames``), built over
stored reads made here with real local Spark (the session fixture): the rows of the batch's
pieces only, each with its piece's index, whatever a lease key holds; and a number of calls to
the JVM that does not grow with the leases of the batch (each call costs the driver's Python
tens of microseconds; a column of literals was two calls per lease and read)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jvm_calls import jvm_calls

from checkpoint.sequence import ExtendedSequenceNumber as ESN
from kclpy_spark.spark.cluster_read import RangeRead
from kclpy_spark.spark.frames import ExecutorFrames, RangeChunk
from kclpy_spark.spark.pieces import Piece, PieceKey
from kclpy_spark.spark.range_tasks import END_COLUMN, OUTPUT_DDL
from kclpy_spark.spark.ranges import RangeEnd
from kclpy_spark.spark.session import DEBUGGING
from kclpy_spark.spark.sql_text import sql_name, sql_string

INDEX = "piece_index"


def stored_read(spark: Any, rows: dict[str, int]) -> RangeRead:
    """A read as ``read_ranges`` returns it: stored rows (``rows[key]`` records of each lease,
    numbered from 1) and an end per lease."""
    data = [
        ("s", f"shard-{key}", str(n), 0, "pk", None, f"{key}/{n}".encode(), key, None)
        for key, count in rows.items()
        for n in range(1, count + 1)
    ]
    stored = spark.createDataFrame(data, OUTPUT_DDL).localCheckpoint()  # ends: none
    ends = {
        key: RangeEnd(key, ESN("1"), ESN(str(count)), count, count) for key, count in rows.items()
    }
    return RangeRead(stored, ends)


def chunks_of(read: RangeRead, keys: Sequence[str]) -> list[RangeChunk]:
    return [
        RangeChunk(None, ESN("1"), ESN("2"), read=read, lease_key=key, row_count=1, byte_count=1)
        for key in keys
    ]


def piece(key: str) -> Piece:
    return Piece(PieceKey(key, ESN("1"), ESN("2")), f"shard-{key}", 1)


def test_a_frame_holds_its_pieces_rows_with_their_index_and_no_other_lease(spark: Any) -> None:
    odd = "it's a \\ key"  # a quote and a backslash: the SQL text quotes them
    first = stored_read(spark, {"a": 2, "b": 3, odd: 1})
    second = stored_read(spark, {"c": 2, "d": 1})
    chunks = chunks_of(first, ["a", "b", odd]) + chunks_of(second, ["c", "d"])
    pieces = [piece("c"), piece(odd), piece("a")]  # not b, not d
    df = ExecutorFrames(chunks, lambda d: d).frame(pieces, index_column=INDEX)
    got = sorted((bytes(r["data"]).decode(), r[INDEX]) for r in df.collect())
    assert got == [("a/1", 2), ("a/2", 2), ("c/1", 0), ("c/2", 0), (f"{odd}/1", 1)]
    assert "kclpy_spark_lease" not in df.columns and END_COLUMN not in df.columns
    plain = ExecutorFrames(chunks, lambda d: d).frame([piece("b")])
    assert sorted(bytes(r["data"]) for r in plain.collect()) == [b"b/1", b"b/2", b"b/3"]
    assert plain.columns == df.columns[:-1]


def test_a_frames_calls_to_the_jvm_do_not_grow_with_its_leases(spark: Any) -> None:
    def calls(leases: int, reads: int) -> int:
        keys = [f"shardId-{i:012d}" for i in range(leases)]
        stored = [stored_read(spark, {key: 1 for key in keys}) for _ in range(reads)]
        chunks = [c for read in stored for c in chunks_of(read, keys)]
        frames = ExecutorFrames(chunks, lambda d: d)
        pieces = [piece(key) for key in keys[:-1]]  # one lease left out: each read is filtered
        with jvm_calls(spark) as count:
            frames.frame(pieces, index_column=INDEX)
        return count[0]

    few = calls(4, 2)
    # 9 here: the read columns dropped a call each (a drop of names built a Scala Seq: 14)
    assert few == calls(40, 2) <= 11
    assert calls(4, 6) - few <= 4 * 2  # a filter and a union a read, no more


def test_a_column_function_is_one_call_without_its_call_site_recorded(spark: Any) -> None:
    """The sessions this package starts (and the fixture's) do not record each Column function's
    Python call site in the JVM (``session.DEBUGGING``), which PySpark does by default."""
    from pyspark.errors import utils
    from pyspark.sql import functions as F

    def calls() -> int:
        F.col("warm")
        with jvm_calls(spark) as count:
            F.col("data")
        return count[0]

    assert spark.conf.get(DEBUGGING) == "false" and not utils.is_debugging_enabled()
    without = calls()
    utils._enable_debugging_cache = True  # as PySpark's default would have it
    try:
        recorded = calls()
    finally:
        utils._enable_debugging_cache = False
    assert without <= 3 and recorded >= without + 5


def test_sql_strings_quote_what_spark_sql_would_read_otherwise(spark: Any) -> None:
    for text in ("plain", "it's", "back\\slash", "\\'", "", "100%_x", "two\nlines", '"q"'):
        assert spark.sql(f"SELECT {sql_string(text)} AS v").first()["v"] == text


def test_sql_names_quote_any_column_name(spark: Any) -> None:
    for name in ("plain", "we`ird", "a.b", "sp ace", "``"):
        assert spark.sql(f"SELECT 1 AS {sql_name(name)}").columns == [name]
