"""The lease value: what the lease table stores for one shard (the KCL's lease-table schema)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from checkpoint.sequence import ExtendedSequenceNumber

MAX_HASH_KEY = 2**128 - 1


@dataclass(frozen=True, order=True)
class HashKeyRange:
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end <= MAX_HASH_KEY:
            raise ValueError(f"bad hash key range {self.start}..{self.end}")

    @classmethod
    def from_strings(cls, start: str, end: str) -> HashKeyRange:
        return cls(int(start), int(end))


class LeaseState(enum.StrEnum):
    """The coordination view of a lease (after OpenSearch Data Prepper's source coordination)."""

    ASSIGNED = "ASSIGNED"
    UNASSIGNED = "UNASSIGNED"
    COMPLETED = "COMPLETED"  # checkpoint is SHARD_END
    CLOSED = "CLOSED"  # parked after repeated failures until reopen_at


@dataclass(frozen=True)
class Lease:
    """One row of the lease table. Change with ``dataclasses.replace`` (or the helpers below).

    ``lease_counter`` is the optimistic-concurrency token: every state change is conditional on it
    and increments it. ``closed_until``/``closed_count`` are kclpy-spark's parking fields (extra
    attributes the KCL ignores); the rest map one to one onto the KCL's attributes.
    """

    lease_key: str
    checkpoint: ExtendedSequenceNumber
    lease_owner: str | None = None
    lease_counter: int = 0
    pending_checkpoint: ExtendedSequenceNumber | None = None
    pending_checkpoint_state: bytes | None = None
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: frozenset[str] = field(default_factory=frozenset)
    child_shard_ids: frozenset[str] = field(default_factory=frozenset)
    hash_key_range: HashKeyRange | None = None
    checkpoint_owner: str | None = None
    closed_until: float | None = None
    closed_count: int = 0

    @property
    def shard_id(self) -> str:
        """The shard id: the lease key itself, or its last part in the multi-stream key format."""
        return self.lease_key.rsplit(":", 1)[-1]

    @property
    def stream_key(self) -> str | None:
        """``account:stream:creationEpoch`` of a multi-stream lease key; None for a plain one."""
        head, sep, _ = self.lease_key.rpartition(":")
        return head if sep else None

    def sibling_key(self, shard_id: str) -> str:
        """The lease key of another shard of the same stream (a parent or a child)."""
        stream = self.stream_key
        return f"{stream}:{shard_id}" if stream else shard_id

    def state(self, now_wall: float) -> LeaseState:
        """ASSIGNED / UNASSIGNED / COMPLETED / CLOSED, as of wall time ``now_wall``."""
        if self.checkpoint.is_shard_end:
            return LeaseState.COMPLETED
        if self.closed_until is not None and now_wall < self.closed_until:
            return LeaseState.CLOSED
        return LeaseState.ASSIGNED if self.lease_owner else LeaseState.UNASSIGNED

    def bumped(self, **changes: object) -> Lease:
        """A copy with ``changes`` applied and the counter incremented (what a won write stores)."""
        return replace(self, lease_counter=self.lease_counter + 1, **changes)  # type: ignore[arg-type]
