"""Sample processors: what the demo runs, and a starting point for your own."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from kclpy_spark.processor import (
    CheckpointError,
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)


class CountingProcessor(RecordProcessor):
    """Counts records and checkpoints after every batch (the simplest correct processor)."""

    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard_id = initialize_input.shard_id
        self.count = 0

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.count += len(process_records_input.records)
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        try:
            shutdown_requested_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            log.warning("shard %s: final checkpoint failed: %s", self.shard_id, exc.value)


class JsonLinesProcessor(RecordProcessor):
    """Appends every record to ``$KCLPY_SPARK_SAMPLE_OUTPUT/<shard>.jsonl``, then checkpoints.

    One line per record: worker pid, time, shard, sequence number, partition key, data (UTF-8,
    replaced where not decodable). Used by the integration tests to see exactly what was processed.
    """

    _lock = threading.Lock()

    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard_id = initialize_input.shard_id
        out = Path(os.environ.get("KCLPY_SPARK_SAMPLE_OUTPUT", "kclpy-spark-output"))
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"{self.shard_id}.jsonl"

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        now = time.time()
        lines = [
            json.dumps(
                {
                    "pid": os.getpid(),
                    "t": now,
                    "shard": self.shard_id,
                    "seq": r.sequence_number,
                    "key": r.partition_key,
                    "data": r.binary_data.decode("utf-8", "replace"),
                }
            )
            for r in process_records_input.records
        ]
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        process_records_input.checkpointer.checkpoint()

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        try:
            shutdown_requested_input.checkpointer.checkpoint()
        except CheckpointError as exc:
            log.warning("shard %s: final checkpoint failed: %s", self.shard_id, exc.value)
