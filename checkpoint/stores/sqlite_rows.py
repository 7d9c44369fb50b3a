"""The SQLite lease store's schema and its rows: Lease <-> row tuple.

Sequence numbers and hash keys are TEXT (they exceed 64-bit integers), shard-id sets JSON text.
Reading is strict: a damaged row raises CorruptLeaseError naming the lease.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeVar

from checkpoint.base.errors import CorruptLeaseError
from checkpoint.lease import MAX_COUNT, HashKeyRange, Lease, OwnerFigures, WriteStamp
from checkpoint.sequence import ExtendedSequenceNumber

T = TypeVar("T")

# Typed loosely on purpose (nothing NOT NULL but the key): a damaged row must still be readable,
# so that it can be reported as a CorruptLeaseError naming the lease.
LEASE_TYPES = {
    "namespace": "TEXT NOT NULL", "lease_key": "TEXT NOT NULL", "lease_owner": "TEXT",
    "lease_counter": "INTEGER", "checkpoint": "TEXT", "checkpoint_sub": "INTEGER",
    "pending_checkpoint": "TEXT", "pending_checkpoint_sub": "INTEGER",
    "pending_checkpoint_state": "BLOB", "owner_switches": "INTEGER", "parent_shard_ids": "TEXT",
    "child_shard_ids": "TEXT", "starting_hash_key": "TEXT", "ending_hash_key": "TEXT",
    "checkpoint_owner": "TEXT", "closed_until": "REAL", "closed_count": "INTEGER",
    "start_timestamp": "REAL", "throughput_kbps": "REAL", "written_counter": "INTEGER",
    "written_at": "REAL", "figures": "TEXT",
}  # fmt: skip
# Columns added after the first release, in order: a database without them gets them (ALTER TABLE
# ADD COLUMN, NULL for existing rows) when the table is ensured.
ADDED_LEASE_COLUMNS = (
    "start_timestamp", "throughput_kbps", "written_counter", "written_at", "figures",
)  # fmt: skip
RECORD_TYPES = {
    "namespace": "TEXT NOT NULL", "key": "TEXT NOT NULL", "owner": "TEXT",
    "version": "INTEGER NOT NULL", "expires_at": "REAL NOT NULL", "data": "TEXT NOT NULL",
}  # fmt: skip
LEASE_COLUMNS = tuple(LEASE_TYPES)
RECORD_COLUMNS = tuple(RECORD_TYPES)

PROGRESS_COLUMNS = (
    "checkpoint", "checkpoint_sub", "pending_checkpoint", "pending_checkpoint_sub",
    "pending_checkpoint_state", "owner_switches", "child_shard_ids", "closed_until", "closed_count",
    "start_timestamp",
)  # fmt: skip


def progress_values(lease: Lease) -> tuple[Any, ...]:
    pending = lease.pending_checkpoint
    return (
        lease.checkpoint.sequence_number, lease.checkpoint.sub_sequence_number,
        pending and pending.sequence_number, pending and pending.sub_sequence_number,
        lease.pending_checkpoint_state, lease.owner_switches_since_checkpoint,
        json.dumps(sorted(lease.child_shard_ids)), lease.closed_until, lease.closed_count,
        lease.start_timestamp,
    )  # fmt: skip


def lease_to_row(namespace: str, lease: Lease) -> tuple[Any, ...]:
    hash_range = lease.hash_key_range
    by_name = dict(
        zip(PROGRESS_COLUMNS, progress_values(lease), strict=True),
        namespace=namespace, lease_key=lease.lease_key, lease_owner=lease.lease_owner,
        lease_counter=lease.lease_counter, checkpoint_owner=lease.checkpoint_owner,
        parent_shard_ids=json.dumps(sorted(lease.parent_shard_ids)),
        starting_hash_key=None if hash_range is None else str(hash_range.start),
        ending_hash_key=None if hash_range is None else str(hash_range.end),
        throughput_kbps=lease.throughput_kbps,
        written_counter=None if lease.written is None else lease.written.counter,
        written_at=None if lease.written is None else lease.written.at,
        figures=None if lease.figures is None else lease.figures.encode(),
    )  # fmt: skip
    return tuple(by_name[name] for name in LEASE_COLUMNS)


def lease_from_row(row: tuple[Any, ...]) -> Lease:
    col = dict(zip(LEASE_COLUMNS, row, strict=True))
    key = str(col["lease_key"])

    def get(name: str, kind: type[T]) -> T | None:
        value = col[name]
        if value is not None and type(value) is not kind:
            raise CorruptLeaseError(key, f"column {name} is {value!r}, not {kind.__name__}")
        return value

    def need(name: str, kind: type[T]) -> T:
        value = get(name, kind)
        if value is None:
            raise CorruptLeaseError(key, f"column {name} is NULL")
        return value

    def count(name: str) -> int:
        value = get(name, int) or 0
        if not 0 <= value <= MAX_COUNT:
            raise CorruptLeaseError(key, f"column {name} is out of range 0..2**63-1: {value}")
        return value

    def ids(name: str) -> frozenset[str]:
        try:
            values = json.loads(get(name, str) or "[]")
        except ValueError:
            raise CorruptLeaseError(key, f"column {name} is not JSON: {col[name]!r}") from None
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise CorruptLeaseError(key, f"column {name} is not a JSON list of strings")
        return frozenset(values)

    need("lease_counter", int)  # NULL: corrupt
    pending = get("pending_checkpoint", str)
    start, end = get("starting_hash_key", str), get("ending_hash_key", str)
    if (start is None) != (end is None):
        raise CorruptLeaseError(key, "only one of starting_hash_key and ending_hash_key is set")
    try:
        return Lease(
            lease_key=key,
            checkpoint=ExtendedSequenceNumber(need("checkpoint", str), count("checkpoint_sub")),
            lease_owner=get("lease_owner", str),
            lease_counter=count("lease_counter"),
            pending_checkpoint=None
            if pending is None
            else ExtendedSequenceNumber(pending, count("pending_checkpoint_sub")),
            pending_checkpoint_state=get("pending_checkpoint_state", bytes),
            owner_switches_since_checkpoint=count("owner_switches"),
            parent_shard_ids=ids("parent_shard_ids"),
            child_shard_ids=ids("child_shard_ids"),
            hash_key_range=None if start is None else HashKeyRange.from_strings(start, end or ""),
            checkpoint_owner=get("checkpoint_owner", str),
            closed_until=get("closed_until", float),
            closed_count=count("closed_count"),
            start_timestamp=get("start_timestamp", float),
            throughput_kbps=get("throughput_kbps", float),
            written=_stamp(col["written_counter"], col["written_at"]),
            figures=OwnerFigures.decode(col["figures"]) if col["figures"] is not None else None,
        )
    except ValueError as exc:  # a bad sequence number or hash key range
        raise CorruptLeaseError(key, str(exc)) from None


def _stamp(counter: object, at: object) -> WriteStamp | None:
    """The write stamp, or None if absent or not what a store writes (a bad stamp only costs the
    faster failover it serves, so it never makes the lease unreadable)."""
    if isinstance(counter, int) and isinstance(at, int | float) and math.isfinite(at):
        return WriteStamp(counter, float(at))
    return None
