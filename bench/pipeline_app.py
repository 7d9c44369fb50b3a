"""The user code of ``bench_pipeline.py``: a RecordProcessor that does nothing but checkpoint
(the consumer alone), a foreachBatch function for the second sink (per-shard row counts
collected to the driver, as a metrics or alerting sink would), and a function standing for a
store one second away (``remote_store``: it waits ``REMOTE_LATENCY`` and notes each piece's rows
in ``$BENCH_PIPELINE_OUT/pieces.jsonl`` so the run can be checked)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor, ShutdownRequestedInput
from kclpy_spark.spark.sink_batch import current_batch

COUNTS: dict[str, int] = {}


class Noop(RecordProcessor):
    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


def count_by_shard(df: Any, batch_id: int) -> None:
    for row in df.groupBy("shard_id").count().collect():
        COUNTS[row["shard_id"]] = COUNTS.get(row["shard_id"], 0) + int(row["count"])


REMOTE_LATENCY = 1.0  # seconds per write: a store across a network, committing synchronously
_NOTES = threading.Lock()


def remote_store(df: Any, batch_id: int) -> None:
    batch = current_batch()
    assert batch is not None
    time.sleep(REMOTE_LATENCY)
    lines = "".join(json.dumps([p.piece_id, p.rows]) + "\n" for p in batch.pieces)
    with _NOTES, open(Path(os.environ["BENCH_PIPELINE_OUT"]) / "pieces.jsonl", "a") as fh:
        fh.write(lines)
