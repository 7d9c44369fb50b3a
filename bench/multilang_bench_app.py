#!/usr/bin/env python3
"""The application bench_multilang.py runs on every path: the same work per record everywhere.

``BenchProcessor`` is an amazon_kclpy v3 processor: it adds up the payload sizes of each batch
(``record.binary_data``, so every payload is decoded) and checkpoints at the batch's last record;
at shard end it checkpoints SHARD_END. ``python multilang_bench_app.py`` runs it under
amazon_kclpy's ``KCLProcess`` (the MultiLang child); ``--raw`` runs the same work in a
hand-written protocol loop with only the standard library (what a non-Python child costs).
"""

import base64
import json
import sys

from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class BenchProcessor(processor.RecordProcessorBase):
    def __init__(self):
        self.total = 0

    def initialize(self, initialize_input):
        self.total = 0

    def process_records(self, process_records_input):
        records = process_records_input.records
        for record in records:
            self.total += len(record.binary_data)
        last = records[-1]
        process_records_input.checkpointer.checkpoint(
            last.sequence_number, last.sub_sequence_number
        )

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        shutdown_requested_input.checkpointer.checkpoint()


def raw_loop():
    """The same work, speaking the protocol by hand."""
    total = 0
    stdin, stdout = sys.stdin, sys.stdout

    def send(message):
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    def checkpoint(seq, sub):
        send({"action": "checkpoint", "sequenceNumber": seq, "subSequenceNumber": sub})
        reply = json.loads(stdin.readline())
        if reply.get("error"):
            raise RuntimeError(reply["error"])

    for line in stdin:
        message = json.loads(line)
        action = message["action"]
        if action == "processRecords":
            records = message["records"]
            for record in records:
                total += len(base64.b64decode(record["data"]))
            last = records[-1]
            checkpoint(last["sequenceNumber"], last["subSequenceNumber"])
        elif action in ("shardEnded", "shutdownRequested"):
            checkpoint(None, None)
        send({"action": "status", "responseFor": action})


if __name__ == "__main__":
    if "--raw" in sys.argv:
        raw_loop()
    else:
        kcl.KCLProcess(BenchProcessor()).run()
