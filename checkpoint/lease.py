"""The lease value: what the lease table stores for one shard (the KCL's lease-table schema)."""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field, replace

from checkpoint.base.errors import CheckpointRegressionError
from checkpoint.sequence import ExtendedSequenceNumber, Sentinel

MAX_HASH_KEY = 2**128 - 1
# The largest counter a lease item may hold (the KCL's are Java longs). A larger one is corrupt:
# DynamoDB keeps 38 digits, so a counter of 38 digits refuses every write that moves it.
MAX_COUNT = 2**63 - 1


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

    def overlaps(self, other: HashKeyRange) -> bool:
        return self.start <= other.end and other.start <= self.end


class LeaseState(enum.StrEnum):
    """The coordination view of a lease (after OpenSearch Data Prepper's source coordination)."""

    ASSIGNED = "ASSIGNED"
    UNASSIGNED = "UNASSIGNED"
    COMPLETED = "COMPLETED"  # checkpoint is SHARD_END
    CLOSED = "CLOSED"  # parked after repeated failures until reopen_at


# --- lease keys: the one place that knows their format -------------------------------------------
#
# A lease key is a shard id, or in the KCL's multi-stream format
# ``account:streamName:creationEpoch:shardId`` (its "stream key" is the part before the last colon).


def split_lease_key(lease_key: str) -> tuple[str | None, str]:
    """(stream key or None, shard id) of a lease key."""
    head, sep, shard_id = lease_key.rpartition(":")
    return (head if sep else None), shard_id


def lease_key_of(stream_key: str | None, shard_id: str) -> str:
    """The lease key of ``shard_id`` in the stream ``stream_key`` (None: single-stream mode)."""
    return f"{stream_key}:{shard_id}" if stream_key else shard_id


def sibling_key(lease_key: str, shard_id: str) -> str:
    """The lease key of another shard (a parent or a child) of the same stream as ``lease_key``."""
    return lease_key_of(split_lease_key(lease_key)[0], shard_id)


def in_stream(lease_key: str, stream_key: str | None) -> bool:
    """Whether ``lease_key`` belongs to the stream ``stream_key`` (None: the only stream)."""
    return stream_key is None or split_lease_key(lease_key)[0] == stream_key


def stream_key_parts(stream_key: str | None) -> tuple[str, str, str] | None:
    """(account, stream name, creation epoch) of a stream key in the KCL's multi-stream form;
    None for another (or none)."""
    parts = stream_key.split(":") if stream_key else []
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def stream_name_of(lease_key: str) -> str | None:
    """The stream name a multi-stream lease key carries; None for a plain shard id."""
    parts = stream_key_parts(split_lease_key(lease_key)[0])
    return None if parts is None else parts[1]


def refuse_regression(lease: Lease, checkpoint: ExtendedSequenceNumber) -> None:
    """Raise CheckpointRegressionError if ``checkpoint`` is before ``lease.checkpoint``."""
    if checkpoint < lease.checkpoint:
        raise CheckpointRegressionError(
            f"lease {lease.lease_key!r}: refusing to move its checkpoint back from "
            f"{lease.checkpoint} to {checkpoint}"
        )


@dataclass(frozen=True)
class WriteStamp:
    """When a lease was last written, on the writer's wall clock (kclpy-spark's, not the KCL's).

    Every store stamps each write that moves the lease counter with the new counter and its own
    wall time, taken before the write is sent (so never before the holder's renewal began). The
    stamp speaks only for the counter it names: a write by a KCL worker, which does not stamp,
    leaves an older stamp that no longer matches and is ignored (see ``Lease.write_time``).
    """

    counter: int
    at: float  # epoch seconds


# The checkpoints of a lease not read past its start, as the KCL's lease cleanup judges a child
# (a child at LATEST counts as started).
_UNSTARTED = frozenset({Sentinel.TRIM_HORIZON, Sentinel.AT_TIMESTAMP})
OWNER_TAG_AFTER = 9  # owner ids longer than this many characters are tagged (``owner_tag``)


def owner_tag(owner: str) -> str:
    """A short stand-in for ``owner`` in its figures: the id itself when short, else ``~`` and 8
    hex digits of its hash. Every lease item carries its figures and every Scan reads them, so
    a 40-character host-based worker id written there costs the table 31 bytes a lease."""
    if len(owner) <= OWNER_TAG_AFTER:
        return owner
    return "~" + hashlib.blake2b(owner.encode(), digest_size=4).hexdigest()


