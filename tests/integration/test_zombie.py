"""A zombie worker (SIGSTOP past its lease, another takes over, SIGCONT) writes no checkpoint, and
notices the loss (lease_lost)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from worker_procs import fleet, produce, wait_active, wait_for

from checkpoint.stores.sqlite import SQLiteLeaseTable

SHARD = "shardId-000000000000"


def _events(output: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(output.glob("events-*.jsonl")):
        events.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return sorted(events, key=lambda e: e["t"])


def test_sigstopped_worker_cannot_checkpoint_after_another_took_over(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    output = tmp_path / "out"
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    db = tmp_path / "leases.db"
    config = f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{db}"
processor = "slow_processor:SlowProcessor"
failover_time = 3.0
idle_time_between_reads = 0.2
max_records = 5
"""
    produce(kinesis_client, name, range(0, 30))
    with fleet(tmp_path, config, output) as workers:
        workers.env["PYTHONPATH"] += f":{Path(__file__).parent}"
        gate = tmp_path / "gate"  # the zombie's batches after its first checkpoint wait for it
        workers.env["SLOW_PROCESSOR_GATE"] = str(gate)
        zombie = workers.start("zombie")
        wait_for(
            "the zombie to checkpoint once and hold its next batch",
            lambda: any(e["event"] == "held" for e in _events(output)),
            timeout=60,
        )
        zombie.proc.send_signal(signal.SIGSTOP)  # with a batch in flight
        stopped_at = time.time()
        del workers.env["SLOW_PROCESSOR_GATE"]
        heir = workers.start("heir")
        produce(kinesis_client, name, range(30, 40))
        table = SQLiteLeaseTable(db, namespace=name)
        wait_for(
            "the heir to take the lease and checkpoint",
            lambda: any(
                e["event"] == "checkpoint_ok" and e["pid"] == heir.proc.pid for e in _events(output)
            ),
            timeout=60,
        )
        lease = table.get_lease(SHARD)
        assert lease is not None and lease.lease_owner == "heir"
        heir_checkpoint = int(lease.checkpoint.sequence_number)
        gate.touch()
        # Before the signal: the zombie may run (and write its events) before send_signal
        # returns, and nothing of it runs before SIGCONT.
        resumed_at = time.time()
        zombie.proc.send_signal(signal.SIGCONT)
        wait_for(
            "the zombie to notice it lost the lease",
            lambda: any(
                e["event"] == "lease_lost" and e["pid"] == zombie.proc.pid for e in _events(output)
            ),
            timeout=30,
        )
        time.sleep(2.0)
        lease = table.get_lease(SHARD)
        assert lease is not None and lease.lease_owner == "heir"
        assert int(lease.checkpoint.sequence_number) >= heir_checkpoint  # never moved back

    zombie_events = [e for e in _events(output) if e["pid"] == zombie.proc.pid]
    after = [e for e in zombie_events if e["t"] >= resumed_at]
    # No checkpoint of the zombie's landed after the heir took over. One it wrote just before the
    # stop may be reported after SIGCONT (the stop fell between the write and the event): then
    # it is exactly where the heir began, so it was written before the take.
    heir_from = next(
        e["from"]
        for e in _events(output)
        if e["event"] == "initialize" and e["pid"] == heir.proc.pid
    )
    late = [e for e in after if e["event"] == "checkpoint_ok"]
    assert len(late) <= 1, after
    assert all(int(e["at"]) == int(heir_from) for e in late), (heir_from, after)
    # The batch the zombie held when stopped finishes after SIGCONT: its checkpoint fails with
    # ShutdownException (the fencing this test is about: it must have tried).
    finished = [e for e in after if e["event"] == "records"]
    failed = [e for e in after if e["event"] == "checkpoint_failed"]
    assert finished and len(failed) >= len(finished), after
    assert all(e["error"] == "ShutdownException" for e in failed)
    assert stopped_at < resumed_at
