"""Smoke test of the real LocalStack the suite runs against: Kinesis and DynamoDB both answer."""

from __future__ import annotations

from typing import Any

import pytest


def _wait_active(kinesis: Any, name: str) -> None:
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60}
    )


def test_kinesis_put_and_read_back(kinesis_client: Any, unique_name: str) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    _wait_active(kinesis_client, unique_name)
    sent = [f"record-{i}".encode() for i in range(20)]
    resp = kinesis_client.put_records(
        StreamName=unique_name,
        Records=[{"Data": d, "PartitionKey": str(i)} for i, d in enumerate(sent)],
    )
    assert resp["FailedRecordCount"] == 0
    shard_id = kinesis_client.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    iterator = kinesis_client.get_shard_iterator(
        StreamName=unique_name, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    got: list[bytes] = []
    for _ in range(10):
        out = kinesis_client.get_records(ShardIterator=iterator, Limit=100)
        got.extend(r["Data"] for r in out["Records"])
        iterator = out["NextShardIterator"]
        if len(got) >= len(sent):
            break
    assert got == sent
    kinesis_client.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def test_dynamodb_conditional_write(dynamodb_client: Any, unique_name: str) -> None:
    dynamodb_client.create_table(
        TableName=unique_name,
        KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb_client.get_waiter("table_exists").wait(TableName=unique_name)
    item = {"leaseKey": {"S": "shardId-000000000000"}, "leaseCounter": {"N": "1"}}
    dynamodb_client.put_item(
        TableName=unique_name, Item=item, ConditionExpression="attribute_not_exists(leaseKey)"
    )
    with pytest.raises(dynamodb_client.exceptions.ConditionalCheckFailedException):
        dynamodb_client.put_item(
            TableName=unique_name, Item=item, ConditionExpression="attribute_not_exists(leaseKey)"
        )
    stored = dynamodb_client.get_item(TableName=unique_name, Key={"leaseKey": item["leaseKey"]})
    assert stored["Item"]["leaseCounter"] == {"N": "1"}
    dynamodb_client.delete_table(TableName=unique_name)