@dataclass(frozen=True)
class OwnerFigures:
    """What a lease's owner measured, written with its renewals (kclpy-spark's, for ``status``):
    who measured it (``owner_tag`` of its id; a full id in items older versions wrote) and when
    (wall time), the records it delivered in its tenure, and how far behind the stream's tip it
    last read. Stored as one short text (``encode``), so it costs a lease item a few dozen
    bytes; figures of another owner than the lease's are stale."""

    owner: str
    at: float
    records: int
    millis_behind_latest: int | None = None

    def encode(self) -> str:
        lag = "-" if self.millis_behind_latest is None else str(self.millis_behind_latest)
        return f"{self.at:.1f} {self.records} {lag} {self.owner}"

    @classmethod
    def decode(cls, text: object) -> OwnerFigures | None:
        """The figures ``encode`` wrote; None for anything else (they are for people reading
        ``status``: a malformed value never makes the lease unreadable)."""
        try:
            at, records, lag, owner = str(text).split(" ", 3)
            figures = cls(owner, float(at), int(records), None if lag == "-" else int(lag))
        except ValueError:
            return None
        return figures if math.isfinite(figures.at) and owner else None


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
    # kclpy-spark's: where a lease checkpointed at AT_TIMESTAMP starts reading (epoch seconds), as
    # a reset or the lease's creation chose it; None: the configured initial position's time. On
    # a lease checkpointed at LATEST: where its first read began (the pin; our readers start
    # there, a Java KCL worker at its own LATEST).
    start_timestamp: float | None = None
    # The KCL 3.x's throughputKBps: the lease's read throughput (a moving average), written by its
    # owner at each renewal; None until first measured. Load-aware balancing weighs leases by it.
    throughput_kbps: float | None = None
    # kclpy-spark's: the owner's figures, written with each renewal (no request of their own).
    figures: OwnerFigures | None = None
    # kclpy-spark's write stamp (see WriteStamp). Metadata about the write, not lease state: two
    # leases that differ only in it are equal.
    written: WriteStamp | None = field(default=None, compare=False)

    def renewal_figures(self) -> dict[str, float | OwnerFigures]:
        """What a renewal writes (those measured; None keeps the stored ones), by field name:
        ``throughput_kbps`` and ``figures``."""
        measured = {"throughput_kbps": self.throughput_kbps, "figures": self.figures}
        return {name: value for name, value in measured.items() if value is not None}

    @property
    def owner_figures(self) -> OwnerFigures | None:
        """The figures if its current owner (the one processing it) measured them."""
        figures, owner = self.figures, self.actual_owner
        if figures is None or owner is None or figures.owner not in (owner, owner_tag(owner)):
            return None
        return figures

    @property
    def started(self) -> bool:
        """Whether the lease was read past its start, as the KCL's lease cleanup judges a child
        before it deletes the finished parent (its checkpoint neither TRIM_HORIZON nor
        AT_TIMESTAMP)."""
        return self.checkpoint.sentinel not in _UNSTARTED

    @property
    def write_time(self) -> float | None:
        """Wall time (epoch seconds) of the write that set the current counter, if a store
        stamped it; None for unstamped writes (a KCL worker's, or a lease just created)."""
        stamp = self.written
        return stamp.at if stamp is not None and stamp.counter == self.lease_counter else None

    @property
    def actual_owner(self) -> str | None:
        """The worker processing the lease: during a graceful handoff (``checkpoint_owner`` set)
        the old owner, which still renews and checkpoints it while ``lease_owner`` already names
        the new one (the KCL 3.x meaning); otherwise ``lease_owner``."""
        return self.checkpoint_owner if self.checkpoint_owner is not None else self.lease_owner

    @property
    def handoff_pending(self) -> bool:
        """A graceful handoff from ``checkpoint_owner`` to ``lease_owner`` has begun, not ended."""
        return self.checkpoint_owner is not None

    @property
    def shard_id(self) -> str:
        """The shard id: the lease key itself, or its last part in the multi-stream key format."""
        return split_lease_key(self.lease_key)[1]

    @property
    def stream_key(self) -> str | None:
        """``account:stream:creationEpoch`` of a multi-stream lease key; None for a plain one."""
        return split_lease_key(self.lease_key)[0]

    def sibling_key(self, shard_id: str) -> str:
        """The lease key of another shard of the same stream (a parent or a child)."""
        return sibling_key(self.lease_key, shard_id)

    def state(self, now_wall: float) -> LeaseState:
        """ASSIGNED / UNASSIGNED / COMPLETED / CLOSED, as of wall time ``now_wall``."""
        if self.checkpoint.is_shard_end:
            return LeaseState.COMPLETED
        if self.closed_until is not None and now_wall < self.closed_until:
            return LeaseState.CLOSED
        return LeaseState.UNASSIGNED if self.lease_owner is None else LeaseState.ASSIGNED

    def parked(self, reopen_at: float) -> Lease:
        """This lease parked (CLOSED) until wall time ``reopen_at``: one more closing. The owner
        is kept (``update_lease`` does not write it); evict the lease afterwards to let another
        worker reopen it. Raises ValueError for a COMPLETED lease: it has nothing left to do."""
        if self.checkpoint.is_shard_end:
            raise ValueError(f"lease {self.lease_key!r} is completed; there is nothing to park")
        return replace(self, closed_until=reopen_at, closed_count=self.closed_count + 1)

    def checkpointed(
        self, checkpoint: ExtendedSequenceNumber, pending: ExtendedSequenceNumber | None = None
    ) -> Lease:
        """This lease with ``checkpoint`` recorded (what ``update_checkpoint`` stores): pending
        checkpoint := ``pending`` (its state kept only while one is pending), owner switches reset,
        the start timestamp kept only while the checkpoint is still AT_TIMESTAMP or LATEST (a
        LATEST lease's pinned first read)."""
        return replace(
            self,
            checkpoint=checkpoint,
            pending_checkpoint=pending,
            pending_checkpoint_state=None if pending is None else self.pending_checkpoint_state,
            owner_switches_since_checkpoint=0,
            start_timestamp=self.start_timestamp
            if checkpoint.sentinel in (Sentinel.AT_TIMESTAMP, Sentinel.LATEST)
            else None,
        )

    def bumped(self, *, at: float | None = None, **changes: object) -> Lease:
        """A copy with ``changes`` applied and the counter incremented (what a won write stores),
        stamped as written at wall time ``at`` if given."""
        counter = self.lease_counter + 1
        written = self.written if at is None else WriteStamp(counter, at)
        return replace(self, lease_counter=counter, written=written, **changes)  # type: ignore[arg-type]
