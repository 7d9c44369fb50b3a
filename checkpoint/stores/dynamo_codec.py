"""Lease <-> DynamoDB item, in the Java KCL's lease-table schema (its attribute names and types).

Items are the low-level client's typed attribute dicts (``{"S": ...}``, ``{"N": "12"}``). Writing
follows the KCL's ``DynamoDBLeaseSerializer``: ``leaseOwner`` is absent while unowned, and empty
sets are never written (DynamoDB forbids empty SS values), so an empty parent or child set is an
absent attribute. kclpy-spark's parking fields are two extra attributes the KCL ignores, written
only when they differ from their defaults. ``throughputKBps`` (KCL 3.x) is read, and written only
by renewals. A multi-stream lease is created with the KCL's ``streamName`` and ``shardId`` too
(``DynamoDBMultiStreamLeaseSerializer``: a Java multi-stream worker reads both, and fails on a
lease without them), and every write of one sets them again, as the KCL's does (a lease made
before they were written gets them); we read neither (the lease key holds both). Attributes we
do not model are ignored on reading and, because state changes use UpdateItem, kept on writing.

Reading is strict where the KCL could not work either: a missing ``leaseCounter`` or ``checkpoint``,
an attribute of the wrong type, a non-numeric N, or a bad sequence number raise
``CorruptLeaseError`` naming the lease.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from checkpoint.base.errors import CorruptLeaseError, InvalidStateError
from checkpoint.lease import MAX_COUNT, HashKeyRange, Lease, OwnerFigures, WriteStamp
from checkpoint.port import CoordinationRecord
from checkpoint.sequence import ExtendedSequenceNumber

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

LEASE_KEY = "leaseKey"
LEASE_OWNER = "leaseOwner"
LEASE_COUNTER = "leaseCounter"
CHECKPOINT = "checkpoint"
CHECKPOINT_SUB = "checkpointSubSequenceNumber"
PENDING_CHECKPOINT = "pendingCheckpoint"
PENDING_CHECKPOINT_SUB = "pendingCheckpointSubSequenceNumber"
PENDING_CHECKPOINT_STATE = "pendingCheckpointState"
OWNER_SWITCHES = "ownerSwitchesSinceCheckpoint"
PARENT_SHARD_IDS = "parentShardId"
STREAM_NAME = "streamName"  # multi-stream leases: account:stream:creationEpoch
SHARD_ID = "shardId"  # multi-stream leases: the shard id without the stream's prefix
CHILD_SHARD_IDS = "childShardIds"
STARTING_HASH_KEY = "startingHashKey"
ENDING_HASH_KEY = "endingHashKey"
CHECKPOINT_OWNER = "checkpointOwner"
CLOSED_UNTIL = "kclpySparkClosedUntil"
CLOSED_COUNT = "kclpySparkClosedCount"
START_TIMESTAMP = "kclpySparkStartTimestamp"
THROUGHPUT = "throughputKBps"  # KCL 3.x, written at renewal
# kclpy-spark's owner figures (checkpoint.lease.OwnerFigures, one short S), written at renewal.
FIGURES = "kclpySparkFigures"
# kclpy-spark's write stamp (checkpoint.lease.WriteStamp): the counter a write set and the
# writer's wall time, written with every counter move; the KCL ignores (and keeps) both.
WRITTEN_COUNTER = "kclpySparkWrittenCounter"
WRITTEN_AT = "kclpySparkWrittenAt"

# KCL 3.5 keeps other entities (worker metrics, streams, leader...) in the lease table and tells
# them apart with this attribute; items without it are leases (KCL 2.x wrote none).
ENTITY_TYPE = "entityType"
LEASE_ENTITY = "LEASE"

# The KCL's table: HASH key leaseKey, on-demand billing, and the KCL 3.x owner index, KEYS_ONLY as
# the KCL creates it (workers query it for the keys of the leases assigned to them).
OWNER_INDEX = "LeaseOwnerToLeaseKeyIndex"
TABLE_DEFINITION: dict[str, Any] = {
    "KeySchema": [{"AttributeName": LEASE_KEY, "KeyType": "HASH"}],
    "AttributeDefinitions": [
        {"AttributeName": LEASE_KEY, "AttributeType": "S"},
        {"AttributeName": LEASE_OWNER, "AttributeType": "S"},
    ],
    "BillingMode": "PAY_PER_REQUEST",
    "GlobalSecondaryIndexes": [
        {
            "IndexName": OWNER_INDEX,
            "KeySchema": [
                {"AttributeName": LEASE_OWNER, "KeyType": "HASH"},
                {"AttributeName": LEASE_KEY, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ],
}


def key_schema_problem(table: Mapping[str, Any]) -> str | None:
    """Why a DescribeTable ``Table`` is not a KCL lease table, or None if its key schema fits."""
    keys = [(k["AttributeName"], k["KeyType"]) for k in table.get("KeySchema", [])]
    types = {a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", [])}
    if keys == [(LEASE_KEY, "HASH")] and types.get(LEASE_KEY) == "S":
        return None
    return f"its key schema is {keys}, not a HASH key {LEASE_KEY!r} of type S"


# Coordination records live in a table of their own (dynamo_records.py), keyed as they were
# in the lease table before.
RECORD_KEY_PREFIX = "__kclpy_spark__/"
RECORD_ENTITY = "KCLPY_SPARK_COORDINATION"
RECORD_KEY = "kclpySparkKey"
RECORD_OWNER = "kclpySparkOwner"
RECORD_VERSION = "kclpySparkVersion"
RECORD_EXPIRES_AT = "kclpySparkExpiresAt"
RECORD_DATA = "kclpySparkData"


def s_value(text: str) -> AttributeValueTypeDef:
    return {"S": text}


def n_value(number: int | float) -> AttributeValueTypeDef:
    """An N value. Floats must be finite: DynamoDB has no infinity or NaN."""
    if isinstance(number, float):
        if not math.isfinite(number):
            raise ValueError(f"DynamoDB numbers must be finite, got {number!r}")
        return {"N": repr(number)}
    if not -MAX_COUNT - 1 <= number <= MAX_COUNT:  # what a reader (ours, a Java KCL's) refuses
        raise ValueError(f"a number stored in the lease table must fit a Java long: {number}")
    return {"N": str(int(number))}


def ss_value(values: frozenset[str]) -> AttributeValueTypeDef:
    return {"SS": sorted(values)}


def is_lease_item(item: Mapping[str, Any]) -> bool:
    """False for the other entities KCL 3.5 (or kclpy-spark) keeps in the lease table."""
    entity = item.get(ENTITY_TYPE)
    return entity is None or entity == {"S": LEASE_ENTITY}


def key_of(lease_key: str) -> dict[str, AttributeValueTypeDef]:
    return {LEASE_KEY: s_value(lease_key)}


def lease_to_item(lease: Lease) -> dict[str, AttributeValueTypeDef]:
    """The full item for ``lease`` (what createLeaseIfNotExists puts)."""
    item: dict[str, AttributeValueTypeDef] = {
        LEASE_KEY: s_value(lease.lease_key),
        LEASE_COUNTER: n_value(lease.lease_counter),
    }
    if lease.lease_owner is not None:
        item[LEASE_OWNER] = s_value(lease.lease_owner)
    item.update(stream_values(lease))
    if lease.parent_shard_ids:
        item[PARENT_SHARD_IDS] = ss_value(lease.parent_shard_ids)
    if lease.hash_key_range is not None:
        item[STARTING_HASH_KEY] = s_value(str(lease.hash_key_range.start))
        item[ENDING_HASH_KEY] = s_value(str(lease.hash_key_range.end))
    if lease.checkpoint_owner is not None:
        item[CHECKPOINT_OWNER] = s_value(lease.checkpoint_owner)
    item.update(figure_values(lease))
    if lease.written is not None:
        item.update(stamp_values(lease.written))
    set_values, _ = progress_changes(lease)
    item.update(set_values)
    return item


def stream_values(lease: Lease) -> dict[str, AttributeValueTypeDef]:
    """A multi-stream lease's ``streamName`` and ``shardId``, which the KCL writes with every
    update too (a lease created before they were written gets them at its next write); none for
    a single-stream lease."""
    if lease.stream_key is None:
        return {}
    return {STREAM_NAME: s_value(lease.stream_key), SHARD_ID: s_value(lease.shard_id)}


def counter_values(stamp: WriteStamp) -> dict[str, AttributeValueTypeDef]:
    """A counted write's new counter and its stamp."""
    return {LEASE_COUNTER: n_value(stamp.counter), **stamp_values(stamp)}


