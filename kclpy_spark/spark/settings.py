"""The micro-batcher's settings, counters, results and errors (no I/O, no pyarrow)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from checkpoint.base.errors import KclpySparkError


class SinkParkedError(KclpySparkError):
    """The sink gave up on a batch of this lease; raised from ``process_records`` so the consumer
    parks the lease (its records are redelivered from the checkpoint when it reopens)."""


class LaneClosedError(KclpySparkError):
    """The lease's lane was closed (lease lost or handed over)."""


class DrainResult(enum.Enum):
    DONE = "done"  # everything buffered was written and checkpointed
    PARKED = "parked"  # the sink gave up on a batch
    CLOSED = "closed"  # the lease was lost
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class BatcherSettings:
    """Seconds as floats, sizes in bytes of Arrow data."""

    max_records: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    max_wait: float = 5.0
    scope: Literal["worker", "lease"] = "worker"
    max_attempts: int = 5
    retry_base_delay: float = 1.0
    retry_max_delay: float = 30.0
    write_timeout: float = 600.0
    writers: int = 1
    buffer_bytes: int = 0  # records buffered before process_records blocks; 0: 2 x max_bytes
    regroup_wait: float = 30.0  # how long a re-formed piece waits for the rest of its batch
    commit_retry_delay: float = 1.0

    @property
    def buffer_limit(self) -> int:
        return self.buffer_bytes or 2 * self.max_bytes

    @property
    def ack_timeout(self) -> float:
        """Longer than any batch can take, so acknowledgments never expire in normal operation."""
        per_attempt = self.write_timeout + self.retry_max_delay
        return self.max_attempts * per_attempt + self.regroup_wait + 3600.0


@dataclass
class BatcherStats:
    batches: int = 0
    rows: int = 0
    failed_attempts: int = 0
    dead_lettered_batches: int = 0
    parked_batches: int = 0
    commits: int = 0
    # Seconds spent, summed over batches: pending checkpoints, sink writes, checkpoint commits.
    prepare_seconds: float = 0.0
    write_seconds: float = 0.0
    commit_seconds: float = 0.0
    last_error: str = ""
    by_lease_rows: dict[str, int] = field(default_factory=dict)
