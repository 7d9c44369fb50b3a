"""The renewal round's pure rules (which held lease a round renews, skips or finds asked for a
handoff) and its values: ``LeaseHolder``'s registry entry per lease (``Slot``) and a round's
report."""

from __future__ import annotations

import enum
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease, WriteStamp
from checkpoint.leasing.held_lease import HeldLease
from checkpoint.leasing.timing import RENEW_AFTER, renewal_round_interval

# kclpy-spark's renewal schedule (checkpoint.leasing.timing): a lease is renewed at the first
# round after its counter is RENEW_AFTER old (so every half duration when renewals alone move it:
# at the sixth round; 0.44-0.52 of it after a checkpoint moved it), and once a renewal is a
# duration old whatever checkpoints did (at the twelfth round), for the figures it writes.


def renewal_due(now: float, counter_moved: float, renewed: float, lease_duration: float) -> bool:
    """Whether a renewal round at ``now`` (monotonic) must renew a lease whose counter our hand
    last moved at ``counter_moved`` (by any write: a checkpoint moves it as a renewal does) and
    that was last renewed at ``renewed``, on the schedule above: due once the counter is
    ``RENEW_AFTER`` lease durations old, and once the last renewal is a duration old less half a
    round, so the lease's throughput and figures, which renewals write, are at most a failover
    time old. A try that fails is tried again at every later round until the lease would expire.
    The KCL renews every lease every third of the failover time, checkpointed or not.

    Why 0.44: another worker scanning every 0.55 failover time must see each counter move before
    the lease's would-be expiry (its stamp + the duration + the clock skew allowed, or the scan
    that saw it + the duration when that came sooner), else it reads the lease once more. That
    holds while the gap between two counter moves stays under the scan interval (at most 0.52
    duration here: 0.44 + a round) and the gap plus the scan interval under the duration plus the
    skew."""
    round_interval = renewal_round_interval(lease_duration, True)
    return (
        now - counter_moved >= RENEW_AFTER * lease_duration
        or now - renewed >= lease_duration - round_interval / 2
    )


def checkpoint_spared(
    now: float, counter_moved: float, renewed: float, lease_duration: float
) -> bool:
    """Whether the round at ``now`` is the one that would have renewed a lease (not due by
    ``renewal_due``) had no write other than a renewal moved its counter since: the first round
    after its last renewal is ``RENEW_AFTER`` old. So, with rounds on time, one per renewal
    saved."""
    since = now - renewed - RENEW_AFTER * lease_duration
    return counter_moved > renewed and 0 <= since < renewal_round_interval(lease_duration, True)


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
    # When the renewal of this slot in flight began (monotonic), None if none is (guarded by the
    # registry lock), and whether it was logged as slow.
    renewing_since: float | None = None
    told_slow: bool = False
    # What the consumer measured lately (Lease.renewal_figures' names); the next renewal writes it.
    figures: dict[str, object] = field(default_factory=dict)
    renewed_at: float = float("-inf")  # monotonic start of our last renewal of this tenure
    # Writes of ours that failed after they may have been applied (a timeout), since the lease
    # as held was stored: their stamps (at most held_lease.UNSURE_KEPT; every one was
    # conditional on the held counter, so at most one of them landed).
    unsure: tuple[WriteStamp, ...] = ()
    # A write of this tenure was refused as expired: the tenure ended there (a renewal still
    # under way that lands later is reported lost, not renewed).
    ended_expired: bool = False


def due_now(slot: Slot, now: float, lease_duration: float, lazy: bool) -> bool:
    """Whether a renewal round at ``now`` renews ``slot``: every round (the KCL's rounds every
    third of the lease duration), or with ``lazy`` rounds every ``1 / ROUNDS_PER_DURATION`` of it,
    by ``renewal_due``."""
    if not lazy:
        return True
    return renewal_due(now, slot.held.last_counter_change, slot.renewed_at, lease_duration)


@dataclass(frozen=True)
class RoundPlan:
    """What one renewal round does with each slot it looks at (``plan_round``)."""

    renew: tuple[str, ...] = ()  # due: submit a renewal
    already: tuple[str, ...] = ()  # a renewal from an earlier round still in flight
    skipped: tuple[str, ...] = ()  # not due because a checkpoint moved the counter (one a save)
    handoffs: tuple[HeldLease, ...] = ()  # not due, but the lease as stored asks for a handoff


def plan_round(
    slots: Mapping[str, Slot], now: float, lease_duration: float, lazy: bool
) -> RoundPlan:
    """Sort the slots of one round (call with the registry lock held)."""
    renew: list[str] = []
    already: list[str] = []
    skipped: list[str] = []
    handoffs: list[HeldLease] = []
    for key, slot in slots.items():
        if slot.renewing_since is not None:
            already.append(key)
        elif due_now(slot, now, lease_duration, lazy):
            renew.append(key)
        else:
            held, renewed = slot.held, slot.renewed_at
            if lazy and checkpoint_spared(now, held.last_counter_change, renewed, lease_duration):
                skipped.append(key)
            if held.lease.handoff_pending:  # a checkpoint's answer showed it
                handoffs.append(held)
    return RoundPlan(tuple(renew), tuple(already), tuple(skipped), tuple(handoffs))


def round_report(
    plan: RoundPlan, outcomes: list[tuple[str, Renewal, object]], slow: list[str]
) -> RenewalReport:
    """One round's report from its plan and the outcomes of the renewals that finished in time
    (key, outcome, the HeldLease or error it came with)."""
    renewed: list[str] = []
    skipped, handoffs = list(plan.skipped), list(plan.handoffs)
    lost: list[HeldLease] = []
    failed: dict[str, KclpySparkError] = {}
    for key, outcome, value in outcomes:
        if outcome is Renewal.RENEWED or outcome is Renewal.SKIPPED:
            (renewed if outcome is Renewal.RENEWED else skipped).append(key)
            if isinstance(value, HeldLease) and value.lease.handoff_pending:
                handoffs.append(value)
        elif outcome is Renewal.LOST:
            assert isinstance(value, HeldLease)
            lost.append(value)
        elif outcome is Renewal.FAILED:
            assert isinstance(value, KclpySparkError)
            failed[key] = value
    return RenewalReport(
        tuple(sorted(renewed)),
        tuple(sorted((h.lease for h in lost), key=lambda x: x.lease_key)),
        failed,
        tuple(slow),
        {h.lease_key: h.token for h in lost},
        tuple(sorted(handoffs, key=lambda h: h.lease_key)),
        tuple(sorted(skipped)),
    )


def tell_slow(
    slots: Mapping[str, Slot], keys: list[str], now: float, after: float
) -> list[tuple[str, float]]:
    """The renewals among ``keys`` in flight for ``after`` seconds or more and not told yet
    (key, seconds), marked told (call with the registry lock held)."""
    told = []
    for key in keys:
        slot = slots.get(key)
        since = None if slot is None else slot.renewing_since
        if slot is not None and since is not None and not slot.told_slow and now - since >= after:
            slot.told_slow = True
            told.append((key, now - since))
    return told
