"""A lease as this worker holds it, and why a write for it was refused: the runtime values of
``LeaseHolder`` (kept apart from the Lease value, which is what the table stores)."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

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


class LeaseBusyError(KclpySparkError):
    """A renewal could not get its lease's lock before the lease would expire (a write of the
    same lease is stuck); retriable: the next round tries again."""

    retriable = True
