"""What the driver's Python spends on calls to its JVM, with plain arguments passed straight
through (``kclpy_spark/spark/py4j_args.py``) and with py4j's search through its converters.

The calling thread's CPU time (``time.thread_time``: the Python side only; a call waits for the
JVM's answer without CPU) per operation, median over rounds that alternate the two ways in one
process, for a bare call with one string argument and for the DataFrame work the daemon does
every batch and read round (no Spark job runs: only the plans are built):

    python bench/bench_jvm_arguments.py [--rounds 15] [--repeat 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa


def _read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def operations(spark: Any) -> list[tuple[str, Callable[[], Any]]]:
    from checkpoint.sequence import ExtendedSequenceNumber as ESN
    from kclpy_spark.spark.cluster_read import RangeRead, _output_type
    from kclpy_spark.spark.frames import ExecutorFrames, RangeChunk
    from kclpy_spark.spark.pieces import Piece, PieceKey
    from kclpy_spark.spark.ranges import RangeEnd
    from kclpy_spark.spark.sinks import _writer

    sb = spark.sparkContext._jvm.java.lang.StringBuilder()
    # A read of 25 leases (its plan only: no job runs), whose batch holds 24 of them.
    keys = [f"shardId-{i:012d}" for i in range(25)]
    stored = spark.range(0, 25, 1, 2).mapInArrow(_read, _output_type())
    read = RangeRead(stored, {k: RangeEnd(k, None, None, 0, 0) for k in keys})
    chunks = [RangeChunk(None, ESN("1"), ESN("2"), read=read, lease_key=k) for k in keys]
    pieces = [Piece(PieceKey(k, ESN("1"), ESN("2")), k, 1) for k in keys[:24]]
    frames = ExecutorFrames(chunks, lambda df: df)

    def frame() -> Any:
        return frames.frame(pieces, index_column="piece")

    framed = frame()
    return [
        ("one call, one string argument", lambda: sb.indexOf("abc")),
        ("a read job's plan (mapInArrow of 24 ranges, 2 tasks)",
         lambda: spark.range(0, 24, 1, 2).mapInArrow(_read, _output_type())),
        ("a batch's frame of 24 leases (ExecutorFrames.frame)", frame),
        ("the Parquet sink's writer (its options, partitionBy)",
         lambda: _writer(framed).partitionBy("piece")),
    ]  # fmt: skip


def per_op_us(op: Callable[[], Any], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        op()
    return (time.thread_time() - start) / repeat * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=200, help="operations a round")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from py4j import protocol
    from pyspark.sql import SparkSession

    from kclpy_spark.spark.py4j_args import PLAIN_ARGUMENTS, pass_plain_arguments
    from kclpy_spark.spark.session import SparkTarget, classic_conf

    builder = SparkSession.builder.master("local[1]")
    for key, value in classic_conf(SparkTarget.parse("local[1]"), {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def plain(on: bool) -> None:
        if on:
            pass_plain_arguments()
        elif PLAIN_ARGUMENTS in protocol.INPUT_CONVERTER:
            protocol.INPUT_CONVERTER.remove(PLAIN_ARGUMENTS)

    ops = operations(spark)
    for _, op in ops:  # warm-up
        for on in (True, False):
            plain(on)
            per_op_us(op, args.repeat // 4 or 1)
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for name, op in ops:
            for on in (True, False):
                plain(on)
                times.setdefault((name, on), []).append(per_op_us(op, args.repeat))
    plain(True)
    lines = [
        f"driver Python CPU per operation, median of {args.rounds} alternated rounds of "
        f"{args.repeat}, local[1], Spark {spark.version}",
        "",
        "| operation | passed straight, us | through the converters, us | ratio |",
        "|---|---:|---:|---:|",
    ]
    for name, _ in ops:
        fast = statistics.median(times[(name, True)])
        slow = statistics.median(times[(name, False)])
        lines.append(f"| {name} | {fast:.0f} | {slow:.0f} | {fast / slow:.2f}x |")
    print("\n".join(lines))
    if not args.no_write:
        out = Path(__file__).parent / "results" / "jvm-arguments.md"
        out.write_text("# Calls to the driver's JVM: plain arguments\n\n" + "\n".join(lines) + "\n")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
