"""Three real worker processes on one DynamoDB lease table (LocalStack): every record processed,
a split and a merge processed parents-first, kill -9 failover, and a SIGTERM graceful handoff."""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from worker_procs import fleet, produce, read_output, wait_active, wait_for

from checkpoint.stores.dynamodb import DynamoDBLeaseTable
from shard_sync.leader import LEADER_KEY

FAILOVER = 4.0
TAKE_INTERVAL = (FAILOVER + 0.025) * 0.5  # LeaseTiming's default: half a lease duration


def _config(name: str, endpoint: str, assignment: str = "worker") -> str:
    # "auto": leader assignment from three running workers (three start; after the kill -9 of
    # the leader, two are left: every worker takes its own leases again).
    return f"""
lease_assignment = "{assignment}"
auto_assignment_leases = 1
auto_assignment_workers = 3
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "kclpy_spark.demo.samples:JsonLinesProcessor"
failover_time = {FAILOVER}
idle_time_between_reads = 0.3
parent_shard_poll_interval = 1.0
shard_sync_interval = 3.0
shutdown_grace = 15.0
"""


def _processed(output: Path) -> set[str]:
    return {line["data"] for line in read_output(output)}


@pytest.mark.parametrize("assignment", ["worker", "leader", "auto"])
def test_three_workers_split_merge_kill_and_handoff(
    assignment: str,
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    name = unique_name
    output = tmp_path / "out"
    kinesis_client.create_stream(StreamName=name, ShardCount=3)
    wait_active(kinesis_client, name)
    produced: set[str] = set()

    def put(numbers: range) -> None:
        produce(kinesis_client, name, numbers)
        produced.update(str(n) for n in numbers)

    def all_processed() -> bool:
        return produced <= _processed(output)

    put(range(0, 100))
    with fleet(tmp_path, _config(name, localstack_endpoint, assignment), output) as workers:
        for wid in ("w1", "w2", "w3"):
            workers.start(wid)
        wait_for("the first 100 records", all_processed, timeout=120)
        if assignment != "worker":  # one leads and assigns; the others find their leases
            # A worker logs its role at its first take round: a slow starter may log it after the
            # others have processed every record.
            def roles(text: str) -> int:
                logs = [p.log_text() for p in workers.procs.values()]
                return sum(x.count(text) for x in logs)

            wait_for("a leader", lambda: roles("lease assignment role worker -> leader") >= 1, 30)
            wait_for("two led workers", lambda: roles("-> led") >= 2, timeout=30)
        table = DynamoDBLeaseTable(dynamodb_client, name, create_if_missing=False)

        # Reshard while consuming: split shard 0, merge shards 1 and 2.
        shards = {s["ShardId"]: s for s in kinesis_client.list_shards(StreamName=name)["Shards"]}
        rng = shards["shardId-000000000000"]["HashKeyRange"]
        mid = (int(rng["StartingHashKey"]) + int(rng["EndingHashKey"])) // 2
        kinesis_client.split_shard(
            StreamName=name, ShardToSplit="shardId-000000000000", NewStartingHashKey=str(mid)
        )
        wait_active(kinesis_client, name)
        kinesis_client.merge_shards(
            StreamName=name,
            ShardToMerge="shardId-000000000001",
            AdjacentShardToMerge="shardId-000000000002",
        )
        wait_active(kinesis_client, name)
        put(range(100, 200))
        wait_for("the records after the reshard", all_processed, timeout=180)

        # Parents before children: every child's first record came after its parents' last.
        lines = read_output(output)
        first_t: dict[str, float] = {}
        last_t: dict[str, float] = defaultdict(float)
        for line in lines:
            first_t[line["shard"]] = min(first_t.get(line["shard"], line["t"]), line["t"])
            last_t[line["shard"]] = max(last_t[line["shard"]], line["t"])
        leases = {x.shard_id: x for x in table.list_leases()}
        children_checked = 0
        for shard_id, lease in leases.items():
            for parent in lease.parent_shard_ids:
                if shard_id in first_t and parent in last_t:
                    assert first_t[shard_id] >= last_t[parent], f"{shard_id} before {parent} ended"
                    children_checked += 1
        assert children_checked >= 4  # two split children, one merge child with two parents

        # kill -9 the busiest worker: its leases are processed elsewhere within the KCL's bound.
        def owners() -> Counter[str]:
            return Counter(
                x.actual_owner  # the worker processing it, also mid-handoff
                for x in table.list_leases()
                if x.actual_owner and not x.checkpoint.is_shard_end
            )

        victim = owners().most_common(1)[0][0]
        if assignment != "worker":
            # The leader record was renewed within its life all along (a record of one failover
            # time renewed at the pace of one of three would change hands at every renewal);
            # one change is allowed for a request LocalStack was slow to answer.
            assert roles("takes shard-sync leadership") <= 2
        if assignment != "worker":  # the leader: its own leases wait for a new leader
            record = table.get_record(LEADER_KEY)
            assert record is not None and record.owner in workers.procs
            victim = record.owner
        assert victim is not None
        workers.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        took = wait_for(
            f"the leases of {victim} to move",
            lambda: victim not in owners() and sum(owners().values()) > 0,
            timeout=FAILOVER + TAKE_INTERVAL + 30,
        )
        print(f"failover after kill -9: {took:.1f}s (bound: failover + take interval = "
              f"{FAILOVER + TAKE_INTERVAL:.1f}s)")  # fmt: skip
        put(range(200, 250))
        wait_for("the records after the kill", all_processed, timeout=120)
        if assignment == "auto":  # two left, under three quarters of three: nobody is led now
            wait_for("both survivors taking leases", lambda: roles("led -> worker") >= 2, 60)
        assert time.monotonic() - killed_at < 200

        # SIGTERM another worker: it hands its leases to the live workers (graceful handoff: its
        # processors checkpoint first), and its successors re-read nothing.
        survivors = [w for w in workers.procs if w != victim]
        leaving = max(survivors, key=lambda w: owners().get(w, 0))
        # Leases it processes: a parent's finished lease (SHARD_END) keeps its owner until the
        # cleanup deletes it, but nobody holds it, so nothing is handed over or released.
        held_before = {
            x.shard_id for x in table.list_leases()
            if x.actual_owner == leaving and not x.checkpoint.is_shard_end
        }  # fmt: skip
        assert held_before, f"{leaving} holds no lease to hand over: nothing would be checked"
        workers.kill(leaving, signal.SIGTERM)
        assert workers.wait(leaving, timeout=30) == 0
        log = workers.procs[leaving].log_text()
        assert "shutdown requested" in log and "stopped" in log
        for shard_id in held_before:  # released if no other worker was seen holding a lease
            assert f"lease {shard_id}: handed over to" in log or f"released lease {shard_id}" in log
        put(range(250, 300))
        wait_for("the records after the handoff", all_processed, timeout=120)

    lines = read_output(output)
    assert produced <= {line["data"] for line in lines}
    leaving_pid = workers.procs[leaving].proc.pid
    checked = 0
    for shard_id in held_before:
        mine = [int(x["seq"]) for x in lines if x["shard"] == shard_id and x["pid"] == leaving_pid]
        later = [
            int(x["seq"])
            for x in lines
            if x["shard"] == shard_id
            and x["pid"] != leaving_pid
            and mine
            and x["t"]
            > max(y["t"] for y in lines if y["shard"] == shard_id and y["pid"] == leaving_pid)
        ]
        if mine:
            checked += 1
            assert all(seq > max(mine) for seq in later), f"{shard_id} re-processed after SIGTERM"
    assert checked, "the stopped worker processed none of its leases' records: nothing checked"
    counts = Counter(line["data"] for line in lines)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(f"processed {len(counts)} distinct records, {duplicates} duplicate deliveries "
          f"(only the kill -9'd worker's un-checkpointed batches may repeat)")  # fmt: skip
