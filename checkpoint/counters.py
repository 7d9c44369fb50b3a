"""Source-coordination counters with OpenSearch Data Prepper's names (exported as metrics).

The states they count (ASSIGNED, UNASSIGNED, COMPLETED, CLOSED) are ``Lease.state``; parking is
``Lease.parked``.
"""

from __future__ import annotations

import enum
import threading


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
