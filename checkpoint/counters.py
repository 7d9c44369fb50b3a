"""The source-coordination view of leases, after OpenSearch Data Prepper: states, parking, counters.

A lease is ASSIGNED, UNASSIGNED, COMPLETED (checkpoint SHARD_END) or CLOSED (parked after repeated
failures until a wall-clock reopen time). Parking writes two extra lease attributes
(``closed_until``, ``closed_count``); ``park``/``reopen`` only compute the new value, which the
caller writes with ``LeaseTable.update_lease`` (a conditional write like any other).

Wall-clock time is used for parking because other workers read the reopen time; ownership expiry is
still judged locally by each worker (``expired_keys``), as in the KCL.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Collection, Iterable
from dataclasses import replace

from checkpoint.lease import Lease, LeaseState


class Counter(enum.StrEnum):
    """Data Prepper's source-coordination metric names."""

    PARTITIONS_CREATED = "partitionsCreated"
    PARTITIONS_ACQUIRED = "partitionsAcquired"
    PARTITIONS_COMPLETED = "partitionsCompleted"
    NO_PARTITIONS_ACQUIRED = "noPartitionsAcquired"
    PARTITION_NOT_OWNED_ERRORS = "partitionNotOwnedErrors"
    PARTITION_UPDATE_ERRORS = "partitionUpdateErrors"


class CoordinationCounters:
    """Thread-safe counters with Data Prepper's names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(Counter, 0)

    def increment(self, counter: Counter, by: int = 1) -> None:
        if by < 0:
            raise ValueError(f"counters only go up, got {by}")
        with self._lock:
            self._counts[counter] += by

    def get(self, counter: Counter) -> int:
        with self._lock:
            return self._counts[counter]

    def snapshot(self) -> dict[str, int]:
        """Every counter by its Data Prepper name, e.g. ``{"partitionsCreated": 3, ...}``."""
        with self._lock:
            return {counter.value: count for counter, count in self._counts.items()}


def lease_state(lease: Lease, now_wall: float, *, owner_expired: bool = False) -> LeaseState:
    """``Lease.state``, except that an ASSIGNED lease whose owner has expired (as judged by this
    worker's own clock) is UNASSIGNED: anyone may acquire it."""
    state = lease.state(now_wall)
    if state is LeaseState.ASSIGNED and owner_expired:
        return LeaseState.UNASSIGNED
    return state


def park(lease: Lease, reopen_at: float) -> Lease:
    """The lease parked (CLOSED) until wall time ``reopen_at``: one more closing.

    The owner is kept (``update_lease`` does not write it); evict the lease afterwards to let
    another worker reopen it. Raises ValueError for a COMPLETED lease: it has nothing left to do.
    """
    if lease.checkpoint.is_shard_end:
        raise ValueError(f"lease {lease.lease_key!r} is completed; there is nothing to park")
    return replace(lease, closed_until=reopen_at, closed_count=lease.closed_count + 1)


def reopen(lease: Lease) -> Lease:
    """The lease no longer parked (``closed_count`` is kept, for backoff and metrics)."""
    return replace(lease, closed_until=None)


def choose_leases_to_acquire(
    leases: Iterable[Lease],
    expired_keys: Collection[str],
    now_wall: float,
    limit: int,
) -> list[Lease]:
    """Up to ``limit`` leases to try to take, best first.

    First leases whose owner expired (``expired_keys``, judged by the caller's own clock: their
    processing was interrupted), then parked leases whose reopen time has come (earliest first),
    then unowned leases never parked. Never COMPLETED leases, parked leases still closed, or leases
    whose owner is alive. Within a group the input order is kept; shuffle the input to spread
    workers over different leases.
    """
    if limit <= 0:
        return []
    orphaned: list[Lease] = []
    reopened: list[Lease] = []
    unowned: list[Lease] = []
    for lease in leases:
        state = lease.state(now_wall)
        if state in (LeaseState.COMPLETED, LeaseState.CLOSED):
            continue
        if lease.lease_owner is not None:
            if lease.lease_key in expired_keys:
                orphaned.append(lease)
        elif lease.closed_until is not None:
            reopened.append(lease)
        else:
            unowned.append(lease)
    reopened.sort(key=lambda lease: lease.closed_until or 0.0)
    return (orphaned + reopened + unowned)[:limit]
