"""Chaos: 3 worker processes on a 4-shard LocalStack stream, a producer writing numbered records,
a split and a merge mid-run, kill -9 of a random worker every ~15 s (restarted after), and 10% of
sink writes failing. At the end it verifies and prints: nothing lost, per-shard order, parents
before children, checkpoints never backwards, and duplicates only from unacknowledged batches."""

from __future__ import annotations

import itertools
import json
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from worker_procs import fleet, produce, wait_active, wait_for

from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores.dynamodb import DynamoDBLeaseTable

DURATION = 75.0  # seconds of chaos (kills at about 15, 30, 45 and 60 s)
KILL_EVERY = 15.0
FAILOVER = 4.0


def _events(output: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in output.glob("chaos-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["t"])


def _written(events: list[dict[str, Any]]) -> set[str]:
    return {d for e in events if e["event"] == "write" for d in e["data"]}


def test_chaos(
    kinesis_client: Any, dynamodb_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    name = unique_name
    output = tmp_path / "out"
    output.mkdir()
    kinesis_client.create_stream(StreamName=name, ShardCount=4)
    wait_active(kinesis_client, name)
    config = f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "chaos_processor:ChaosProcessor"
failover_time = {FAILOVER}
idle_time_between_reads = 0.3
parent_shard_poll_interval = 1.0
shard_sync_interval = 2.0
max_records = 20
max_processing_attempts = 1000
"""
    produced: set[str] = set()
    stop = threading.Event()
    rng = random.Random(20261121)
    checkpoints: dict[str, list[ExtendedSequenceNumber]] = defaultdict(list)
    table: DynamoDBLeaseTable | None = None

    def producer() -> None:
        n = 0
        while not stop.is_set():
            batch = range(n, n + 10)
            produce(kinesis_client, name, batch)
            produced.update(str(i) for i in batch)
            n += 10
            time.sleep(0.25)

    watching = threading.Event()  # set when the checkpoint watcher is to stop (after the drain)

    def watch_checkpoints() -> None:
        while not watching.is_set():
            if table is not None:
                try:
                    for lease in table.list_leases():
                        history = checkpoints[lease.lease_key]
                        if not history or history[-1] != lease.checkpoint:
                            history.append(lease.checkpoint)
                except Exception:  # the table may be created just now
                    pass
            time.sleep(0.5)

    with fleet(tmp_path, config, output) as workers:
        workers.env["PYTHONPATH"] += f":{Path(__file__).parent}"
        threads = [threading.Thread(target=producer), threading.Thread(target=watch_checkpoints)]
        for t in threads:
            t.start()
        live = ["w1", "w2", "w3"]
        for wid in live:
            workers.start(wid)
        table = DynamoDBLeaseTable(dynamodb_client, name, create_if_missing=False)
        start = time.monotonic()
        next_kill = start + KILL_EVERY
        resharded = {"split": False, "merge": False}
        kills = 0
        restart_seq = 0
        try:
            while time.monotonic() - start < DURATION:
                now = time.monotonic()
                if not resharded["split"] and now - start > 25:
                    shards = kinesis_client.list_shards(StreamName=name)["Shards"]
                    rng_ = shards[0]["HashKeyRange"]
                    mid = (int(rng_["StartingHashKey"]) + int(rng_["EndingHashKey"])) // 2
                    kinesis_client.split_shard(StreamName=name, ShardToSplit=shards[0]["ShardId"],
                                               NewStartingHashKey=str(mid))  # fmt: skip
                    wait_active(kinesis_client, name)
                    resharded["split"] = True
                if not resharded["merge"] and now - start > 45:
                    kinesis_client.merge_shards(
                        StreamName=name,
                        ShardToMerge="shardId-000000000002",
                        AdjacentShardToMerge="shardId-000000000003",
                    )
                    wait_active(kinesis_client, name)
                    resharded["merge"] = True
                if now >= next_kill:
                    victim = rng.choice(live)
                    workers.kill(victim)
                    workers.wait(victim, timeout=10)
                    kills += 1
                    restart_seq += 1
                    replacement = f"w{3 + restart_seq}"
                    live[live.index(victim)] = replacement
                    workers.start(replacement)
                    next_kill = now + KILL_EVERY
                time.sleep(0.5)
        finally:
            stop.set()
            threads[0].join(timeout=30)
        try:
            wait_for("every produced record to be written", lambda: produced <= _written(
                _events(output)), timeout=180)  # fmt: skip
        finally:
            watching.set()
            threads[1].join(timeout=30)
        for wid in live:
            workers.kill(wid, signal.SIGTERM)
        for wid in live:
            workers.wait(wid, timeout=40)

    events = _events(output)
    writes = [e for e in events if e["event"] == "write"]
    written = Counter(d for e in writes for d in e["data"])
    lost = produced - set(written)

    # Per-shard order: within one tenure of a lease, sequence numbers only go up.
    order_violations = 0
    by_tenure: dict[str, list[int]] = defaultdict(list)
    for e in writes:
        by_tenure[e["tenure"]].extend(int(s) for s in e["seqs"])
    for seqs in by_tenure.values():
        order_violations += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)

    # Parents before children: a child's first write after every parent's last.
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for e in writes:
        first.setdefault(e["shard"], e["t"])
        last[e["shard"]] = e["t"]
    parents_violations = 0
    parents_compared = 0  # (child, parent) pairs both written: the check saw something
    final_leases = {x.shard_id: x for x in table.list_leases()} if table else {}
    shards = {s["ShardId"]: s for s in kinesis_client.list_shards(StreamName=name)["Shards"]}
    for shard_id, shard in shards.items():
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
            if parent and shard_id in first and parent in last:
                parents_compared += 1
                parents_violations += first[shard_id] < last[parent]
    # The split's two children and the merge's child (two parents): at least three pairs.
    assert parents_compared >= 3, (parents_compared, sorted(first))

    # Checkpoints never went backwards (and the watcher saw them move).
    assert sum(len(h) > 1 for h in checkpoints.values()) >= 4, dict(checkpoints)
    backwards = sum(
        1 for history in checkpoints.values() for a, b in itertools.pairwise(history)
        if b < a
    )  # fmt: skip

    # Duplicates: a record may be written more than once only by tenures that did not
    # acknowledge it (checkpoint past it); two acknowledged writes of one record would mean a
    # checkpoint was lost or went back.
    acked_until: dict[str, int] = {}
    for e in events:
        if e["event"] == "checkpoint":
            acked_until[e["tenure"]] = max(acked_until.get(e["tenure"], 0), int(e["at"]))
    acknowledged_writes: dict[str, list[str]] = defaultdict(list)
    for e in writes:
        for seq, data in zip(e["seqs"], e["data"], strict=True):
            if acked_until.get(e["tenure"], 0) >= int(seq):
                acknowledged_writes[data].append(e["tenure"])
    examples = [f"record {d} acknowledged by tenures {t}" for d, t in acknowledged_writes.items()
                if len(t) > 1]  # fmt: skip
    # Nor did a tenure start before a checkpoint another had made: a checkpoint logged before
    # its initialize was written before its take (a write after the take would have lost), so
    # its start must be at or past it, or it delivered acknowledged records again.
    acks: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for e in events:
        if e["event"] == "checkpoint":
            acks[e["shard"]].append((e["t"], int(e["at"]), e["tenure"]))
    for e in events:
        if e["event"] != "initialize":
            continue
        prior = [at for t, at, tenure in acks[e["shard"]] if t < e["t"] and tenure != e["tenure"]]
        start = str(e["from"])
        if prior and not (start.isdigit() and int(start) >= max(prior)):
            examples.append(f"tenure {e['tenure']} of {e['shard']} started at {start}, "
                            f"before the checkpoint {max(prior)} made earlier")  # fmt: skip
    bad_duplicates = len(examples)
    duplicates = sum(c - 1 for c in written.values() if c > 1)
    failed_writes = sum(1 for e in events if e["event"] == "write_failed")
    print(
        f"\nchaos: {len(produced)} produced, {len(lost)} lost, {duplicates} duplicate writes "
        f"({bad_duplicates} of acknowledged records), {failed_writes} sink writes failed, "
        f"{kills} workers killed with SIGKILL, split {resharded['split']}, merge "
        f"{resharded['merge']}, {order_violations} order violations, {parents_violations} children "
        f"before parents, {backwards} backward checkpoints, {len(final_leases)} leases at the end"
    )
    assert not lost, f"lost records: {sorted(lost, key=int)[:20]}"
    assert order_violations == 0
    assert parents_violations == 0
    assert backwards == 0
    assert bad_duplicates == 0, "\n".join(examples[:10])
    assert kills >= 4 and failed_writes > 0 and resharded == {"split": True, "merge": True}
