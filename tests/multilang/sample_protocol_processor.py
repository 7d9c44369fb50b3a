#!/usr/bin/env python3
"""A record processor that speaks the MultiLang protocol by hand, as a non-Python app would.

Standard library only, no amazon_kclpy: it reads one JSON message per line on stdin and answers
on stdout, wrapping each line in newlines as amazon-kclpy does. For each message:

* ``initialize``: remembers the shard; prints a stray non-JSON line on stdout and a line on
  stderr (the daemon must skip the first and log the second);
* ``processRecords``: appends each record to ``$KCLPY_SPARK_SAMPLE_OUTPUT/<shard>.jsonl``, then
  checkpoints at the batch's last record (sequenceNumber + subSequenceNumber);
* ``shardEnded``: checkpoints with no sequence number, which at a shard's end is SHARD_END;
* ``shutdownRequested``: checkpoints with no sequence number (everything delivered);
* ``leaseLost``: nothing (checkpointing is impossible).

Every message and checkpoint answer is also logged to ``events-<pid>.jsonl`` in the output folder.
``SAMPLE_HANG_ON=<action>`` makes it stop answering when that message arrives (for the timeout
test); with ``SAMPLE_HANG_CHATTY=1`` it prints a stray line on stdout every 0.2 s meanwhile, as
an app's background thread might. Exits at the end of its input.
"""

import base64
import json
import os
import sys
import time

OUTPUT = os.environ.get("KCLPY_SPARK_SAMPLE_OUTPUT", "kclpy-spark-output")
HANG_ON = os.environ.get("SAMPLE_HANG_ON", "")
HANG_CHATTY = os.environ.get("SAMPLE_HANG_CHATTY") == "1"


def send(message):
    sys.stdout.write("\n" + json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)


def event(shard, name, **fields):
    entry = {"pid": os.getpid(), "t": time.time(), "shard": shard, "event": name, **fields}
    with open(os.path.join(OUTPUT, f"events-{os.getpid()}.jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def checkpoint(shard, sequence_number=None, sub_sequence_number=None):
    """Ask the daemon to checkpoint; returns its error name, or None on success."""
    send(
        {
            "action": "checkpoint",
            "sequenceNumber": sequence_number,
            "subSequenceNumber": sub_sequence_number,
        }
    )
    while True:
        reply = receive()
        if reply is None:
            sys.exit(1)
        if reply.get("action") == "checkpoint":
            error = reply.get("error")
            event(shard, "checkpoint", seq=sequence_number, sub=sub_sequence_number, error=error)
            if error:
                sys.stderr.write(f"checkpoint at {sequence_number} failed: {error}\n")
            return error


def write_records(shard, records):
    now = time.time()
    lines = []
    for record in records:
        data = base64.b64decode(record["data"]).decode("utf-8", "replace")
        lines.append(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "t": now,
                    "shard": shard,
                    "seq": record["sequenceNumber"],
                    "sub": record["subSequenceNumber"],
                    "key": record["partitionKey"],
                    "arrival": record["approximateArrivalTimestamp"],
                    "data": data,
                }
            )
        )
    with open(os.path.join(OUTPUT, f"{shard}.jsonl"), "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def main():
    os.makedirs(OUTPUT, exist_ok=True)
    shard = None
    while True:
        message = receive()
        if message is None:
            break
        action = message["action"]
        if action == HANG_ON:
            event(shard, "hanging", action=action)
            for _ in range(18000):
                if HANG_CHATTY:
                    print("still busy (a stray line, not an answer)", flush=True)
                time.sleep(0.2)
        if action == "initialize":
            shard = message["shardId"]
            event(shard, "initialize", seq=message["sequenceNumber"],
                  sub=message["subSequenceNumber"])  # fmt: skip
            print(f"sample processor for {shard} starting (a stray line the daemon skips)")
            sys.stderr.write(f"initialized {shard} at {message['sequenceNumber']}\n")
            sys.stderr.flush()
        elif action == "processRecords":
            records = message["records"]
            event(shard, "processRecords", count=len(records),
                  lag=message["millisBehindLatest"])  # fmt: skip
            if records:
                write_records(shard, records)
                last = records[-1]
                checkpoint(shard, last["sequenceNumber"], last["subSequenceNumber"])
        elif action == "shardEnded":
            event(shard, "shardEnded")
            checkpoint(shard)
        elif action == "shutdownRequested":
            event(shard, "shutdownRequested")
            checkpoint(shard)
        elif action == "leaseLost":
            event(shard, "leaseLost")
        send({"action": "status", "responseFor": action})
    event(shard, "exit")


if __name__ == "__main__":
    main()
