"""kclpy-spark's side of ``bench_vs_kcl_rs.py``: a processor that counts (or reads) every record
and checkpoints after every batch, as the kcl-rs side does."""

from __future__ import annotations

from race_tally import TALLY

from kclpy_spark.processor import (
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShutdownRequestedInput,
)


class Counting(RecordProcessor):
    def initialize(self, initialize_input: InitializeInput) -> None:
        pass

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        TALLY.add(process_records_input.records)
        process_records_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        pass