def stamp_values(stamp: WriteStamp) -> dict[str, AttributeValueTypeDef]:
    """The attributes of a write stamp."""
    return {WRITTEN_COUNTER: n_value(stamp.counter), WRITTEN_AT: n_value(float(stamp.at))}


def figure_values(lease: Lease) -> dict[str, AttributeValueTypeDef]:
    """The attributes of the lease's measured figures (what a renewal writes)."""
    values: dict[str, AttributeValueTypeDef] = {}
    if lease.throughput_kbps is not None:
        values[THROUGHPUT] = n_value(float(lease.throughput_kbps))
    if lease.figures is not None:
        values[FIGURES] = s_value(lease.figures.encode())
    return values


def _figures(item: Mapping[str, Any]) -> OwnerFigures | None:
    value = item.get(FIGURES)
    return OwnerFigures.decode(value.get("S")) if isinstance(value, Mapping) else None


def _stamp(item: Mapping[str, Any]) -> WriteStamp | None:
    """The item's write stamp, or None if absent or malformed (a bad stamp only costs the faster
    failover it serves, so it never makes the lease unreadable)."""
    counter, at = item.get(WRITTEN_COUNTER), item.get(WRITTEN_AT)
    try:
        stamp = WriteStamp(int(counter["N"]), float(at["N"]))  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return None
    return stamp if math.isfinite(stamp.at) else None


