"""Records/s of an amazon-kclpy application on each path: ``python bench/bench_multilang.py``.

The same application (``bench/multilang_bench_app.py``: add up each record's payload size,
checkpoint every batch at its last record, SHARD_END at the end) runs on:

* in-process: its amazon_kclpy v3 class inside the worker, through ``KclpyProcessorAdapter``;
* subprocess: ``python multilang_bench_app.py`` under amazon_kclpy's ``KCLProcess``, one child per
  lease, through ``SubprocessProcessor`` and the MultiLang protocol, as the Java daemon runs it;
* subprocess, raw child: the same work in a hand-written stdlib protocol loop (what the protocol
  itself costs, without amazon_kclpy's per-record objects);
* native: a kclpy-spark ``RecordProcessor`` doing the same work (the baseline).

The records come from memory, not from Kinesis or LocalStack, so the endpoint is not the limit:
pre-built batches of 100-byte records are handed to each processor exactly as ShardConsumer does
(a plain method runs in a worker thread with ``asyncio.to_thread``, an async one is awaited), with
a real Checkpointer on the in-memory lease table, ``set_largest_permitted`` before each batch,
then ``mark_shard_end`` and ``shard_ended``. Time runs from ``initialize`` (which starts the child)
to the end of ``shard_ended`` (the child has exited). Best of ``--runs`` runs. Needs amazon_kclpy
(installed without jars by ``tests/multilang/install_amazon_kclpy.py`` if missing). Prints a
markdown table and writes ``bench/results/multilang.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE), str(REPO / "tests" / "multilang")]

from install_amazon_kclpy import install  # noqa: E402

from checkpoint.base.clock import SystemClock  # noqa: E402
from checkpoint.checkpointer import Checkpointer  # noqa: E402
from checkpoint.lease import Lease  # noqa: E402
from checkpoint.leasing.holder import LeaseHolder  # noqa: E402
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber  # noqa: E402
from checkpoint.stores.memory import MemoryLeaseTable  # noqa: E402
from kclpy_spark.multilang.child import ChildSpec  # noqa: E402
from kclpy_spark.multilang.inprocess import KclpyProcessorAdapter  # noqa: E402
from kclpy_spark.multilang.subprocess_processor import SubprocessProcessor  # noqa: E402
from kclpy_spark.processor import (  # noqa: E402
    InitializeInput,
    ProcessRecordsInput,
    Record,
    RecordProcessor,
    ShardEndedInput,
    is_async,
)

RESULTS = HERE / "results" / "multilang.md"
APP = HERE / "multilang_bench_app.py"
SHARD = "shardId-000000000000"
SEQ_BASE = 49590338271490256608559692538361571095921575989136588800
PAYLOAD = 100


class Native(RecordProcessor):
    def initialize(self, initialize_input: InitializeInput) -> None:
        self.total = 0

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        records = process_records_input.records
        for record in records:
            self.total += len(record.binary_data)
        last = records[-1]
        process_records_input.checkpointer.checkpoint(
            last.sequence_number, last.sub_sequence_number
        )


def make_batches(total: int, batch: int) -> list[list[Record]]:
    payload = os.urandom(PAYLOAD)
    records = [
        Record(payload, f"pk-{n % 1000}", str(SEQ_BASE + n), 0, 1_700_000_000_000 + n)
        for n in range(1, total + 1)
    ]
    return [records[i : i + batch] for i in range(0, total, batch)]


async def _call(method: Callable[[Any], Any], arg: object) -> None:
    """As ShardConsumer._call: async methods awaited, plain ones in a worker thread."""
    if is_async(method):
        await method(arg)
    else:
        await asyncio.to_thread(method, arg)


async def run_once(processor: RecordProcessor, batches: list[list[Record]]) -> float:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(Lease(SHARD, TRIM_HORIZON))
    lease = table.get_lease(SHARD)
    assert lease is not None
    taken = table.take_lease(lease, "bench")
    assert taken is not None
    holder = LeaseHolder(table, "bench", SystemClock(), 600.0)
    held = holder.add_taken(taken)
    checkpointer = Checkpointer(holder, SHARD, held.token, held.lease.checkpoint)
    began = time.perf_counter()
    await _call(processor.initialize, InitializeInput(SHARD, "TRIM_HORIZON", 0))
    for batch in batches:
        last = batch[-1]
        checkpointer.set_largest_permitted(
            ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)
        )
        await _call(processor.process_records, ProcessRecordsInput(batch, 0, checkpointer))
    checkpointer.mark_shard_end()
    await _call(processor.shard_ended, ShardEndedInput(checkpointer))
    took = time.perf_counter() - began
    stored = table.get_lease(SHARD)
    assert stored is not None and stored.checkpoint.is_shard_end, stored
    return took


def paths() -> dict[str, Callable[[], RecordProcessor]]:
    from multilang_bench_app import BenchProcessor

    def child(*extra: str) -> Callable[[], RecordProcessor]:
        spec = ChildSpec(command=(sys.executable, str(APP), *extra), cwd=HERE, shutdown_grace=30)
        return lambda: SubprocessProcessor(spec)

    return {
        "in-process (amazon_kclpy class, adapter)": lambda: KclpyProcessorAdapter(BenchProcessor()),
        "subprocess (amazon_kclpy KCLProcess child)": child(),
        "subprocess (hand-written stdlib child)": child("--raw"),
        "native kclpy-spark RecordProcessor (baseline)": Native,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=200_000, help="records per run")
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 1_000, 10_000],
                        help="records per batch (GetRecords' page size)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="timed runs (best is kept)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write results")
    args = parser.parse_args(argv)
    install()
    load = os.getloadavg()[0]

    results: dict[tuple[str, int], float] = {}
    makers = paths()
    for batch in args.batches:
        batches = make_batches(args.records, batch)
        for name, make in makers.items():
            best = min(asyncio.run(run_once(make(), batches)) for _ in range(args.runs))
            results[name, batch] = args.records / best
            print(f"  batch {batch:>6}: {name}: {results[name, batch]:,.0f} records/s",
                  file=sys.stderr)  # fmt: skip

    head = "| path | " + " | ".join(f"batch {b:,}" for b in args.batches) + " |"
    rule = "|---|" + "---:|" * len(args.batches)
    rows = [
        f"| {name} | " + " | ".join(f"{results[name, b]:,.0f}" for b in args.batches) + " |"
        for name in makers
    ]
    inproc, sub = (
        "in-process (amazon_kclpy class, adapter)",
        "subprocess (amazon_kclpy KCLProcess child)",
    )
    ratio = " | ".join(f"{results[inproc, b] / results[sub, b]:.1f}x" for b in args.batches)
    lines = [
        "# MultiLang benchmark: in-process vs subprocess protocol path",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `python bench/bench_multilang.py` on "
        f"Python {platform.python_version()} ({platform.machine()}, {platform.system()}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at the start: other work on the machine "
        "moves these figures by tens of percent).",
        f"One shard, {args.records:,} records of {PAYLOAD} bytes from memory (no Kinesis, no "
        "LocalStack: the endpoint is not the limit), handed to each processor as ShardConsumer "
        "does, with a real Checkpointer on the in-memory lease table. The application "
        "(`bench/multilang_bench_app.py`) decodes every payload and checkpoints every batch at its "
        "last record. Records per second from initialize (child start) to the end of shard_ended "
        f"(child exit), best of {args.runs} runs. In-process, the application gets our Record "
        "objects, whose payload is already bytes; on the subprocess paths every payload is "
        "base64-encoded into JSON by the worker and decoded again by the child (that round trip, "
        "the pipe and the per-batch request/response are what the subprocess paths pay).",
        "",
        "records/s:",
        "",
        head,
        rule,
        *rows,
        f"| in-process / subprocess (amazon_kclpy) | {ratio} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
