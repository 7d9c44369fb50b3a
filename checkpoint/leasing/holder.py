"""The leases one worker holds: runtime state kept apart from the Lease value (STYLE §2).

A ``HeldLease`` pairs the lease as we last wrote it with two things the table never stores: the
concurrency token issued when we took it (a checkpointer created for one tenure must not write in a
later one) and the monotonic time its counter last moved by our hand, read before each write. The
holder's own expiry is judged locally from that time, as the KCL does, with no wall clock; other
workers date the same write by its stamp (taken by the store after that time) plus the clock skew
they allow, so the holder gives a lease up first unless clocks differ by more than that.

``LeaseHolder`` is the registry of one worker. Renewals and checkpoint writes for one lease are both
conditional on the same counter, so they are serialized by a per-lease lock; otherwise a renewal
would make our own checkpoint lose its condition (or the reverse). Lock order: a lease's lock first,
then the registry lock, never the other way round.

**One slow lease never costs the others.** Each lease is renewed on its own thread of a bounded
renewal pool (the KCL's maxLeaseRenewalThreads, 20), against its own deadline: its local expiry.
``renew_all`` waits a bounded time for the round and reports renewals still under way as ``slow``;
a lease whose renewal is still in flight is not submitted again, so a hung request costs one pool
thread, not one per round. A renewal waits for its lease's lock (held by a checkpoint write) only
until that lease would expire. The table's own timeouts end every call well within the lease
duration. A write whose answer never came is recognised if it landed (``held.write_settled``); a
lost write whose lease item vanished puts it back (``vanished.py``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace

from checkpoint.base.clock import Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.base.threads import RetiringThreadPool
from checkpoint.lease import Lease
from checkpoint.leasing.held_lease import (
    HeldLease,
    LeaseBusyError,
    LeaseLoss,
    UpdateResult,
    write_settled,
)
from checkpoint.leasing.renewal_rules import (
    Renewal,
    RenewalReport,
    Slot,
    due_now,
    plan_round,
    round_report,
    tell_slow,
)
from checkpoint.leasing.timing import renewal_round_interval
from checkpoint.leasing.vanished import restore_if_vanished
from checkpoint.port import LeaseTable

log = logging.getLogger(__name__)

# The KCL's default maxLeaseRenewalThreads.
RENEWAL_THREADS = 20


class LeaseHolder:
    """Thread-safe registry of the leases held by worker ``worker_id``.

    ``lease_duration`` is the failover time in seconds: a lease whose counter has not moved by our
    hand for longer is treated as lost by this worker (others may take it after the same time,
    counted from the write's stamp plus their clock-skew allowance).

    ``skip_checkpointed``: call ``renew_all`` every ``lease_duration / 12``; each lease is renewed
    at the first round after its counter is 0.44 lease duration old (a checkpoint moves it as a
    renewal does), and a failed try again at the next round (``renewal_due``). False: every
    call renews every lease, as the KCL's rounds every third of the duration do.
    """

    def __init__(
        self,
        table: LeaseTable,
        worker_id: str,
        clock: Clock,
        lease_duration: float,
        *,
        renewal_threads: int = RENEWAL_THREADS,
        skip_checkpointed: bool = False,
        on_restored: Callable[[str], None] = lambda _: None,
        restorable: Callable[[Lease], bool] = lambda _: True,
    ) -> None:
        if lease_duration <= 0:
            raise ValueError(f"lease_duration must be > 0, got {lease_duration}")
        self.table = table
        self.worker_id = worker_id
        self.lease_duration = lease_duration
        self._clock = clock
        self._skip_checkpointed = skip_checkpointed
        self._on_restored = on_restored  # told the key of a lease put back (vanished.py)
        self._restorable = restorable  # whether a vanished lease may be put back
        # How often renew_all is meant to be called, and its default wait for a round.
        self._round_interval = renewal_round_interval(lease_duration, skip_checkpointed)
        self._slots: dict[str, Slot] = {}
        self._lock = threading.Lock()
        self._pool = RetiringThreadPool(renewal_threads, "kclpy-spark-renewer")

    def close(self) -> None:
        """Stop the renewal threads (renewals in flight finish on their own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def round_interval(self) -> float:
        """How often ``renew_all`` should be called: every twelfth of the lease duration with
        ``skip_checkpointed``, else every third less the KCL's epsilon (its renewal interval)."""
        return self._round_interval

    def _new_held(self, lease: Lease, started: float | None = None) -> HeldLease:
        return HeldLease(
            lease, uuid.uuid4(), self._clock.monotonic() if started is None else started
        )

    def _current(self, lease_key: str, slot: Slot) -> bool:
        """True if ``slot`` is still the registered slot for the key (call with the lock held)."""
        return self._slots.get(lease_key) is slot

    def add_taken(self, lease: Lease, started: float | None = None) -> HeldLease:
        """Register ``lease`` just taken (or created) by this worker, as returned by the store.

        ``started``: the monotonic time before the write that won it (default: now). The tenure's
        local expiry counts from there, as a renewal's does from its start, so it never outlasts
        what other workers judge from the write's stamp.
        Issues a new concurrency token, so checkpointers of an earlier tenure can no longer write.
        Raises ValueError if the lease names another owner.
        """
        if lease.lease_owner != self.worker_id:
            raise ValueError(
                f"lease {lease.lease_key!r} is owned by {lease.lease_owner!r}, "
                f"not by this worker {self.worker_id!r}"
            )
        while True:
            with self._lock:
                slot = self._slots.get(lease.lease_key)
                if slot is None:
                    slot = Slot(self._new_held(lease, started))
                    self._slots[lease.lease_key] = slot
                    return slot.held
            # Already held: replace under the lease's lock so no write of the old tenure is halfway.
            # Briefly: the new tenure counts from before the take (``started``), so a wait as
            # long as a lease would hand it over already expired.
            if not slot.lock.acquire(timeout=min(0.5, self.lease_duration / 10)):
                # A write of the old tenure is slow or hung (a stuck disk): a fresh slot instead.
                # That write was conditional on the counter our take moved: it loses, and finds
                # its slot replaced (``_current``).
                with self._lock:
                    if self._current(lease.lease_key, slot):
                        fresh = Slot(self._new_held(lease, started))
                        self._slots[lease.lease_key] = fresh
                        return fresh.held
                continue
            try:
                with self._lock:
                    if self._current(lease.lease_key, slot):
                        slot.held = self._new_held(lease, started)
                        slot.renewed_at = float("-inf")
                        slot.unsure = ()
                        return slot.held
            finally:
                slot.lock.release()
            # Dropped meanwhile: start over and register a fresh slot.

    def get_if_held(self, lease_key: str) -> HeldLease | None:
        """The held lease, or None if not held or locally expired."""
        with self._lock:
            slot = self._slots.get(lease_key)
            held = None if slot is None else slot.held
        if held is None or held.is_expired(self._clock.monotonic(), self.lease_duration):
            return None
        return held

    def held_to_write(self, lease_key: str, token: uuid.UUID) -> HeldLease | None:
        """The lease of tenure ``token``, about to be written, or None: not held, held under
        another token, or expired locally, which ends the tenure here as a write refused for it
        does (``_refused_expired``): a renewal under way that lands later must not revive it
        after its writer was told the lease is gone."""
        with self._lock:
            slot = self._slots.get(lease_key)
            held = None if slot is None else slot.held
        if slot is None or held is None or held.token != token:
            return None
        if held.is_expired(self._clock.monotonic(), self.lease_duration):
            self._refused_expired(lease_key, slot, token)
            return None
        return held

    def held(self) -> list[HeldLease]:
        """Every lease held and not locally expired."""
        with self._lock:
            snapshot = [slot.held for slot in self._slots.values()]
        now = self._clock.monotonic()
        return [h for h in snapshot if not h.is_expired(now, self.lease_duration)]

    def held_keys(self) -> set[str]:
        return {h.lease_key for h in self.held()}

    def set_figures(self, lease_key: str, token: uuid.UUID, **figures: object) -> None:
        """What the lease's consumer measured (``Lease.renewal_figures``' names:
        ``throughput_kbps``, the KCL 3.x's throughputKBps; ``figures``, an OwnerFigures), written
        by its next renewal. Ignored unless held under ``token``; None keeps the last value."""
        with self._lock:
            slot = self._slots.get(lease_key)
            if slot is not None and slot.held.token == token:
                slot.figures.update({k: v for k, v in figures.items() if v is not None})

    def drop(self, lease_key: str, token: uuid.UUID | None = None) -> HeldLease | None:
        """Stop holding the lease locally (no write: it expires for others); with ``token``,
        only if it is still held under that tenure. Returns what was dropped."""
        with self._lock:
            slot = self._slots.get(lease_key)
            if slot is None or (token is not None and slot.held.token != token):
                return None
            del self._slots[lease_key]
        return slot.held

    def _drop_slot(self, lease_key: str, slot: Slot, held: HeldLease | None = None) -> bool:
        """Drop ``slot`` if it is still the registered one (and, with ``held``, still holds that
        tenure); whether it was. add_taken replaces a slot's tenure under this same lock."""
        with self._lock:
            if self._current(lease_key, slot) and (held is None or slot.held is held):
                del self._slots[lease_key]
                return True
            return False

    # --- renewals --------------------------------------------------------------------------------

    def renew_all(self, wait: float | None = None) -> RenewalReport:
        """Renew every held lease that is due, with one conditional write each, each on its own
        pool thread.

        A lease already expired locally is not renewed (another worker may own it by now) and is
        reported lost, like one whose renewal lost its condition; both are dropped. A renewal that
        raises (throttling, a failing store) leaves the lease held and is reported in ``failed``.
        Waits at most ``wait`` seconds (default: the round interval, ``round_interval``) for the
        round; renewals still running then are reported in ``slow`` (and logged once from a
        sixth of the lease duration on).
        """
        submitted: dict[concurrent.futures.Future[tuple[Renewal, object]], str] = {}
        now = self._clock.monotonic()
        with self._lock:
            plan = plan_round(self._slots, now, self.lease_duration, self._skip_checkpointed)
            for key in plan.renew:
                slot = self._slots[key]
                slot.renewing_since, slot.told_slow = now, False
                submitted[self._pool.submit(self._renew_one, key, slot)] = key
        limit = self._round_interval if wait is None else wait
        done, pending = concurrent.futures.wait(submitted, timeout=limit)
        outcomes = [(submitted[f], *f.result()) for f in done]
        slow = sorted([submitted[f] for f in pending] + list(plan.already))
        self._tell_slow(slow)
        return round_report(plan, outcomes, slow)

    def _tell_slow(self, keys: list[str]) -> None:
        with self._lock:
            told = tell_slow(self._slots, keys, self._clock.monotonic(), self.lease_duration / 6)
        for key, seconds in told:
            log.warning("renewing lease %s is taking long (%.1f s, still under way)", key, seconds)

    def _renew_one(self, key: str, slot: Slot) -> tuple[Renewal, object]:
        try:
            return self._renew_slot(key, slot)
        except KclpySparkError as exc:
            log.warning("renewing lease %s failed: %s", key, exc)
            return Renewal.FAILED, exc
        except Exception as exc:  # a bug in a store must not kill the renewal round
            log.exception("renewing lease %s failed unexpectedly", key)
            return Renewal.FAILED, KclpySparkError(f"renewing lease {key} failed: {exc!r}")
        finally:
            with self._lock:
                slot.renewing_since = None

    def _renew_slot(self, key: str, slot: Slot) -> tuple[Renewal, object]:
        seen = slot.held  # a retake may replace it in this slot until we hold its lock
        left = seen.last_counter_change + self.lease_duration - self._clock.monotonic()
        if left < 0 or not slot.lock.acquire(timeout=left):
            if self._expired_now(key, slot, seen):
                return Renewal.LOST, seen
            with self._lock:
                if not self._current(key, slot):
                    return Renewal.GONE, None  # released or replaced meanwhile
            return Renewal.FAILED, LeaseBusyError(
                f"lease {key}: a write of it held its lock for the rest of the lease"
            )
        try:
            with self._lock:
                if not self._current(key, slot):
                    return Renewal.GONE, None
            held = slot.held
            if self._expired_now(key, slot, held):
                return Renewal.LOST, held
            if held.lease.actual_owner != self.worker_id:  # given up (released) under this lock
                return Renewal.GONE, None
            started = self._clock.monotonic()
            lazy = self._skip_checkpointed  # a checkpoint may have moved the counter meanwhile
            if not due_now(slot, started, self.lease_duration, lazy):
                return Renewal.SKIPPED, held  # a handoff asked of it shows in the lease as stored
            figures = dict(slot.figures)

            def renew(lease: Lease) -> Lease | None:
                return self.table.renew_lease(replace(lease, **figures))  # type: ignore[arg-type]

            settled = write_settled(self.table, slot, held, renew)
            new, held = settled.lease, settled.held
            if new is None:
                log.warning("lost lease %s: its renewal lost the conditional write", key)
                if restore_if_vanished(self.table, held.lease, self._restorable):
                    self._on_restored(key)
                if not self._drop_slot(key, slot):
                    return Renewal.GONE, None
                return Renewal.LOST, held
            slot.held = HeldLease(new, held.token, started)
            slot.renewed_at = started
            with self._lock:
                ended = slot.ended_expired and not self._current(key, slot)
            if ended:  # a write of it was refused as expired meanwhile
                log.warning("lease %s: renewed after it expired locally; not held", key)
                return Renewal.LOST, slot.held
            return Renewal.RENEWED, slot.held
        finally:
            slot.lock.release()

    def _expired_now(self, key: str, slot: Slot, held: HeldLease) -> bool:
        """True (and the slot dropped) if the tenure ``held`` has expired locally and is still
        the registered one (a tenure released, or replaced by a retake, reports nothing)."""
        if not held.is_expired(self._clock.monotonic(), self.lease_duration):
            return False
        if not self._drop_slot(key, slot, held):
            return False
        log.warning("lease %s expired locally before renewal; dropping it", key)
        return True

    def _refused_expired(self, lease_key: str, slot: Slot, token: uuid.UUID) -> UpdateResult:
        """A write refused because the lease expired locally ends its tenure here (if it is the
        writer's: a retake may have put a new one in the slot): a renewal still under way that
        lands later must not revive it (the writer was told the lease was gone, a Spark sink
        closed its lane, while its consumer went on reading it, unwritten)."""
        with self._lock:
            ours = self._current(lease_key, slot) and slot.held.token == token
            if ours:
                slot.ended_expired = True
                del self._slots[lease_key]
        if ours:
            log.warning("lease %s expired locally before a write of it; dropping it", lease_key)
        return UpdateResult(None, LeaseLoss.EXPIRED)

    # --- writes ----------------------------------------------------------------------------------

    def update(
        self, lease_key: str, token: uuid.UUID, write: Callable[[Lease], Lease | None]
    ) -> UpdateResult:
        """Make one conditional write for a held lease, serialized with its renewals.

        ``write`` gets the lease as last stored by us and makes one conditional write (e.g.
        ``table.update_checkpoint``), returning the lease as now stored or None if it lost (or
        the lease unchanged to write nothing); checks that depend on the stored lease belong in
        it: it runs under the lease's lock. Nothing is written if the lease is not held, expired
        locally, or held under another token. A lost write drops the lease (unless an unanswered
        one landed: ``write_settled``). Exceptions from ``write`` propagate; the lease stays held.
        """
        with self._lock:
            slot = self._slots.get(lease_key)
        if slot is None:
            return UpdateResult(None, LeaseLoss.NOT_HELD)
        # Its lock waited for without a deadline: a renewal's chain of calls (a stuck SQLite
        # disk: for ever) held the checkpoint's thread, and a retake's, past the lease itself.
        left = slot.held.last_counter_change + self.lease_duration - self._clock.monotonic()
        if not slot.lock.acquire(timeout=max(0.0, left)):
            if slot.held.is_expired(self._clock.monotonic(), self.lease_duration):
                return self._refused_expired(lease_key, slot, token)
            raise LeaseBusyError(f"lease {lease_key}: a write of it held its lock too long")
        try:
            return self._update_locked(lease_key, slot, token, write)
        finally:
            slot.lock.release()

    def _update_locked(
        self, lease_key: str, slot: Slot, token: uuid.UUID, write: Callable[[Lease], Lease | None]
    ) -> UpdateResult:
        with self._lock:
            if not self._current(lease_key, slot):
                return UpdateResult(None, LeaseLoss.NOT_HELD)
        held = slot.held
        started = self._clock.monotonic()
        if held.is_expired(started, self.lease_duration):
            return self._refused_expired(lease_key, slot, token)
        if held.token != token:
            return UpdateResult(None, LeaseLoss.TOKEN_CHANGED)
        if held.lease.actual_owner != self.worker_id:  # released or handed over meanwhile
            return UpdateResult(None, LeaseLoss.NOT_HELD)
        settled = write_settled(self.table, slot, held, write)
        new, held = settled.lease, settled.held
        if new is None:
            log.warning("lost lease %s: a conditional update lost", lease_key)
            if restore_if_vanished(self.table, held.lease, self._restorable):
                self._on_restored(lease_key)
            self._drop_slot(lease_key, slot)
            return UpdateResult(None, LeaseLoss.WRITE_LOST)
        if new.lease_counter != held.lease.lease_counter:  # by this write, or an unanswered one
            moved = started if settled.moved_now else held.last_counter_change
            slot.held = HeldLease(new, held.token, moved)
        elif new != held.lease:  # changed without a counter move (a handoff initiated)
            slot.held = HeldLease(new, held.token, held.last_counter_change)
        return UpdateResult(new)

    def begin_handoff(self, lease_key: str, token: uuid.UUID, to: str) -> UpdateResult:
        """Ask for our lease to be handed to ``to`` (a stopping worker's leases): the table names
        ``to`` as owner and us as checkpoint owner; ``release`` completes it. A handoff another
        worker began since our last renewal counts as begun (the lease stays held)."""

        def write(lease: Lease) -> Lease | None:
            begun = self.table.initiate_handoff(lease, to)
            return begun if begun is not None else self._handoff_asked(lease)

        return self.update(lease_key, token, write)

    def _handoff_asked(self, lease: Lease) -> Lease | None:
        """The lease as stored if a handoff from us began since ``lease`` (our last view): same
        counter, and we are its checkpoint owner. Else None."""
        current = self.table.get_lease(lease.lease_key)
        if current is None or current.lease_counter != lease.lease_counter:
            return None
        return current if current.checkpoint_owner == self.worker_id else None

    def release(
        self,
        lease_key: str,
        token: uuid.UUID,
        *,
        change: Callable[[Lease], Lease] | None = None,
        take_back_handoff: bool = False,
    ) -> UpdateResult:
        """Give the lease up: write ``change(lease)``'s progress fields first if given (e.g.
        parking), then evict it (owner removed, so any worker may take it at once; during a
        graceful handoff, complete it: the new owner gets it, unless ``take_back_handoff``: its
        new owner went away, so the lease is taken back and evicted), then stop holding it
        locally, whatever the writes' outcome. The result is the evicted lease, or why nothing
        (or not everything) was written; errors propagate after the local drop."""

        def write(lease: Lease) -> Lease | None:
            if change is not None:
                updated = self.table.update_lease(change(lease))
                if updated is None:
                    return None
                lease = updated
            if lease.handoff_pending and take_back_handoff:
                # Taken back from our own view (a take is conditional on the counter only): it
                # never left us, so no owner switch is counted.
                ours = replace(lease, lease_owner=self.worker_id)
                back = self.table.take_lease(ours, self.worker_id)
                return None if back is None else self.table.evict_lease(back)
            if lease.handoff_pending:
                return self.table.complete_handoff(lease)
            evicted = self.table.evict_lease(lease)
            if evicted is None:  # a handoff begun since our last renewal: end it instead
                asked = self._handoff_asked(lease)
                return None if asked is None else self.table.complete_handoff(asked)
            return evicted

        try:
            return self.update(lease_key, token, write)
        finally:
            with self._lock:
                slot = self._slots.get(lease_key)
                if slot is not None and slot.held.token == token:
                    del self._slots[lease_key]