def progress_changes(lease: Lease) -> tuple[dict[str, AttributeValueTypeDef], list[str]]:
    """The progress fields update_lease writes: (attributes to SET, attribute names to REMOVE).

    Fields that are None or empty (or at their default, for the parking fields) are removed, so a
    value cleared in ``lease`` is cleared in the table.
    """
    sets: dict[str, AttributeValueTypeDef] = {
        CHECKPOINT: s_value(lease.checkpoint.sequence_number),
        CHECKPOINT_SUB: n_value(lease.checkpoint.sub_sequence_number),
        OWNER_SWITCHES: n_value(lease.owner_switches_since_checkpoint),
    }
    removes: list[str] = []
    if lease.pending_checkpoint is not None:
        sets[PENDING_CHECKPOINT] = s_value(lease.pending_checkpoint.sequence_number)
        sets[PENDING_CHECKPOINT_SUB] = n_value(lease.pending_checkpoint.sub_sequence_number)
    else:
        removes += [PENDING_CHECKPOINT, PENDING_CHECKPOINT_SUB]
    if lease.pending_checkpoint_state is not None:
        sets[PENDING_CHECKPOINT_STATE] = {"B": lease.pending_checkpoint_state}
    else:
        removes.append(PENDING_CHECKPOINT_STATE)
    if lease.child_shard_ids:
        sets[CHILD_SHARD_IDS] = ss_value(lease.child_shard_ids)
    else:
        removes.append(CHILD_SHARD_IDS)
    if lease.closed_until is not None:
        sets[CLOSED_UNTIL] = n_value(float(lease.closed_until))
    else:
        removes.append(CLOSED_UNTIL)
    if lease.closed_count:
        sets[CLOSED_COUNT] = n_value(lease.closed_count)
    else:
        removes.append(CLOSED_COUNT)
    if lease.start_timestamp is not None:
        sets[START_TIMESTAMP] = n_value(float(lease.start_timestamp))
    else:
        removes.append(START_TIMESTAMP)
    return sets, removes


