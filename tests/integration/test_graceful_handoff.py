"""Graceful handoff (KCL 3.x) with real worker processes on a DynamoDB lease table (LocalStack),
records flowing: a second worker's steals and the first worker's SIGTERM move leases only after
the old owner's processor checkpointed in ``shutdown_requested``, so no record is delivered twice
(the KCL 2.x steal delivers the batch in flight again: its checkpoint is refused). On SIGTERM the
old owner processes on until the new one has found the leases handed to it."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from worker_procs import fleet, produce, read_output, wait_active, wait_for

from checkpoint.stores.dynamodb import DynamoDBLeaseTable

SHARDS = 4


def _config(name: str, endpoint: str) -> str:
    return f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "slow_processor:SlowProcessor"
# Not shorter: the lease-table deadlines follow it, and a LocalStack that stalls for a second or
# two on a loaded machine (two test processes) must not cost a lease (a lost lease redelivers:
# at-least-once, not what this test is about).
failover_time = 6.0
idle_time_between_reads = 0.2
max_records = 5
shutdown_grace = 20.0
"""


def _shards(events: list[dict[str, Any]], kind: str, pid: int) -> set[str]:
    return {e["shard"] for e in events if e["event"] == kind and e["pid"] == pid}


def _lost_unasked(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """lease_lost calls that no shutdown_requested of the same processor's shard came before: a
    lease lost, not handed over (after a hand-over's shutdown_requested, lease_lost follows, as
    the KCL tells a processor; a take of the shard again starts a new tenure)."""
    asked: set[tuple[int, str]] = set()
    lost = []
    for e in events:  # each process's events in order
        tenure = (e["pid"], e["shard"])
        if e["event"] == "initialize":
            asked.discard(tenure)
        elif e["event"] == "shutdown_requested":
            asked.add(tenure)
        elif e["event"] == "lease_lost" and tenure not in asked:
            lost.append(e)
    return lost


def test_steals_and_sigterm_hand_leases_over_without_a_duplicate(
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    name = unique_name
    output = tmp_path / "out"
    kinesis_client.create_stream(StreamName=name, ShardCount=SHARDS)
    wait_active(kinesis_client, name)
    produced: set[str] = set()
    stop = threading.Event()

    def producer() -> None:  # ~20 records/s while leases move
        n = 0
        while not stop.wait(0.25):
            produce(kinesis_client, name, range(n, n + 5))
            produced.update(str(i) for i in range(n, n + 5))
            n += 5

    def delivered() -> Counter[str]:
        return Counter(d for e in read_output(output) if e["event"] == "records" for d in e["data"])

    with fleet(tmp_path, _config(name, localstack_endpoint), output) as workers:
        workers.env["SLOW_PROCESSOR_DELAY"] = "0.3"  # a batch is in flight most of the time
        workers.env["PYTHONPATH"] += f":{Path(__file__).parent}"
        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        try:
            a = workers.start("a")
            wait_for("a to process all shards",
                     lambda: len(_shards(read_output(output), "initialize", a.proc.pid)) == SHARDS,
                     timeout=90)  # fmt: skip
            b = workers.start("b")
            wait_for("b to get its share by handoff",
                     lambda: len(_shards(read_output(output), "initialize", b.proc.pid)) == 2,
                     timeout=90)  # fmt: skip
            events = read_output(output)
            moved = _shards(events, "initialize", b.proc.pid)
            assert _shards(events, "shutdown_requested", a.proc.pid) >= moved
            assert not _lost_unasked(events)
            workers.kill("a", signal.SIGTERM)
            assert workers.wait("a", timeout=60) == 0
            wait_for("b to get a's leases by handoff",
                     lambda: len(_shards(read_output(output), "initialize", b.proc.pid)) == SHARDS,
                     timeout=60)  # fmt: skip
        finally:
            stop.set()
            thread.join()
        wait_for("every record to be processed", lambda: produced <= set(delivered()),
                 timeout=60)  # fmt: skip
        twice = {d: n for d, n in delivered().items() if n > 1}
        assert not twice, f"delivered more than once: {sorted(twice)[:20]}"
        events = read_output(output)
        assert not [e for e in events if e["event"] == "checkpoint_failed"]
        assert not _lost_unasked(events)
        log = a.log_text()
        assert "handed over to b" in log and "handing it over to b (stopping)" in log
        assert "asked a to hand it over" in b.log_text()
        # a processed on after SIGTERM until b had found the leases being handed to it, so b
        # watched them and started each right after a's checkpoint, not at its next scan.
        assert "processing on for" in log
        assert "a is handing it over to us; watching it" in b.log_text()
        stop = log.index("stopping the consumers of the leases being handed over")
        # Completed by the stop after the wait, not by a renewal during it.
        assert log.find("handed over to b", log.index("processing on for")) > stop
    table = DynamoDBLeaseTable(dynamodb_client, name)
    leases = table.list_leases()
    assert len(leases) == SHARDS
    assert all(x.checkpoint_owner is None for x in leases)
