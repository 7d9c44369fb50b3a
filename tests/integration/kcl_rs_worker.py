"""A KCL v3 worker that no one here wrote: kcl-rs (PyPI ``kcl-rs``, a Rust port of the Java KCL 3.x
with amazon-kclpy-shaped bindings), run as a child process by the mixed-fleet tests.

    python kcl_rs_worker.py ENDPOINT STREAM APPLICATION WORKER_ID OUTPUT_FOLDER

Every record it processes is appended to ``OUTPUT_FOLDER/<shard>.jsonl`` in the sample
processor's form (``kclpy_spark.demo.samples.JsonLinesProcessor``: worker pid, shard, sequence
number, data), then checkpointed. SIGTERM shuts the scheduler down gracefully (its processors'
``shutdown_requested`` checkpoint); its log (WARN and above) goes to stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kcl_rs import RecordProcessorBase, Scheduler


class JsonLines(RecordProcessorBase):  # type: ignore[misc]
    out = Path(".")

    def initialize(self, initialize_input: Any) -> None:
        self.shard_id = initialize_input.shard_id
        print(f"kcl-rs: processing {self.shard_id}", file=sys.stderr, flush=True)

    def process_records(self, process_records_input: Any) -> None:
        lines = [
            json.dumps({"pid": os.getpid(), "t": time.time(), "shard": self.shard_id,
                        "seq": r.sequence_number, "data": r.binary_data.decode("utf-8", "replace")})
            for r in process_records_input.records
        ]  # fmt: skip
        if lines:
            with (self.out / f"{self.shard_id}.jsonl").open("a") as fh:
                fh.write("\n".join(lines) + "\n")
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input: Any) -> None:
        pass

    def shard_ended(self, shard_ended_input: Any) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


def main() -> None:
    endpoint, stream, application, worker_id, output = sys.argv[1:6]
    JsonLines.out = Path(output)
    JsonLines.out.mkdir(parents=True, exist_ok=True)
    scheduler = Scheduler(
        stream_name=stream, application_name=application, record_processor_factory=JsonLines,
        worker_identifier=worker_id, region="us-east-1", endpoint_url=endpoint,
        access_key_id="test", secret_access_key="test", initial_position="TRIM_HORIZON",
        retrieval_mode="POLLING", idle_time_between_reads_millis=200,
    )  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    scheduler.start()
    print("kcl-rs: started", file=sys.stderr, flush=True)
    stop.wait()
    scheduler.shutdown()
    print("kcl-rs: stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
