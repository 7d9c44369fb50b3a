"""The DynamoDB lease table: the Java KCL's table, schema and conditional writes, with boto3.

Every state change is one conditional UpdateItem/PutItem/DeleteItem (ConditionExpression) whose
condition is the port's; ``ConditionalCheckFailedException`` means a lost race and becomes the
``None``/``False`` result. Won writes ask for ``ReturnValues=ALL_NEW`` and return the stored lease.
Every other AWS error goes through ``map_aws_error``; retriable ones (throttling, transient service
errors, connection failures) are retried by ``checkpoint.base.retry`` around a single-attempt
method.

A write retried after an unknown outcome (a timeout or a 500, seen by us or retried inside botocore;
not a throttle, which DynamoDB refuses before writing) may fail its condition on its own earlier
write. Conditional writes therefore ask for the item as it stood when the condition failed
(``ReturnValuesOnConditionCheckFailure=ALL_OLD``); after an unknown outcome, an item that holds
exactly what this write stores counts as a win, as the KCL's renewLease recovers. Otherwise a
failed condition is a lost race, with no further read. A counter-moving write that gives up with
an error carries its stamp on it (``sent_stamp``): the holder recognises it if it landed.

Coordination records (``CoordinationStore``) live in a table of their own,
``<lease table>-KclpySparkState`` (``dynamo_records.py``): the lease table holds only what a KCL
worker of any version reads as leases (and, in a table a KCL 3.5 worker shares, its entities,
which this module skips: anything whose ``entityType`` is not LEASE). Records an earlier version
left in the lease table (``__kclpy_spark__/<key>``, ``entityType`` = ``KCLPY_SPARK_COORDINATION``)
are skipped the same way, except that a stream's identity is still read from there when the
coordination table has none (so the recreated-stream check survives the upgrade).

The client is boto3's low-level client, which is thread-safe: one table object may serve the
renewer, taker and checkpointer threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import LEASE_TABLE_POLICY, RetryPolicy
from checkpoint.lease import Lease, WriteStamp, refuse_regression
from checkpoint.port import CoordinationRecord, TableScan
from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores import dynamo_codec as codec
from checkpoint.stores.dynamo_calls import DynamoCalls, written_item
from checkpoint.stores.dynamo_expr import Expr
from checkpoint.stores.dynamo_kcl_workers import (
    KclCoordinatorTable,
    KclMetricsTable,
    client_version_of,
    kcl_worker_of,
)
from checkpoint.stores.dynamo_records import DynamoRecords
from checkpoint.stores.dynamo_table import TableSetup, coordination_table_of

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

OWNER_INDEX = codec.OWNER_INDEX
# Records still read from the lease table when the coordination table has none (an upgrade).
LEGACY_READ_PREFIX = "stream/"
# Items a page of the emptiness check reads (see is_empty).
IS_EMPTY_PAGE = 10


class DynamoDBLeaseTable(DynamoCalls):
    """Implements LeaseTable and CoordinationStore on a DynamoDB table in the KCL's schema."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        create_if_missing: bool = True,
        ttl_attribute: str | None = None,
        clock: Clock | None = None,
        retry: RetryPolicy = LEASE_TABLE_POLICY,
        sleep: Callable[[float], None] = time.sleep,
        create_timeout: float = 300.0,
        coordination_table: str | None = None,
        create_records: bool | None = None,
        records_optional: bool = False,
        kcl_application: str | None = None,
    ) -> None:
        """``create_records``: create the coordination table when missing (None: as
        ``create_if_missing``); ``records_optional``: if it is missing and not created, read no
        records instead of failing (``status`` on a KCL application's table);
        ``kcl_application``: the Java KCL application whose 3.0-3.4 tables name its workers
        (None: ``table_name``, as the KCL names the lease table after its application);
        ``retry`` defaults to a budget that ends a call with its retries within half a lease of the
        KCL's default failover time, given a ``client`` whose connect and read timeouts are at most
        ``DEFAULT_CALL_BUDGET.attempt`` each (``kclpy_spark.aws.lease_table_client`` makes one)."""
        super().__init__(client, table_name, retry, sleep)
        self._create = create_if_missing
        self._create_records = create_if_missing if create_records is None else create_records
        self._records_optional = records_optional
        self._clock = clock or SystemClock()
        self._create_timeout = create_timeout
        self.records = DynamoRecords(
            client, coordination_table or coordination_table_of(table_name), retry, sleep,
            ttl_attribute=ttl_attribute,
        )  # fmt: skip
        self.records.capacity = self.capacity  # one meter for the application's requests
        kcl_application = kcl_application or table_name
        self.kcl_metrics = KclMetricsTable(client, kcl_application, retry, sleep)
        self.kcl_metrics.capacity = self.capacity
        self.kcl_coordinator = KclCoordinatorTable(client, kcl_application, retry, sleep)
        self.kcl_coordinator.capacity = self.capacity

    # -- table ----------------------------------------------------------------------------------

    def ensure_table(self) -> None:
        setup = TableSetup(
            self._table,
            self._call,
            create=self._create,
            ttl_attribute=None,
            clock=self._clock,
            sleep=self._sleep,
            create_timeout=self._create_timeout,
        )
        self._retried(f"ensure_table {self._table!r}", setup.ensure)
        self.records.ensure(create=self._create_records, clock=self._clock,
                            create_timeout=self._create_timeout,
                            optional=self._records_optional)  # fmt: skip
        self.kcl_metrics.probe()
        self.kcl_coordinator.probe()

    # -- reads ----------------------------------------------------------------------------------

    def list_leases(self) -> list[Lease]:
        return _leases_in(self._scan())

    def _scan(self) -> list[dict[str, Any]]:
        # Eventually consistent, as the KCL's scans: half the read units of a consistent Scan,
        # which every worker runs every take interval. A scan may show a lease as it stood a moment
        # ago; every decision taken from one is a write conditional on the counter it saw (a stale
        # one loses), and the observer dates an older counter no earlier than it saw the newer one,
        # so staleness can delay a take but never make a live lease look expired.
        return self._every_item(f"list leases in {self._table!r}", "Scan", ConsistentRead=False)

    def scan_table(self, record_prefix: str) -> TableScan:
        """``list_leases``'s Scan (which also yields the KCL 3.x workers' metrics entities and
        the fleet's migration entity), one of the (small) coordination table, and, where a KCL
        3.0-3.4 fleet keeps them in tables of their own, one of its metrics table and a read of
        its migration item."""

        items = self._scan()  # as list_leases
        workers = [s for s in map(kcl_worker_of, items) if s is not None]
        version = next((v for v in map(client_version_of, items) if v is not None), None)
        leases = _leases_in(items)
        workers += self.kcl_metrics.sightings()  # KCL 3.0-3.4's table, if there is one
        if version is None:
            version = self.kcl_coordinator.client_version()
        records = self.records.records(record_prefix)
        return TableScan(tuple(leases), records, tuple(workers), kcl_client_version=version)

    def get_lease(self, lease_key: str) -> Lease | None:
        return self._retried(f"get lease {lease_key!r}", lambda: self._try_get_lease(lease_key))

    def _get_item(self, lease_key: str, consistent: bool = True) -> dict[str, Any] | None:
        response = self._call("GetItem", Key=codec.key_of(lease_key), ConsistentRead=consistent)
        item: dict[str, Any] | None = response.get("Item")
        return item

    def _try_get_lease(self, lease_key: str) -> Lease | None:
        item = self._get_item(lease_key)
        return codec.lease_from_item(item) if item and codec.is_lease_item(item) else None

    def is_empty(self) -> bool:
        return self._retried(f"is_empty {self._table!r}", self._try_is_empty)

    def _try_is_empty(self) -> bool:
        expr = Expr()
        projection = f"{expr.name(codec.LEASE_KEY)}, {expr.name(codec.ENTITY_TYPE)}"
        # A small page: a Scan is charged for the items it reads, not what it projects, so a
        # page of the default 1 MB cost ~100 read units at 1,000 leases, each call (suspended
        # workers ask it every round). The next page is read only if this one held no lease.
        items = self._pages(
            "Scan", ConsistentRead=True, ProjectionExpression=projection,
            Limit=IS_EMPTY_PAGE, **expr.kwargs(),
        )  # fmt: skip
        return not any(codec.is_lease_item(i) for i in items)

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        """The keys of ``owner``'s leases, from the KCL's owner index (eventually consistent).

        The KCL 3.x lease discoverer reads the same index. Raises InvalidStateError if the table
        has no such index (a table created by KCL 2.x).
        """
        expr = Expr()
        condition = expr.owner_is(owner)
        items = self._every_item(
            f"list leases of {owner!r}", "Query", IndexName=OWNER_INDEX,
            KeyConditionExpression=condition, **expr.kwargs(),
        )  # fmt: skip
        return [i[codec.LEASE_KEY]["S"] for i in items]

    # -- conditional writes ---------------------------------------------------------------------

    def create_lease_if_absent(self, lease: Lease) -> bool:
        def landed(item: dict[str, Any] | None) -> bool | None:
            return True if item is not None and codec.lease_from_item(item) == lease else None

        return bool(
            self._write(
                f"create lease {lease.lease_key!r}",
                "PutItem",
                lambda e: {
                    "Item": codec.lease_to_item(lease),
                    "ConditionExpression": e.absent(codec.LEASE_KEY),
                },
                lambda _: True,
                landed,
            )
        )

    def _lease_write(
        self,
        what: str,
        lease: Lease,
        sets: dict[str, AttributeValueTypeDef],
        removes: list[str],
        *,
        check_owner: bool = True,
        check_checkpoint: bool = False,
        check_handoff: bool = False,
        counted: bool = True,
    ) -> Lease | None:
        """UpdateItem SET ``sets`` (plus counter + 1 if ``counted``) REMOVE ``removes``, on
        condition that the stored counter (if ``counted``; and actual owner, if ``check_owner``;
        checkpoint, if ``check_checkpoint``; lease and checkpoint owner, if ``check_handoff``)
        are ``lease``'s. A counted write is stamped once (the new counter, this write's time)."""
        sets = {**sets, **codec.stream_values(lease)}  # a copy: the caller's is left alone
        stamp = WriteStamp(lease.lease_counter + 1, self._clock.wall()) if counted else None
        if stamp is not None:
            sets.update(codec.counter_values(stamp))
        expect = dict(sets)  # what the item holds once this write landed

        def build(expr: Expr) -> dict[str, Any]:
            terms = [expr.counter_is(lease.lease_counter)] if counted else [expr.exists()]
            if check_owner:
                terms.append(expr.actual_owner_is(lease.actual_owner))
            if check_checkpoint:
                terms.append(expr.checkpoint_is(lease.checkpoint))
            if check_handoff:
                terms.append(expr.owner_is(lease.lease_owner))
                terms.append(expr.checkpoint_owner_is(lease.checkpoint_owner))
            return {
                "Key": codec.key_of(lease.lease_key),
                "UpdateExpression": expr.update(sets, removes),
                "ConditionExpression": " AND ".join(terms),
                "ReturnValues": "ALL_NEW",
            }

        def landed(item: dict[str, Any] | None) -> Lease | None:
            if item is None:
                return None
            found = codec.lease_from_item(item)
            normal = codec.lease_to_item(_before_handoff(found, sets))
            done = all(normal.get(k) == v for k, v in expect.items())
            # The actual owner, not leaseOwner: a handoff begun after our write landed renames it.
            owners_removed = {codec.LEASE_OWNER, codec.CHECKPOINT_OWNER} & set(removes)
            ours = not check_owner or owners_removed or found.actual_owner == lease.actual_owner
            return found if done and ours and not any(k in normal for k in removes) else None

        try:
            return self._write(
                f"{what} lease {lease.lease_key!r}",
                "UpdateItem",
                build,
                lambda response: codec.lease_from_item(written_item(response)),
                landed,
            )
        except KclpySparkError as exc:
            exc.sent_stamp = stamp  # it may have landed: how it would show (None: uncounted)
            raise

    def renew_lease(self, lease: Lease) -> Lease | None:
        if lease.actual_owner is None:
            return None  # nobody holds it: nothing to renew
        return self._lease_write("renew", lease, codec.figure_values(lease), [])

    def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        # The counter condition pins the item to the version the caller read, so the caller's
        # owner and owner switches are the stored ones (the KCL computes them the same way).
        # The KCL counts a switch only from one owner to another, not from unowned.
        switched = lease.lease_owner is not None and lease.lease_owner != owner
        switches = lease.owner_switches_since_checkpoint + switched
        sets = {
            codec.LEASE_OWNER: codec.s_value(owner),
            codec.OWNER_SWITCHES: codec.n_value(switches),
        }
        return self._lease_write(
            f"take ({owner!r})", lease, sets, [codec.CHECKPOINT_OWNER], check_owner=False
        )

    def evict_lease(self, lease: Lease) -> Lease | None:
        # Mid-handoff only the checkpoint owner goes: the lease passes to the new owner at once.
        gone = codec.CHECKPOINT_OWNER if lease.handoff_pending else codec.LEASE_OWNER
        return self._lease_write("evict", lease, {}, [gone], check_handoff=True)

    def initiate_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        if lease.lease_owner is None:
            return None
        sets = {
            codec.LEASE_OWNER: codec.s_value(new_owner),
            codec.CHECKPOINT_OWNER: codec.s_value(lease.lease_owner),
        }
        return self._lease_write(
            f"hand over ({new_owner!r})", replace(lease, checkpoint_owner=None), sets, [],
            check_owner=False, check_handoff=True, counted=False,
        )  # fmt: skip

    def complete_handoff(self, lease: Lease) -> Lease | None:
        if lease.checkpoint_owner is None:
            return None
        switches = codec.n_value(lease.owner_switches_since_checkpoint + 1)
        return self._lease_write(
            "complete the handoff of", lease, {codec.OWNER_SWITCHES: switches},
            [codec.CHECKPOINT_OWNER], check_owner=False, check_handoff=True,
        )  # fmt: skip

    def update_lease(self, lease: Lease) -> Lease | None:
        sets, removes = codec.progress_changes(lease)
        return self._lease_write("update", lease, sets, removes)

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        refuse_regression(lease, checkpoint)
        sets, removes = codec.progress_changes(lease.checkpointed(checkpoint, pending))
        return self._lease_write("checkpoint", lease, sets, removes, check_checkpoint=True)

    def delete_lease(self, lease: Lease) -> bool:
        return bool(
            self._write(
                f"delete lease {lease.lease_key!r}",
                "DeleteItem",
                lambda e: {
                    "Key": codec.key_of(lease.lease_key),
                    "ConditionExpression": e.counter_is(lease.lease_counter),
                },
                lambda _: True,
                lambda item: True if item is None else None,
            )
        )

    # -- coordination records (in their own table: dynamo_records.py) ---------------------------

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        record = self.records.get_record(key, consistent=consistent)
        if record is None and key.startswith(LEGACY_READ_PREFIX):
            record = self._retried(f"get legacy record {key!r}", lambda: self._legacy(key))
        return record

    def _legacy(self, key: str) -> CoordinationRecord | None:
        """A record an earlier version kept in the lease table (read only: a stream's identity,
        so the recreated-stream check survives the upgrade)."""
        item = self._get_item(codec.record_item_key(key))
        return codec.record_from_item(item) if item and codec.is_record_item(item) else None

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        return self.records.put_record(record, expected_version)

    def delete_record(self, key: str, expected_version: int) -> bool:
        return self.records.delete_record(key, expected_version)


def _leases_in(items: list[dict[str, Any]]) -> list[Lease]:
    """The leases among a Scan's items (the KCL's other entities skipped)."""
    return [codec.lease_from_item(i) for i in items if codec.is_lease_item(i)]


def _before_handoff(lease: Lease, sets: Mapping[str, object]) -> Lease:
    """The lease as it stood before a handoff was asked of it, unless the write that ``sets``
    those attributes is itself one (judged as it stands; no handoff: itself). A handoff
    asked after a write landed (uncounted: the write's stamp stays) renames the lease owner and
    adds a checkpoint owner, so a write that is not itself a handoff is judged by the item as it
    stood before (a take answered late was taken for lost, its lease left held in the table by
    a worker that thought it had none, until it expired)."""
    if lease.checkpoint_owner is None or codec.CHECKPOINT_OWNER in sets:
        return lease
    return replace(lease, lease_owner=lease.checkpoint_owner, checkpoint_owner=None)