class _Reader:
    """Typed access to one item's attributes; every problem becomes a CorruptLeaseError."""

    def __init__(self, item: Mapping[str, Any]) -> None:
        self.item = item
        key = item.get(LEASE_KEY)
        self.key = key["S"] if isinstance(key, Mapping) and isinstance(key.get("S"), str) else "?"

    def corrupt(self, problem: str) -> CorruptLeaseError:
        return CorruptLeaseError(self.key, problem)

    def _typed(self, name: str, kind: str, required: bool) -> Any:
        value = self.item.get(name)
        if value is None:
            if required:
                raise self.corrupt(f"attribute {name!r} is missing")
            return None
        if not isinstance(value, Mapping) or kind not in value:
            kinds = "/".join(value) if isinstance(value, Mapping) else type(value).__name__
            raise self.corrupt(f"attribute {name!r} is {kinds}, expected {kind}")
        return value[kind]

    def s(self, name: str, *, required: bool = False) -> str | None:
        value = self._typed(name, "S", required)
        if value is not None and not isinstance(value, str):
            raise self.corrupt(f"attribute {name!r} is not a string")
        return value

    def required_s(self, name: str) -> str:
        value = self.s(name, required=True)
        assert value is not None  # _typed raised if it was missing
        return value

    def binary(self, name: str) -> bytes | None:
        value = self._typed(name, "B", False)
        if value is not None and not isinstance(value, bytes | bytearray):
            raise self.corrupt(f"attribute {name!r} is not binary")
        return None if value is None else bytes(value)

    def number(self, name: str, *, required: bool = False) -> Decimal | None:
        text = self._typed(name, "N", required)
        if text is None:
            return None
        try:
            number = Decimal(text)
        except (InvalidOperation, TypeError):
            raise self.corrupt(f"attribute {name!r} is not a number: {text!r}") from None
        if not number.is_finite():
            raise self.corrupt(f"attribute {name!r} is not a finite number: {text!r}")
        return number

    def integer(self, name: str, *, required: bool = False, default: int = 0) -> int:
        number = self.number(name, required=required)
        if number is None:
            return default
        if number != number.to_integral_value():
            raise self.corrupt(f"attribute {name!r} is not an integer: {number}")
        if not 0 <= number <= MAX_COUNT:  # a counter of 38 digits: every write of it is refused
            raise self.corrupt(f"attribute {name!r} is out of range 0..2**63-1: {number}")
        return int(number)

    def string_set(self, name: str) -> frozenset[str]:
        values = self._typed(name, "SS", False)
        if values is None:
            return frozenset()
        if not all(isinstance(v, str) for v in values):
            raise self.corrupt(f"attribute {name!r} holds non-strings")
        return frozenset(values)

    def sequence(self, name: str, sub: str, *, required: bool) -> ExtendedSequenceNumber | None:
        seq = self.s(name, required=required)
        if seq is None:
            return None
        try:
            return ExtendedSequenceNumber(seq, self.integer(sub))
        except ValueError as exc:
            raise self.corrupt(f"attribute {name!r}: {exc}") from None


