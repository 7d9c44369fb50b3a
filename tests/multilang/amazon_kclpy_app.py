#!/usr/bin/env python3
"""A record processor written against amazon_kclpy's own classes, as an existing app is.

Run by the daemon as a child (``executableName = python amazon_kclpy_app.py``: the ``__main__``
block hands it to ``kcl.KCLProcess``) or in-process (kclpy-spark finds ``RecordProcessor`` in
this script and runs it in the worker). Either way it appends every record to
``$KCLPY_SPARK_SAMPLE_OUTPUT/<shard>.jsonl`` and checkpoints each batch at its last record,
retrying ``ThrottlingException`` and giving up on ``ShutdownException`` as amazon-kclpy's sample
app does. Checkpoint errors are also written to ``events-<pid>.jsonl`` with the class of the
exception caught, so tests can see that it was amazon_kclpy's.
"""

import json
import os
import sys
import threading
import time

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

OUTPUT = os.environ.get("KCLPY_SPARK_SAMPLE_OUTPUT", "kclpy-spark-output")
RETRIES = 5
RETRY_SLEEP = 0.5
_LOCK = threading.Lock()  # in-process, several shards share this module


def _event(shard, name, **fields):
    entry = {"pid": os.getpid(), "t": time.time(), "shard": shard, "event": name, **fields}
    with _LOCK, open(os.path.join(OUTPUT, f"events-{os.getpid()}.jsonl"), "a") as fh:
        fh.write(json.dumps(entry) + "\n")


class RecordProcessor(processor.RecordProcessorBase):
    def __init__(self):
        self.shard_id = None

    def initialize(self, initialize_input):
        self.shard_id = initialize_input.shard_id
        os.makedirs(OUTPUT, exist_ok=True)
        _event(
            self.shard_id,
            "initialize",
            seq=initialize_input.sequence_number,
            sub=initialize_input.sub_sequence_number,
        )

    def checkpoint(self, checkpointer, sequence_number=None, sub_sequence_number=None):
        for attempt in range(RETRIES):
            try:
                checkpointer.checkpoint(sequence_number, sub_sequence_number)
                return
            except kcl.CheckpointError as e:
                _event(
                    self.shard_id,
                    "checkpoint_error",
                    value=e.value,
                    cls=f"{type(e).__module__}.{type(e).__qualname__}",
                    seq=sequence_number,
                )
                if e.value == "ShutdownException":
                    return
                if e.value == "ThrottlingException" and attempt < RETRIES - 1:
                    time.sleep(RETRY_SLEEP)
                    continue
                sys.stderr.write(f"checkpoint failed: {e.value}\n")
                return

    def process_records(self, process_records_input):
        records = process_records_input.records
        if not records:  # callProcessRecordsEvenForEmptyRecordList = true
            _event(self.shard_id, "no_records", lag=process_records_input.millis_behind_latest)
            return
        lines = [
            json.dumps(
                {
                    "pid": os.getpid(),
                    "t": time.time(),
                    "shard": self.shard_id,
                    "seq": r.sequence_number,
                    "sub": r.sub_sequence_number,
                    "key": r.partition_key,
                    "arrival": r.timestamp_millis,
                    "data": r.binary_data.decode("utf-8", "replace"),
                }
            )
            for r in records
        ]
        with open(os.path.join(OUTPUT, f"{self.shard_id}.jsonl"), "a") as fh:
            fh.write("\n".join(lines) + "\n")
        last = records[-1]
        self.checkpoint(
            process_records_input.checkpointer, last.sequence_number, last.sub_sequence_number
        )

    def lease_lost(self, lease_lost_input):
        _event(self.shard_id, "lease_lost")

    def shard_ended(self, shard_ended_input):
        _event(self.shard_id, "shard_ended")
        self.checkpoint(shard_ended_input.checkpointer)

    def shutdown_requested(self, shutdown_requested_input):
        _event(self.shard_id, "shutdown_requested")
        self.checkpoint(shutdown_requested_input.checkpointer)


if __name__ == "__main__":
    kcl.KCLProcess(RecordProcessor()).run()
