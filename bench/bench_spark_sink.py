"""Throughput of the Spark sink against a bare Spark write of the same rows, in the same run:
``python bench/bench_spark_sink.py`` (about 2-4 minutes on 2 cores).

* **bare**: ``spark.createDataFrame(pyarrow.Table)`` + ``df.write.mode("append").parquet(...)``,
  one write per batch of ``--rows`` rows, the tables built before the clock starts.
* **sink**: the same rows as ``Record`` objects (what the worker hands a processor), delivered by
  one thread per lease (``--leases``, 10,000 records per ``process_records`` call, as GetRecords
  returns them) to ``SparkSinkProcessor``s sharing one ``MicroBatcher`` with the idempotent
  ``ParquetSink``: conversion to Arrow, micro-batching (``max_records = --rows``), the pending
  checkpoint before each write, the write, the renames, the acknowledgment and the checkpoint
  commit in a SQLite lease table. The clock stops when the last checkpoint is committed.

Rounds alternate bare and sink so that both see the same machine load; the ratio is
sink rows/s over bare rows/s per round, and the median over rounds is reported. Prints a markdown
section (also written to ``bench/results/spark_sink.md``).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checkpoint.base.clock import SystemClock
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.processor import InitializeInput, ProcessRecordsInput, Record
from kclpy_spark.spark.micro_batcher import BatcherSettings, DrainResult, MicroBatcher
from kclpy_spark.spark.pieces import records_to_chunk
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.sink_processor import SparkSinkProcessor
from kclpy_spark.spark.sinks import ParquetSink

GETRECORDS = 10_000  # records per process_records call


def make_records(lease: int, first: int, count: int, size: int) -> list[Record]:
    payload = os.urandom(size)
    base = 10**20 * (lease + 1)
    return [
        Record(payload, f"pk-{i}", str(base + i), 0, 1_700_000_000_000 + i)
        for i in range(first, first + count)
    ]


def bare_round(holder: SparkSessionHolder, tables: list[Any], out: Path) -> float:
    spark = holder.session()
    start = time.perf_counter()
    for table in tables:
        spark.createDataFrame(table).write.mode("append").parquet(str(out))
    return time.perf_counter() - start


def sink_round(
    holder: SparkSessionHolder,
    per_lease: list[list[Record]],
    rows: int,
    scope: str,
    work: Path,
) -> tuple[float, dict[str, Any]]:
    leases = [f"shardId-{i:012d}" for i in range(len(per_lease))]
    table = SQLiteLeaseTable(work / "leases.db", namespace="bench")
    table.ensure_table()
    for key in leases:
        table.create_lease_if_absent(Lease(key, TRIM_HORIZON))
    holder_ = LeaseHolder(table, "bench", SystemClock(), 1e9)
    settings = BatcherSettings(max_records=rows, max_wait=3600.0, scope=scope)  # type: ignore[arg-type]
    batcher = MicroBatcher(
        ParquetSink(work / "sink"), settings, to_df=holder.to_df, interrupter=holder
    )
    processors, cps = [], []
    for key in leases:
        stored = table.get_lease(key)
        assert stored is not None
        taken = table.take_lease(stored, "bench")
        assert taken is not None
        held = holder_.add_taken(taken)
        cps.append(Checkpointer(holder_, key, held.token, taken.checkpoint))
        proc = SparkSinkProcessor(batcher, "bench-stream", 60.0)
        proc.initialize(InitializeInput(key, "TRIM_HORIZON"))
        processors.append(proc)

    def feed(i: int) -> None:
        records = per_lease[i]
        for at in range(0, len(records), GETRECORDS):
            part = records[at : at + GETRECORDS]
            last = part[-1]
            cps[i].set_largest_permitted(ExtendedSequenceNumber(last.sequence_number))
            processors[i].process_records(ProcessRecordsInput(part, 0, cps[i]))

    start = time.perf_counter()
    threads = [threading.Thread(target=feed, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for proc in processors:
        lane = proc._lane
        assert lane is not None
        assert batcher.drain(lane, None, final=False) is DrainResult.DONE
    elapsed = time.perf_counter() - start
    status = batcher.status()
    batcher.close()
    for key, records in zip(leases, per_lease, strict=True):
        stored = table.get_lease(key)
        assert stored is not None
        assert stored.checkpoint.sequence_number == records[-1].sequence_number
    return elapsed, status["stats"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows per batch")
    parser.add_argument("--batches", type=int, default=5, help="batches per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--leases", type=int, default=4)
    parser.add_argument("--size", type=int, default=200, help="payload bytes per record")
    parser.add_argument("--scope", default="worker", choices=["worker", "lease"])
    parser.add_argument("--target", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], help="key=value Spark setting")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "spark_sink.md"))
    args = parser.parse_args()

    total = args.rows * args.batches
    per = total // args.leases
    per_lease = [make_records(i, 0, per, args.size) for i in range(args.leases)]
    records_to_chunk(per_lease[0][:GETRECORDS], "bench-stream", "s")  # first call sets up Arrow
    t0 = time.perf_counter()
    chunks = [records_to_chunk(r[:GETRECORDS], "bench-stream", "s") for r in per_lease]
    convert_us = (time.perf_counter() - t0) / (GETRECORDS * len(chunks)) * 1e6
    # The bare path writes the same rows, already in Arrow, in batches of --rows.
    import pyarrow as pa

    all_chunks = [
        records_to_chunk(r[at : at + GETRECORDS], "bench-stream", f"shardId-{i:012d}").batch
        for i, r in enumerate(per_lease)
        for at in range(0, per, GETRECORDS)
    ]
    big = pa.Table.from_batches(all_chunks)
    tables = [big.slice(i * args.rows, args.rows) for i in range(args.batches)]

    conf = dict(item.split("=", 1) for item in args.conf)
    holder = SparkSessionHolder(args.target, conf=conf)
    spark = holder.session()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-sink-"))
    try:
        bare_round(holder, tables[:1], work / "warm")  # JVM and Python workers warm
        sink_round(
            holder,
            [r[: args.rows // args.leases] for r in per_lease],
            args.rows,
            args.scope,
            work / "warm-sink",
        )
        results = []
        for n in range(args.rounds):
            bare = bare_round(holder, tables, work / f"bare-{n}")
            sink, stats = sink_round(holder, per_lease, args.rows, args.scope, work / f"sink-{n}")
            results.append((total / bare, total / sink, stats))
            print(
                f"round {n + 1}: bare {total / bare:,.0f} rows/s, sink {total / sink:,.0f} "
                f"rows/s, ratio {bare / sink:.2f} ({stats['batches']} batches; "
                f"bare {bare:.2f}s, sink {sink:.2f}s = prepare {stats['prepare_seconds']:.2f}s "
                f"+ write {stats['write_seconds']:.2f}s + commit {stats['commit_seconds']:.2f}s"
                " + waiting)",
                flush=True,
            )
        check = spark.read.parquet(str(work / "sink-0" / "sink")).count()
        assert check == total, f"sink output has {check} rows, expected {total}"
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    ratios = [s / b for b, s, _ in results]
    lines = [
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: `python bench/bench_spark_sink.py "
        f"--rows {args.rows} --batches {args.batches} --rounds {args.rounds} --leases "
        f"{args.leases} --scope {args.scope} --target {args.target}`",
        f"on {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; "
        f"Spark {spark.version}, {args.size}-byte payloads.",
        "",
        "| round | bare rows/s | sink rows/s | sink / bare |",
        "|---:|---:|---:|---:|",
    ]
    for n, (b, s, _) in enumerate(results, 1):
        lines.append(f"| {n} | {b:,.0f} | {s:,.0f} | {s / b:.2f} |")
    lines += [
        "",
        f"Median ratio: **{statistics.median(ratios):.2f}** (target >= 0.80). Record -> Arrow "
        f"conversion costs {convert_us:.2f} us/record, done in the feeding threads while the "
        "previous batch is written.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("# Spark sink throughput\n\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
