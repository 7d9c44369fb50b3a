"""A lease as this worker holds it, why a write for it was refused, and how a write whose answer
never came (a stall, or a timeout after the write landed) is settled: remembered by its stamp and
judged by one read when the next write loses its condition, so a lease nobody else touched is
kept (``write_settled``, with the lease's lock held by ``LeaseHolder``). The runtime values of
``LeaseHolder``, kept apart from the Lease value, which is what the table stores."""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease, WriteStamp
from checkpoint.port import LeaseTable

log = logging.getLogger(__name__)

# Unanswered writes remembered per tenure (every one was conditional on the held counter, so at
# most one of them landed).
UNSURE_KEPT = 8


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


def landed_earlier(
    table: LeaseTable, held: HeldLease, stamps: tuple[WriteStamp, ...]
) -> Lease | None:
    """The lease as stored, if it is one of our writes whose answer never came: our actual owner,
    the counter one past ours, and the stamp of one of those writes (``stamps``). Anything else,
    even our owner with that counter (an operator's reset, another process under our worker id),
    is a lost race: None. Reads the lease (consistently)."""
    stored = table.get_lease(held.lease_key)
    if stored is None or stored.actual_owner is None or stored.written not in stamps:
        return None
    mine = stored.actual_owner == held.lease.actual_owner
    return stored if mine and stored.lease_counter == held.lease.lease_counter + 1 else None


@dataclass(frozen=True)
class Settled:
    """What ``write_settled`` came to: the lease as stored (None: lost), the tenure written on,
    and whether the lease's last counter move was this call's write (False: an earlier write of
    ours whose answer never came, which a write that moves no counter found)."""

    lease: Lease | None
    held: HeldLease
    moved_now: bool = True


class UnsureSlot(Protocol):
    """What ``write_settled`` keeps per lease (``renewal_rules.Slot`` is one): the tenure and the
    stamps of its writes whose answer never came."""

    held: HeldLease
    unsure: tuple[WriteStamp, ...]


def write_settled(
    table: LeaseTable, slot: UnsureSlot, held: HeldLease, write: Callable[[Lease], Lease | None]
) -> Settled:
    """``write(held.lease)`` for ``LeaseHolder``, with the lease's lock held. A write that fails
    with a stamp on its error (``sent_stamp``: it may have landed) is remembered in the slot. If a
    later write loses its condition, the stored lease is read: when it shows one of those writes
    landed (``landed_earlier``), the slot goes on from it and writes once more, instead of losing a
    lease nobody else touched. The tenure's expiry still counts from before the unanswered write."""
    pending = slot.unsure
    try:
        new = write(held.lease)
        if new is None and pending:
            adopted = landed_earlier(table, held, pending)
            if adopted is not None:
                log.warning(
                    "lease %s: our earlier write whose answer was lost had landed (counter %d); "
                    "going on from it", held.lease_key, adopted.lease_counter,
                )  # fmt: skip
                held = slot.held = replace(held, lease=adopted)
                slot.unsure = pending = ()
                new = write(adopted)
    except KclpySparkError as exc:
        if isinstance(exc.sent_stamp, WriteStamp):
            slot.unsure = (*slot.unsure, exc.sent_stamp)[-UNSURE_KEPT:]
        raise
    if new is None:
        return Settled(None, held)
    earlier = new.written is not None and new.written in pending
    if earlier or new.lease_counter > held.lease.lease_counter:
        slot.unsure = ()  # the counter moved: no write conditional on the old one can land now
    return Settled(new, held, not earlier)
