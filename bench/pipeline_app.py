"""The user code of ``bench_pipeline.py``: a RecordProcessor that does nothing but checkpoint
(the consumer alone), and a foreachBatch function for the second sink (per-shard row counts
collected to the driver, as a metrics or alerting sink would)."""

from __future__ import annotations

from typing import Any

from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor, ShutdownRequestedInput

COUNTS: dict[str, int] = {}


class Noop(RecordProcessor):
    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


def count_by_shard(df: Any, batch_id: int) -> None:
    for row in df.groupBy("shard_id").count().collect():
        COUNTS[row["shard_id"]] = COUNTS.get(row["shard_id"], 0) + int(row["count"])
