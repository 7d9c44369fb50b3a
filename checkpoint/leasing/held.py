"""What a worker holds of a lease, and what holding it produced: the runtime values of
``LeaseHolder`` (kept apart from the Lease value, which is what the table stores)."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease


@dataclass(frozen=True)
class HeldLease:
    """One tenure of one lease by this worker, as last seen."""

    lease: Lease
    token: uuid.UUID
    last_counter_change: float  # monotonic seconds

    @property
    def lease_key(self) -> str:
        return self.lease.lease_key

    def is_expired(self, now_monotonic: float, lease_duration: float) -> bool:
        return now_monotonic - self.last_counter_change > lease_duration


class LeaseLoss(enum.StrEnum):
    """Why a write for a lease was refused or lost (every one means: stop processing it)."""

    NOT_HELD = "NOT_HELD"  # never taken, or already dropped
    EXPIRED = "EXPIRED"  # not renewed within the lease duration, by our own clock
    TOKEN_CHANGED = "TOKEN_CHANGED"  # held, but in a later tenure than the caller's
    WRITE_LOST = "WRITE_LOST"  # the conditional write lost: someone else changed the lease


@dataclass(frozen=True)
class UpdateResult:
    """The outcome of ``LeaseHolder.update``: the lease as now stored, or why nothing was written
    (``WRITE_LOST``: a write was tried and lost its condition)."""

    lease: Lease | None
    loss: LeaseLoss | None = None

    @property
    def won(self) -> bool:
        return self.lease is not None


@dataclass(frozen=True)
class RenewalReport:
    """What one ``renew_all`` pass did. ``lost`` leases are dropped: their processors must stop.
    ``failed`` renewals hit an infrastructure error (or could not get their lease's lock in time)
    and stay held (they expire locally if the errors go on). ``slow`` renewals were still under way
    when the pass stopped waiting; they finish on their own and are not submitted again until then.
    """

    renewed: tuple[str, ...] = ()
    lost: tuple[Lease, ...] = ()
    failed: dict[str, KclpySparkError] = field(default_factory=dict)
    slow: tuple[str, ...] = ()
    # The tenure each lost lease was held under: a report that arrives after the lease was
    # taken again (a new tenure, a new token) must not stop the new one.
    lost_tokens: dict[str, uuid.UUID] = field(default_factory=dict)
    # Leases another worker asked us to hand over (a graceful handoff seen by their renewal):
    # still held; the processor should checkpoint, then ``release`` completes the handoff.
    handoffs: tuple[HeldLease, ...] = ()