def lease_from_item(item: Mapping[str, Any]) -> Lease:
    """The Lease an item stores. Raises CorruptLeaseError naming the lease if it is unreadable."""
    r = _Reader(item)
    lease_key = r.required_s(LEASE_KEY)
    checkpoint = r.sequence(CHECKPOINT, CHECKPOINT_SUB, required=True)
    assert checkpoint is not None
    pending = r.sequence(PENDING_CHECKPOINT, PENDING_CHECKPOINT_SUB, required=False)
    state_value = item.get(PENDING_CHECKPOINT_STATE)
    if isinstance(state_value, Mapping) and "N" in state_value:
        # The KCL's toDynamoRecord writes the checkpoint's sub-sequence number (an N) here instead
        # of the state bytes; such an item was created by the KCL without any state.
        state = None
    else:
        state = r.binary(PENDING_CHECKPOINT_STATE)
    start = r.s(STARTING_HASH_KEY)
    end = r.s(ENDING_HASH_KEY)
    hash_range = None
    if (start is None) != (end is None):
        raise r.corrupt("only one of startingHashKey and endingHashKey is present")
    if start is not None and end is not None:
        try:
            hash_range = HashKeyRange.from_strings(start, end)
        except ValueError as exc:
            raise r.corrupt(f"bad hash key range: {exc}") from None
    closed = r.number(CLOSED_UNTIL)
    start_timestamp = r.number(START_TIMESTAMP)
    throughput = r.number(THROUGHPUT)
    try:
        return Lease(
            lease_key=lease_key,
            checkpoint=checkpoint,
            lease_owner=r.s(LEASE_OWNER),
            lease_counter=r.integer(LEASE_COUNTER, required=True),
            pending_checkpoint=pending,
            pending_checkpoint_state=state,
            owner_switches_since_checkpoint=r.integer(OWNER_SWITCHES),
            parent_shard_ids=r.string_set(PARENT_SHARD_IDS),
            child_shard_ids=r.string_set(CHILD_SHARD_IDS),
            hash_key_range=hash_range,
            checkpoint_owner=r.s(CHECKPOINT_OWNER),
            closed_until=None if closed is None else float(closed),
            closed_count=r.integer(CLOSED_COUNT),
            start_timestamp=None if start_timestamp is None else float(start_timestamp),
            throughput_kbps=None if throughput is None else float(throughput),
            written=_stamp(item),
            figures=_figures(item),
        )
    except ValueError as exc:
        raise r.corrupt(str(exc)) from None


def is_record_item(item: Mapping[str, Any]) -> bool:
    """A kclpy-spark coordination record (not a lease, not a KCL 3.x entity)."""
    return item.get(ENTITY_TYPE) == {"S": RECORD_ENTITY}


def record_item_key(key: str) -> str:
    """The leaseKey under which coordination record ``key`` is stored."""
    return RECORD_KEY_PREFIX + key


def record_to_item(
    record: CoordinationRecord, ttl_attribute: str | None, ttl_grace: float
) -> dict[str, AttributeValueTypeDef]:
    item: dict[str, AttributeValueTypeDef] = {
        LEASE_KEY: s_value(record_item_key(record.key)),
        ENTITY_TYPE: s_value(RECORD_ENTITY),
        RECORD_KEY: s_value(record.key),
        RECORD_VERSION: n_value(record.version),
        RECORD_EXPIRES_AT: n_value(float(record.expires_at)),
        RECORD_DATA: s_value(record.data),
    }
    if record.owner is not None:
        item[RECORD_OWNER] = s_value(record.owner)
    if ttl_attribute is not None:
        # DynamoDB TTL wants whole epoch seconds; the grace keeps a merely expired record (which
        # its next owner still updates by version) from vanishing under it.
        item[ttl_attribute] = n_value(math.ceil(record.expires_at + ttl_grace))
    return item


def record_from_item(item: Mapping[str, Any]) -> CoordinationRecord:
    r = _Reader(item)
    if item.get(ENTITY_TYPE) != {"S": RECORD_ENTITY}:
        raise InvalidStateError(f"item {r.key!r} is not a kclpy-spark coordination record")
    expires = r.number(RECORD_EXPIRES_AT, required=True)
    return CoordinationRecord(
        key=r.required_s(RECORD_KEY),
        owner=r.s(RECORD_OWNER),
        version=r.integer(RECORD_VERSION, required=True),
        expires_at=float(expires if expires is not None else 0),
        data=r.required_s(RECORD_DATA),
    )
