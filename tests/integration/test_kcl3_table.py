"""A lease table a KCL 3.x (Java) application left behind, built item by item in its shapes, is
continued by a kclpy-spark worker process (DynamoDB and Kinesis on LocalStack): leases owned by
its dead workers, one mid-handoff (``checkpointOwner`` set), one unowned; the worker-metrics,
leader and migration entities of the 3.5 single-table format beside them. The worker takes every
lease (the mid-handoff one once it expired, clearing ``checkpointOwner``), starts each shard at
its stored checkpoint, writes ``throughputKBps`` at renewal, and leaves the other entities alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from worker_procs import fleet, produce, read_output, wait_active, wait_for

from checkpoint.lease import MAX_HASH_KEY
from checkpoint.stores.dynamodb import DynamoDBLeaseTable


def _lease_item(shard: dict[str, Any], **attrs: Any) -> dict[str, Any]:
    hashes = shard["HashKeyRange"]
    item = {
        "leaseKey": {"S": shard["ShardId"]},
        "entityType": {"S": "LEASE"},
        "leaseCounter": {"N": "100"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "startingHashKey": {"S": hashes["StartingHashKey"]},
        "endingHashKey": {"S": hashes["EndingHashKey"]},
        "throughputKBps": {"N": "2.5"},
    }
    item.update(attrs)
    return item


OTHER_ENTITIES = [
    {
        "leaseKey": {"S": "kcl-java-worker-1"},
        "entityType": {"S": "WORKER_METRIC_STATS"},
        "lut": {"N": "1764000000"},
        "sts": {"M": {"CPU": {"L": [{"N": "41.5"}, {"N": "40.2"}]}}},
        "opr": {"M": {"CPU": {"L": [{"N": "100"}]}}},
    },
    {
        "leaseKey": {"S": "Leader"},
        "entityType": {"S": "LEADER"},
        "ownerName": {"S": "kcl-java-worker-1"},
        "leaseDuration": {"S": "120000"},
        "recordVersionNumber": {"S": "6f1c0a70-3a4e-4c6f-9a55-0d2e3b1c9f00"},
    },
    {
        "leaseKey": {"S": "Migration3.0"},
        "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
        "cv": {"S": "CLIENT_VERSION_3X"},
        "mb": {"S": "kcl-java-worker-1"},
        "mts": {"N": "1763990000000"},
    },
]


def test_a_kcl3_table_is_continued(
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=4)
    wait_active(kinesis_client, name)
    where = produce(kinesis_client, name, range(0, 80))
    shards = kinesis_client.list_shards(StreamName=name)["Shards"]
    ids = [s["ShardId"] for s in shards]
    assert int(shards[-1]["HashKeyRange"]["EndingHashKey"]) == MAX_HASH_KEY
    records = {}  # shard -> [(sequence number, data)], in order
    for shard_id in ids:
        it = kinesis_client.get_shard_iterator(
            StreamName=name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        got = kinesis_client.get_records(ShardIterator=it, Limit=1000)["Records"]
        records[shard_id] = [(r["SequenceNumber"], r["Data"].decode()) for r in got]
        assert len(records[shard_id]) >= 4, "the producer should reach every shard"
    checkpoint = {s: records[s][2][0] for s in ids[:2]}  # after the third record

    table = DynamoDBLeaseTable(dynamodb_client, name)
    table.ensure_table()
    items = [
        _lease_item(shards[0], leaseOwner={"S": "kcl-java-worker-1"},
                    checkpoint={"S": checkpoint[ids[0]]}),
        _lease_item(shards[1], leaseOwner={"S": "kcl-java-worker-2"},
                    checkpointOwner={"S": "kcl-java-worker-1"},
                    checkpoint={"S": checkpoint[ids[1]]}),
        _lease_item(shards[2], checkpoint={"S": "TRIM_HORIZON"}),
        _lease_item(shards[3], leaseOwner={"S": "kcl-java-worker-2"},
                    checkpoint={"S": "TRIM_HORIZON"}),
    ]  # fmt: skip
    for item in items + OTHER_ENTITIES:
        dynamodb_client.put_item(TableName=name, Item=item)

    output = tmp_path / "out"
    config = f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "slow_processor:SlowProcessor"
failover_time = 3.0
idle_time_between_reads = 0.2
"""
    with fleet(tmp_path, config, output) as workers:
        workers.env["PYTHONPATH"] += f":{Path(__file__).parent}"
        # A look before any kclpy-spark worker ran (no coordination table yet): every lease,
        # owners and checkpoints, and nothing created.
        dynamodb_client.delete_table(TableName=table.records.table_name)
        look = subprocess.run(
            [sys.executable, "-m", "kclpy_spark.cli", "status", "--json",
             "--config", str(workers.config)],
            capture_output=True, text=True, timeout=60, env=workers.env, check=False,
        )  # fmt: skip
        assert look.returncode == 0, look.stderr
        seen = {row["lease_key"]: row for row in json.loads(look.stdout)["leases"]}
        assert set(seen) == set(ids), seen
        assert seen[ids[0]]["owner"] == "kcl-java-worker-1", seen[ids[0]]
        tables = dynamodb_client.list_tables()["TableNames"]
        assert table.records.table_name not in tables
        w = workers.start("py-worker")
        expected = {d for s in ids for _, d in records[s]} - {
            d for s in ids[:2] for _, d in records[s][:3]
        }

        def delivered() -> list[str]:
            return [d for e in read_output(output) if e["event"] == "records" for d in e["data"]]

        wait_for("every record after the stored checkpoints", lambda: expected <= set(delivered()),
                 timeout=90)  # fmt: skip
        renewed = lambda: all(x.throughput_kbps != 2.5 for x in table.list_leases())  # noqa: E731
        wait_for("a renewal with the measured throughput", renewed, timeout=30)
        leases = {x.shard_id: x for x in table.list_leases()}  # before the worker stops
        starts = {e["shard"]: e["from"] for e in read_output(output) if e["event"] == "initialize"}
        assert not w.log_text().count("Traceback")
    assert starts[ids[0]] == checkpoint[ids[0]] and starts[ids[1]] == checkpoint[ids[1]]
    assert starts[ids[2]] == starts[ids[3]] == "TRIM_HORIZON"
    skipped = {d for s in ids[:2] for _, d in records[s][:3]}
    assert not skipped & set(delivered()), "records before a stored checkpoint were delivered"
    assert set(where) - skipped <= set(delivered())
    assert set(leases) == set(ids)
    for lease in leases.values():
        assert lease.lease_owner == "py-worker" and lease.checkpoint_owner is None
        assert lease.throughput_kbps is not None and lease.throughput_kbps != 2.5
    for item in OTHER_ENTITIES:
        stored = dynamodb_client.get_item(TableName=name, Key={"leaseKey": item["leaseKey"]})
        assert stored["Item"] == item, f"{item['leaseKey']} was changed"
