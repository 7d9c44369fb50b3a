"""What a foreachBatch function's Spark work costs per batch, apart from everything else: a
100,000-row batch of the sink's shape (shard id, sequence number, 200-byte payload) made into a
DataFrame from Arrow, as the sink hands it to a function, then one action on it. Wall time and
CPU per batch, Python and the driver JVM apart, after a warm-up. Python's collector runs after
every batch, as the sink makes it run (spark/jvm_garbage.py): without it the driver's heap fills
with dead batches.

    python bench/spark_action_cost.py [--rows 100000] [--batches 30]

Answers the question of how much of the "two sinks" variant's cost (bench_pipeline.py) is the
function's own Spark work rather than the sink machinery around it.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
from pipeline_measure import note_tree, split_cpu


def batch(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    shards = np.array([f"shardId-{i:012d}" for i in range(4)])[np.arange(rows) % 4]
    payload = rng.integers(0, 256, size=(rows, 200), dtype=np.uint8)
    return pa.table(
        {
            "shard_id": pa.array(shards),
            "sequence_number": pa.array([str(10**40 + i) for i in range(rows)]),
            "data": pa.array([bytes(row) for row in payload], pa.binary()),
        }
    )


def cpu_split(proc: psutil.Process) -> tuple[float, float]:
    """CPU seconds so far of this process's tree: Python, and the driver JVM."""
    seen: dict[int, tuple[str, float]] = {}
    note_tree(proc, seen)
    used = split_cpu(seen)
    return used["python"], used["jvm"]


def measure(name: str, step: Callable[[], Any], batches: int, rows: int) -> str:
    proc = psutil.Process()
    for _ in range(10):  # warm-up: the JIT compiles the per-row code
        step()
        gc.collect()
    (py0, jvm0), wall0 = cpu_split(proc), time.perf_counter()
    for _ in range(batches):
        step()
        gc.collect()
    (py1, jvm1), wall1 = cpu_split(proc), time.perf_counter()
    per = 1000.0 / batches
    us = 1e6 / (batches * rows)
    return (
        f"| {name} | {(wall1 - wall0) * per:.0f} | {(py1 - py0) * per:.0f} | "
        f"{(jvm1 - jvm0) * per:.0f} | {(jvm1 - jvm0) * us:.1f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--target", default="local[2]")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.target)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    table = batch(args.rows)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("createDataFrame(arrow) only", lambda: spark.createDataFrame(table)),
        ("... + count()", lambda: spark.createDataFrame(table).count()),
        (
            "... + groupBy(shard_id).count().collect() (bench_pipeline's function)",
            lambda: spark.createDataFrame(table).groupBy("shard_id").count().collect(),
        ),
    ]
    print(f"{args.rows:,} rows a batch, {args.batches} batches after 10 to warm up, {args.target}")
    print()
    print("| per batch | wall ms | Python CPU ms | JVM CPU ms | JVM us per row |")
    print("|---|---:|---:|---:|---:|")
    for name, step in steps:
        print(measure(name, step, args.batches, args.rows), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
