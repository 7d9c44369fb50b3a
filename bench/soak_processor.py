"""The soak benchmark's RecordProcessor: one JSON line per batch (wall time, shard, the records'
data), appended to ``$KCLPY_SPARK_SAMPLE_OUTPUT/batches-<pid>.jsonl``, then a checkpoint. The
benchmark counts batches and checks that no record was lost from these lines. ``$BATCH_DELAY``
seconds of work per batch (default 0) stand for a real processor's writes."""

from __future__ import annotations

import contextlib
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


class BatchLines(RecordProcessor):
    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard = initialize_input.shard_id
        out = Path(os.environ["KCLPY_SPARK_SAMPLE_OUTPUT"])
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"batches-{os.getpid()}.jsonl"

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
