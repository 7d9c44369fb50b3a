"""A processor for process-level tests: writes what it processed and every checkpoint outcome to
``$KCLPY_SPARK_SAMPLE_OUTPUT/events-<pid>.jsonl``, sleeping ``$SLOW_PROCESSOR_DELAY`` seconds per
batch so a test can catch it in the middle of one; with ``$SLOW_PROCESSOR_GATE`` (a path), every
batch after the first checkpoint waits (event ``held``) until that file exists."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kclpy_spark.processor import (
    CheckpointError,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShutdownRequestedInput,
)


def _emit(event: dict[str, object]) -> None:
    out = Path(os.environ["KCLPY_SPARK_SAMPLE_OUTPUT"])
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"events-{os.getpid()}.jsonl").open("a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "t": time.time(), **event}) + "\n")
        fh.flush()


class SlowProcessor(RecordProcessor):
    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard = initialize_input.shard_id
        _emit(
            {"event": "initialize", "shard": self.shard, "from": initialize_input.sequence_number}
        )

    checkpointed = False

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        records = process_records_input.records
        time.sleep(float(os.environ.get("SLOW_PROCESSOR_DELAY", "0")))
        gate = os.environ.get("SLOW_PROCESSOR_GATE")
        if gate and self.checkpointed:
            _emit({"event": "held", "shard": self.shard})
            while not Path(gate).exists():
                time.sleep(0.05)
        _emit({"event": "records", "shard": self.shard,
               "data": [r.binary_data.decode() for r in records],
               "last": records[-1].sequence_number})  # fmt: skip
        try:
            process_records_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            _emit({"event": "checkpoint_failed", "shard": self.shard, "error": exc.value})
            return
        self.checkpointed = True
        _emit({"event": "checkpoint_ok", "shard": self.shard, "at": records[-1].sequence_number})

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        _emit({"event": "lease_lost", "shard": self.shard})

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        try:
            shutdown_requested_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            _emit({"event": "checkpoint_failed", "shard": self.shard, "error": exc.value})
            return
        _emit({"event": "shutdown_requested", "shard": self.shard})
