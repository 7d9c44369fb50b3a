"""kclpy-spark's coordination records on DynamoDB, in a table of their own beside the lease table.

The records (shard-sync leadership, worker status, stream identities, the suspend flag) once
shared the lease table, marked with an ``entityType`` of their own. Java KCL 3.5 skips such
items, but every other reader of a lease table tries to read them as leases: KCL 2.x and 3.0-3.4
and kcl-rs 0.1.4 log them as leases that failed to deserialize (kcl-rs does so even for KCL 3.5's
own entity types). So they live in ``<lease table>-KclpySparkState``, which no KCL reads: the
lease table holds leases only. Items keep the form they had (``leaseKey`` =
``__kclpy_spark__/<key>``, the same attributes), so a record reads the same wherever it is.

Every write is conditional on the record's version (or its absence), as for leases; after an
unknown outcome a stored item equal to what was written counts as a win.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from checkpoint.base.clock import Clock
from checkpoint.base.errors import ResourceNotFoundError
from checkpoint.base.retry import RetryPolicy
from checkpoint.port import CoordinationRecord
from checkpoint.stores import dynamo_codec as codec
from checkpoint.stores.dynamo_calls import DynamoCalls
from checkpoint.stores.dynamo_expr import Expr
from checkpoint.stores.dynamo_table import TableSetup

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

# A record's TTL is its expiry plus this, so only records abandoned for a day go.
TTL_GRACE_SECONDS = 86_400.0
COORDINATION_DEFINITION: dict[str, Any] = {
    "KeySchema": [{"AttributeName": codec.LEASE_KEY, "KeyType": "HASH"}],
    "AttributeDefinitions": [{"AttributeName": codec.LEASE_KEY, "AttributeType": "S"}],
    "BillingMode": "PAY_PER_REQUEST",
}


class DynamoRecords(DynamoCalls):
    """The coordination records of one application, in their table."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        retry: RetryPolicy,
        sleep: Callable[[float], None],
        *,
        ttl_attribute: str | None = None,
    ) -> None:
        super().__init__(client, table_name, retry, sleep)
        self._ttl_attribute = ttl_attribute
        # Found missing by an ``optional`` ensure (a look at a table no kclpy-spark worker has
        # run on: a KCL application's): reads find nothing, writes fail naming the table.
        self.absent = False

    def ensure(
        self, *, create: bool, clock: Clock, create_timeout: float, optional: bool = False
    ) -> None:
        setup = TableSetup(
            self._table, self._call, create=create, ttl_attribute=self._ttl_attribute,
            clock=clock, sleep=self._sleep, create_timeout=create_timeout,
            definition=COORDINATION_DEFINITION, what="coordination table",
        )  # fmt: skip
        try:
            self._retried(f"ensure_table {self._table!r}", setup.ensure)
        except ResourceNotFoundError:
            if create or not optional:
                raise
            self.absent = True

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        if self.absent:
            return None

        def attempt() -> CoordinationRecord | None:
            response = self._call(
                "GetItem", Key=codec.key_of(codec.record_item_key(key)), ConsistentRead=consistent
            )
            item = response.get("Item")
            return None if item is None else codec.record_from_item(item)

        return self._retried(f"get record {key!r}", attempt)

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        if self.absent:
            gone = ResourceNotFoundError(
                f"coordination table {self._table!r} does not exist (a worker creates it at "
                "start; or create it with a 'leaseKey' string hash key)"
            )
            gone.resource = self._table
            raise gone

        def build(e: Expr) -> dict[str, Any]:
            if expected_version is None:
                condition = e.absent(codec.LEASE_KEY)
            else:
                condition = (
                    f"{e.equals(codec.RECORD_VERSION, codec.n_value(expected_version))} AND "
                    f"{e.equals(codec.ENTITY_TYPE, codec.s_value(codec.RECORD_ENTITY))}"
                )
            item = codec.record_to_item(record, self._ttl_attribute, TTL_GRACE_SECONDS)
            return {"Item": item, "ConditionExpression": condition}

        def landed(item: dict[str, Any] | None) -> bool | None:
            return True if item is not None and codec.record_from_item(item) == record else None

        return bool(
            self._write(f"put record {record.key!r}", "PutItem", build, lambda _: True, landed)
        )

    def delete_record(self, key: str, expected_version: int) -> bool:
        if self.absent:
            return False

        def build(e: Expr) -> dict[str, Any]:
            condition = (
                f"{e.equals(codec.RECORD_VERSION, codec.n_value(expected_version))} AND "
                f"{e.equals(codec.ENTITY_TYPE, codec.s_value(codec.RECORD_ENTITY))}"
            )
            return {
                "Key": codec.key_of(codec.record_item_key(key)),
                "ConditionExpression": condition,
            }

        return bool(
            self._write(
                f"delete record {key!r}", "DeleteItem", build, lambda _: True,
                lambda item: True if item is None else None,
            )
        )  # fmt: skip

    def records(self, prefix: str) -> tuple[CoordinationRecord, ...]:
        """Every record whose key starts with ``prefix`` (one eventually consistent Scan)."""
        if self.absent:
            return ()

        start = codec.record_item_key(prefix)
        items = self._every_item(f"scan {self._table!r}", "Scan", ConsistentRead=False)
        return tuple(
            codec.record_from_item(i)
            for i in items
            if codec.is_record_item(i) and i[codec.LEASE_KEY]["S"].startswith(start)
        )
