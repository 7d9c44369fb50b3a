"""An existing KCL application's lease table is continued from its checkpoints.

The table is created and filled the way the Java KCL (the MultiLangDaemon behind amazon-kclpy)
writes it: KCL 3.x's table layout (leaseKey HASH, on-demand, the LeaseOwnerToLeaseKeyIndex), one
lease item as KCL 2.x writes it and one as KCL 3.x does (hash range, throughputKBps), both owned
by a Java worker that is gone, with checkpoints in the middle of their shards. A kclpy-spark
daemon with the same application name takes the leases over once they expire, tells the child
the stored checkpoint in ``initialize``, and processes only the records after it.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from multilang_helpers import (
    PROTOCOL_SCRIPT,
    create_stream,
    daemon,
    properties_text,
    read_events,
    read_records,
    wait_for,
)

PER_SHARD = 8
# Index of the last record each Java worker had checkpointed, per shard.
CHECKPOINTED_AT = {"shardId-000000000000": 3, "shardId-000000000001": 1}
JAVA_WORKER = "ip-10-0-0-12.ec2.internal:5d9e0cd9-8c41-4b7e-9c39-3c0a5c5c1f2e"


def create_kcl_lease_table(dynamodb: Any, name: str) -> None:
    """The lease table as KCL 3.x creates it."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "leaseKey", "AttributeType": "S"},
            {"AttributeName": "leaseOwner", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        GlobalSecondaryIndexes=[
            {
                "IndexName": "LeaseOwnerToLeaseKeyIndex",
                "KeySchema": [
                    {"AttributeName": "leaseOwner", "KeyType": "HASH"},
                    {"AttributeName": "leaseKey", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    dynamodb.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def kcl2_item(shard_id: str, checkpoint: str) -> dict[str, Any]:
    """A lease as KCL 2.x's DynamoDBLeaseSerializer writes it for a single-stream app."""
    return {
        "leaseKey": {"S": shard_id},
        "leaseOwner": {"S": JAVA_WORKER},
        "leaseCounter": {"N": "4127"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "checkpoint": {"S": checkpoint},
        "checkpointSubSequenceNumber": {"N": "0"},
    }


def kcl3_item(shard_id: str, checkpoint: str, hash_range: dict[str, str]) -> dict[str, Any]:
    """A lease as KCL 3.x writes it: hash key range, throughput, entity type."""
    return {
        **kcl2_item(shard_id, checkpoint),
        "leaseCounter": {"N": "96"},
        "ownerSwitchesSinceCheckpoint": {"N": "1"},
        "startingHashKey": {"S": hash_range["StartingHashKey"]},
        "endingHashKey": {"S": hash_range["EndingHashKey"]},
        "throughputKBps": {"N": "0.731"},
        "entityType": {"S": "LEASE"},
    }


def test_a_kcl_lease_table_is_continued_from_its_checkpoints(
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    stream_name: str,
    tmp_path: Path,
) -> None:
    name = stream_name
    output = tmp_path / "out"
    create_stream(kinesis_client, name, 2)
    shards = {s["ShardId"]: s for s in kinesis_client.list_shards(StreamName=name)["Shards"]}
    assert sorted(shards) == sorted(CHECKPOINTED_AT)
    sequences: dict[str, list[str]] = defaultdict(list)
    data: dict[str, list[str]] = defaultdict(list)
    for shard_id, shard in sorted(shards.items()):
        for i in range(PER_SHARD):
            text = f"{shard_id[-1]}-{i}"
            resp = kinesis_client.put_record(
                StreamName=name,
                Data=text.encode(),
                PartitionKey=text,
                ExplicitHashKey=shard["HashKeyRange"]["StartingHashKey"],
            )
            assert resp["ShardId"] == shard_id
            sequences[shard_id].append(resp["SequenceNumber"])
            data[shard_id].append(text)

    create_kcl_lease_table(dynamodb_client, name)
    first, second = sorted(shards)
    stored = {shard: sequences[shard][index] for shard, index in CHECKPOINTED_AT.items()}
    dynamodb_client.put_item(TableName=name, Item=kcl2_item(first, stored[first]))
    dynamodb_client.put_item(
        TableName=name, Item=kcl3_item(second, stored[second], shards[second]["HashKeyRange"])
    )

    expected = {
        text for shard, index in CHECKPOINTED_AT.items() for text in data[shard][index + 1 :]
    }
    props = properties_text(
        name=name,
        endpoint=localstack_endpoint,
        executable=f"{sys.executable} {PROTOCOL_SCRIPT}",
        extra={"failoverTimeMillis": "2000"},
    )
    with daemon(tmp_path, props, output) as running:
        wait_for(
            "the records after the stored checkpoints",
            lambda: expected <= {r["data"] for r in read_records(output)},
            90,
        )

        def leases() -> dict[str, dict[str, Any]]:
            # kclpy-spark's own coordination records share the table (entityType tells them apart)
            items = dynamodb_client.scan(TableName=name)["Items"]
            return {i["leaseKey"]["S"]: i for i in items if i["leaseKey"]["S"] in shards}

        def checkpointed() -> bool:
            return all(
                item["checkpoint"]["S"] == sequences[key][-1] for key, item in leases().items()
            )

        wait_for("the checkpoints at the last records", checkpointed, 30)
        items = leases()
        assert running.stop() == 0

    processed = [r["data"] for r in read_records(output)]
    assert sorted(processed) == sorted(expected), "records at or before a checkpoint were re-read"
    inits = {e["shard"]: e for e in read_events(output) if e["event"] == "initialize"}
    for shard, seq in stored.items():
        assert (inits[shard]["seq"], inits[shard]["sub"]) == (seq, 0)
    # The items stay in the KCL's schema, with what we do not model left in place.
    assert set(items) == {first, second}
    for item in items.values():
        assert item["leaseOwner"] == {"S": "w1"}
        assert item["checkpointSubSequenceNumber"] == {"N": "0"}
        assert item["ownerSwitchesSinceCheckpoint"] == {"N": "0"}
    assert int(items[first]["leaseCounter"]["N"]) > 4127
    assert int(items[second]["leaseCounter"]["N"]) > 96
    # Ours from the first renewal that measured it on (0.731 as seeded until then): a number.
    assert float(items[second]["throughputKBps"]["N"]) >= 0
    assert items[second]["entityType"] == {"S": "LEASE"}
    assert items[second]["startingHashKey"] == {
        "S": shards[second]["HashKeyRange"]["StartingHashKey"]
    }
