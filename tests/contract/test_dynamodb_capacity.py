"""The DynamoDB store counts what its requests cost, on LocalStack, and the sizing rules that
estimate the cost elsewhere agree with what DynamoDB reports for lease items."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from checkpoint.base.retry import RetryPolicy
from checkpoint.lease import Lease
from checkpoint.port import CoordinationRecord
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.capacity import Usage, item_size, read_units, write_units
from checkpoint.stores.dynamodb import DynamoDBLeaseTable

FAST = RetryPolicy(base_delay=0.001, max_delay=0.01, max_attempts=4, max_elapsed=30.0)
SEQ = "49590338271490256608559692538361571095921575989136588898"


@pytest.fixture
def dynamo(dynamodb_client: Any, unique_name: str) -> Iterator[DynamoDBLeaseTable]:
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, retry=FAST, sleep=lambda _: None)
    table.ensure_table()
    yield table
    dynamodb_client.delete_table(TableName=unique_name)
    dynamodb_client.delete_table(TableName=table.records.table_name)


def _raw(client: Any, table: str) -> dict[str, dict[str, Any]]:
    items = client.scan(TableName=table, ConsistentRead=True)["Items"]
    return {i["leaseKey"]["S"]: i for i in items}


def _delta(dynamo: DynamoDBLeaseTable, before: dict[str, Usage], op: str) -> Usage:
    now, was = dynamo.capacity.snapshot().get(op, Usage()), before.get(op, Usage())
    return Usage(now.requests - was.requests, now.units - was.units)


def test_the_store_counts_units_as_dynamodb_reports_and_the_rules_predict(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    for i in range(40):
        lease = Lease(f"shardId-{i:012d}", ExtendedSequenceNumber(SEQ), lease_owner="worker-a",
                      parent_shard_ids=frozenset({"shardId-parent"}))  # fmt: skip
        assert dynamo.create_lease_if_absent(lease)
    assert dynamo.capacity.snapshot()["PutItem"].requests == 40

    raw = _raw(dynamodb_client, dynamo.table_name)
    before = dynamo.capacity.snapshot()
    leases = dynamo.list_leases()
    sizes = [item_size(i) for i in raw.values()]
    # Eventually consistent, as the KCL scans: half the units of a consistent Scan.
    assert _delta(dynamo, before, "Scan") == Usage(1, read_units(sizes, consistent=False))
    assert _delta(dynamo, before, "Scan").units > 0.5  # ~40 items of ~0.3 KB: over one 4 KB unit

    lease = next(x for x in leases if x.lease_key == "shardId-000000000000")
    before = dynamo.capacity.snapshot()
    renewed = dynamo.renew_lease(lease)
    assert renewed is not None
    after = _raw(dynamodb_client, dynamo.table_name)[lease.lease_key]
    expected = write_units(item_size(raw[lease.lease_key]), item_size(after))
    assert _delta(dynamo, before, "UpdateItem") == Usage(1, expected)

    before = dynamo.capacity.snapshot()
    assert dynamo.renew_lease(lease) is None  # a stale counter: the condition fails...
    assert _delta(dynamo, before, "UpdateItem") == Usage(1, 1.0)  # ...and is still charged

    before = dynamo.capacity.snapshot()
    assert dynamo.get_lease(lease.lease_key) == renewed
    assert _delta(dynamo, before, "GetItem") == Usage(1, read_units([item_size(after)]))

    record = CoordinationRecord("shard-sync-leader", "worker-a", 1, 100.0, "{}")
    assert dynamo.put_record(record, None)
    stored = _raw(dynamodb_client, dynamo.records.table_name)  # the coordination table's
    size = item_size(stored["__kclpy_spark__/shard-sync-leader"])
    before = dynamo.capacity.snapshot()
    assert dynamo.get_record(record.key, consistent=False) == record
    assert _delta(dynamo, before, "GetItem") == Usage(1, read_units([size], consistent=False))


def test_a_big_item_costs_more_write_units(dynamo: DynamoDBLeaseTable) -> None:
    lease = Lease(
        "shardId-0",
        TRIM_HORIZON,
        lease_owner="a",
        pending_checkpoint=ExtendedSequenceNumber(SEQ),
        pending_checkpoint_state=b"x" * 3000,
    )
    before = dynamo.capacity.snapshot()
    assert dynamo.create_lease_if_absent(lease)
    assert _delta(dynamo, before, "PutItem").units >= 3.0
    stored = dynamo.get_lease("shardId-0")
    assert stored is not None
    before = dynamo.capacity.snapshot()
    assert dynamo.renew_lease(replace(stored)) is not None
    assert _delta(dynamo, before, "UpdateItem").units >= 3.0  # the item stays big
