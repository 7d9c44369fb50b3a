"""kcl-rs's side of ``bench_vs_kcl_rs.py``: its Scheduler polling, at its fastest settings
(``max_records`` 10,000, 200 ms idle) or with ``$RACE_SETTINGS`` = defaults its own defaults, a
processor that counts (or reads) every record and checkpoints after every batch.
``python race_kcl_rs.py STREAM APPLICATION``; endpoints from ``AWS_ENDPOINT_URL_KINESIS`` /
``AWS_ENDPOINT_URL_DYNAMODB``; runs until SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from kcl_rs import RecordProcessorBase, Scheduler
from race_tally import TALLY


class Counting(RecordProcessorBase):  # type: ignore[misc]
    def initialize(self, initialize_input: Any) -> None:
        pass

    def process_records(self, process_records_input: Any) -> None:
        TALLY.add(process_records_input.records)
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input: Any) -> None:
        pass

    def shard_ended(self, shard_ended_input: Any) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        pass


def main() -> None:
    stream, application = sys.argv[1:3]
    fastest: dict[str, Any] = {"max_records": 10_000, "idle_time_between_reads_millis": 200}
    if os.environ.get("RACE_SETTINGS") == "defaults":
        fastest = {}
    scheduler = Scheduler(
        stream_name=stream, application_name=application, record_processor_factory=Counting,
        worker_identifier="race-kcl-rs", region="us-east-1", initial_position="TRIM_HORIZON",
        retrieval_mode="POLLING", **fastest,
    )  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    scheduler.start()
    stop.wait()
    scheduler.shutdown()


if __name__ == "__main__":
    main()
