"""The chaos test's processor: a file "sink" that fails 10% of its writes (before writing
anything), checkpointing only after a write succeeded. Every tenure of a lease gets an id, and
every write and checkpoint is logged to ``$KCLPY_SPARK_SAMPLE_OUTPUT/chaos-<pid>.jsonl``."""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from pathlib import Path

from kclpy_spark.processor import (
    CheckpointError,
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)

FAILURE_RATE = float(os.environ.get("CHAOS_SINK_FAILURE_RATE", "0.1"))


class SinkWriteFailed(RuntimeError):
    pass


class ChaosProcessor(RecordProcessor):
    def _emit(self, event: dict[str, object]) -> None:
        out = Path(os.environ["KCLPY_SPARK_SAMPLE_OUTPUT"])
        with (out / f"chaos-{os.getpid()}.jsonl").open("a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "t": time.time(), "tenure": self.tenure,
                                 "shard": self.shard, **event}) + "\n")  # fmt: skip
            fh.flush()

    def initialize(self, initialize_input: InitializeInput) -> None:
        Path(os.environ["KCLPY_SPARK_SAMPLE_OUTPUT"]).mkdir(parents=True, exist_ok=True)
        self.shard = initialize_input.shard_id
        self.tenure = uuid.uuid4().hex[:12]
        self._emit({"event": "initialize", "from": initialize_input.sequence_number})

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        records = process_records_input.records
        if random.random() < FAILURE_RATE:
            self._emit({"event": "write_failed", "first": records[0].sequence_number})
            raise SinkWriteFailed("injected sink failure: nothing written")
        self._emit({"event": "write", "seqs": [r.sequence_number for r in records],
                    "data": [r.binary_data.decode() for r in records]})  # fmt: skip
        try:
            process_records_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            self._emit({"event": "checkpoint_failed", "error": exc.value})
            return
        self._emit({"event": "checkpoint", "at": records[-1].sequence_number})

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        shard_ended_input.checkpointer.checkpoint()
        self._emit({"event": "shard_end"})

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        try:
            shutdown_requested_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            self._emit({"event": "checkpoint_failed", "error": exc.value})
