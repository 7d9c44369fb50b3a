"""The soak benchmark's RecordProcessor: one JSON line per batch (wall time, shard, the records'
data), appended to ``$KCLPY_SPARK_SAMPLE_OUTPUT/batches-<pid>.jsonl``, then a checkpoint. The
benchmark counts batches and checks that no record was lost from these lines. ``$BATCH_DELAY``
seconds of work per batch (default 0) stand for a real processor's writes.

With ``$SOAK_TRACE_MEMORY=1`` (``bench_soak.py --trace-memory``), the process traces its Python
allocations (tracemalloc) from its first lease on: after ``$SOAK_TRACE_WARMUP`` seconds (default
120) it takes a first snapshot, then every ``$SOAK_TRACE_EVERY`` seconds (default 120) writes the
allocation sites that grew most since that snapshot to
``$KCLPY_SPARK_SAMPLE_OUTPUT/memory-<pid>.txt`` (replaced each time), so a growth the soak sees
in RSS can be put down to the code that holds it. Each snapshot follows a full collection: it
counts what is reachable, not cycles waiting for the collector."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
from pathlib import Path

from kclpy_spark.processor import (
    CheckpointError,
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShutdownRequestedInput,
)

_lock = threading.Lock()
_tracing: list[threading.Thread] = []  # the memory tracer, once per process


def _trace_memory(out: Path) -> None:
    """Snapshot after the warm-up; then, every period, the top growth since it, to a file."""
    import tracemalloc

    warmup = float(os.environ.get("SOAK_TRACE_WARMUP", "120"))
    every = float(os.environ.get("SOAK_TRACE_EVERY", "120"))

    def snapshot() -> tracemalloc.Snapshot:
        gc.collect()
        return tracemalloc.take_snapshot().filter_traces([not_the_tracer])

    not_the_tracer = tracemalloc.Filter(False, tracemalloc.__file__)
    tracemalloc.start(12)
    time.sleep(warmup)
    first = snapshot()
    began = time.time()
    while True:
        time.sleep(every)
        stats = snapshot().compare_to(first, "traceback")
        grown = [s for s in stats if s.size_diff > 0][:15]
        lines = [f"{time.time() - began:.0f} s after the first snapshot; traced "
                 f"{tracemalloc.get_traced_memory()[0]:,} bytes"]  # fmt: skip
        for stat in grown:
            lines.append(f"\n+{stat.size_diff:,} B in +{stat.count_diff} blocks "
                         f"(now {stat.size:,} B in {stat.count})")  # fmt: skip
            lines += [f"    {frame.filename}:{frame.lineno}" for frame in stat.traceback]
        (out / f"memory-{os.getpid()}.txt").write_text("\n".join(lines) + "\n")


def _start_tracing(out: Path) -> None:
    with _lock:
        if os.environ.get("SOAK_TRACE_MEMORY", "0") != "0" and not _tracing:
            thread = threading.Thread(target=_trace_memory, args=(out,), daemon=True)
            _tracing.append(thread)
            thread.start()


class BatchLines(RecordProcessor):
    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard = initialize_input.shard_id
        out = Path(os.environ["KCLPY_SPARK_SAMPLE_OUTPUT"])
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"batches-{os.getpid()}.jsonl"
        _start_tracing(out)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        time.sleep(float(os.environ.get("BATCH_DELAY", "0")))
        line = json.dumps(
            {
                "t": time.time(),
                "shard": self.shard,
                "data": [r.binary_data.decode() for r in process_records_input.records],
            }
        )
        with _lock, self.path.open("a") as fh:
            fh.write(line + "\n")
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        with contextlib.suppress(CheckpointError):  # the next owner re-reads from the checkpoint
            shutdown_requested_input.checkpointer.checkpoint()


class Burner(RecordProcessor):
    """Spends ``$BURN_MS`` x ``$BURN_FACTOR`` milliseconds of CPU on each record (a stand-in for
    parsing and transforming; a factor of 2 is a worker twice as slow per record), then
    checkpoints the batch. The CPU balancing benchmark runs it."""

    def initialize(self, initialize_input: InitializeInput) -> None:
        factor = float(os.environ.get("BURN_FACTOR", "1"))
        self.burn = float(os.environ.get("BURN_MS", "1")) * factor / 1000.0

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        end = time.thread_time() + self.burn * len(process_records_input.records)
        while time.thread_time() < end:
            pass
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        with contextlib.suppress(CheckpointError):
            shutdown_requested_input.checkpointer.checkpoint()
