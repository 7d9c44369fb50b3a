"""What a worker holds of a lease, and what holding it produced: the runtime values of
``LeaseHolder`` (kept apart from the Lease value, which is what the table stores)."""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease, WriteStamp
from checkpoint.port import LeaseTable

log = logging.getLogger(__name__)


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


def renewal_due(now: float, counter_moved: float, renewed: float, interval: float) -> bool:
    """Whether a renewal round at ``now`` (monotonic) must renew a lease whose counter our hand
    last moved at ``counter_moved`` (by any write: a checkpoint moves it as a renewal does) and
    that was last renewed at ``renewed``; rounds come every ``interval``.

    Not due when a write moved the counter within the last half interval, unless the last
    renewal is two and a half intervals old: then the next counter move comes at most one and a
    half intervals after the last (half the failover time instead of a third: two tries before
    the lease could expire instead of three), and a renewal, which writes the lease's throughput
    and figures, at least every third round. The KCL renews every lease every round, checkpointed
    or not."""
    recent_write = now - counter_moved < interval / 2
    return not recent_write or now - renewed >= 2.5 * interval


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
    # Leases not renewed this round: a checkpoint moved their counter lately (renewal_due).
    skipped: tuple[str, ...] = ()


class Renewal(enum.Enum):
    """What one lease's renewal came to (LeaseHolder's own)."""

    RENEWED = "renewed"
    SKIPPED = "skipped"  # a checkpoint moved the counter lately (renewal_due)
    LOST = "lost"
    FAILED = "failed"
    GONE = "gone"  # dropped or replaced meanwhile: nothing to report


@dataclass(eq=False)
class Slot:
    """LeaseHolder's registry entry for one lease: the tenure and its renewal state."""

    held: HeldLease
    lock: threading.Lock = field(default_factory=threading.Lock)
    renewing: bool = False  # a renewal of this slot is in flight (guarded by the registry lock)
    # What the consumer measured lately (Lease.renewal_figures' names); the next renewal writes it.
    figures: dict[str, object] = field(default_factory=dict)
    renewed_at: float = float("-inf")  # monotonic start of our last renewal of this tenure
    # Writes of ours that failed after they may have been applied (a timeout), since the lease
    # as held was stored: their stamps (at most UNSURE_KEPT; every one was conditional on the
    # held counter, so at most one of them landed).
    unsure: tuple[WriteStamp, ...] = ()


UNSURE_KEPT = 8


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


def write_settled(
    table: LeaseTable, slot: Slot, held: HeldLease, write: Callable[[Lease], Lease | None]
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
