"""The leases one worker holds: runtime state kept apart from the Lease value (STYLE §2).

A ``HeldLease`` pairs the lease as we last wrote it with two things the table never stores: the
concurrency token issued when we took it (a checkpointer created for one tenure must not write in a
later one) and the monotonic time we last saw its counter move. Expiry is judged locally from that
time, as the KCL does: no wall clock, so no clock skew between workers.

``LeaseHolder`` is the registry of one worker. Renewals and checkpoint writes for one lease are both
conditional on the same counter, so they are serialized by a per-lease lock; otherwise a renewal
would make our own checkpoint lose its condition (or the reverse). Lock order: a lease's lock first,
then the registry lock, never the other way round.
"""

from __future__ import annotations

import enum
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from checkpoint.base.clock import Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease
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
    ``failed`` renewals hit an infrastructure error and stay held (they expire locally if the
    errors go on)."""

    renewed: tuple[str, ...] = ()
    lost: tuple[Lease, ...] = ()
    failed: dict[str, KclpySparkError] = field(default_factory=dict)


@dataclass(eq=False)
class _Slot:
    held: HeldLease
    lock: threading.Lock = field(default_factory=threading.Lock)


class LeaseHolder:
    """Thread-safe registry of the leases held by worker ``worker_id``.

    ``lease_duration`` is the failover time in seconds: a lease not seen to change for longer is
    treated as lost by this worker (others may take it after the same time on their own clocks).
    """

    def __init__(
        self, table: LeaseTable, worker_id: str, clock: Clock, lease_duration: float
    ) -> None:
        if lease_duration <= 0:
            raise ValueError(f"lease_duration must be > 0, got {lease_duration}")
        self.table = table
        self.worker_id = worker_id
        self.lease_duration = lease_duration
        self._clock = clock
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()

    def _new_held(self, lease: Lease) -> HeldLease:
        return HeldLease(lease, uuid.uuid4(), self._clock.monotonic())

    def _current(self, lease_key: str, slot: _Slot) -> bool:
        """True if ``slot`` is still the registered slot for the key (call with the lock held)."""
        return self._slots.get(lease_key) is slot

    def add_taken(self, lease: Lease) -> HeldLease:
        """Register ``lease`` just taken (or created) by this worker, as returned by the store.

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
                    slot = _Slot(self._new_held(lease))
                    self._slots[lease.lease_key] = slot
                    return slot.held
            # Already held: replace under the lease's lock so no write of the old tenure is halfway.
            with slot.lock, self._lock:
                if self._current(lease.lease_key, slot):
                    slot.held = self._new_held(lease)
                    return slot.held
            # Dropped meanwhile: start over and register a fresh slot.

    def get_if_held(self, lease_key: str) -> HeldLease | None:
        """The held lease, or None if not held or locally expired."""
        with self._lock:
            slot = self._slots.get(lease_key)
            held = None if slot is None else slot.held
        if held is None or held.is_expired(self._clock.monotonic(), self.lease_duration):
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

    def drop(self, lease_key: str) -> HeldLease | None:
        """Stop holding the lease locally (no write: it expires for others). Returns what was
        held."""
        with self._lock:
            slot = self._slots.pop(lease_key, None)
        return None if slot is None else slot.held

    def _drop_slot(self, lease_key: str, slot: _Slot) -> None:
        with self._lock:
            if self._current(lease_key, slot):
                del self._slots[lease_key]

    def renew_all(self) -> RenewalReport:
        """Renew every held lease with one conditional write each.

        A lease already expired locally is not renewed (another worker may own it by now) and is
        reported lost, like one whose renewal lost its condition; both are dropped. A renewal that
        raises (throttling, a failing store) leaves the lease held and is reported in ``failed``.
        """
        with self._lock:
            slots = list(self._slots.items())
        renewed: list[str] = []
        lost: list[Lease] = []
        failed: dict[str, KclpySparkError] = {}
        for key, slot in slots:
            with slot.lock:
                with self._lock:
                    if not self._current(key, slot):
                        continue
                held = slot.held
                if held.is_expired(self._clock.monotonic(), self.lease_duration):
                    log.warning("lease %s expired locally before renewal; dropping it", key)
                    self._drop_slot(key, slot)
                    lost.append(held.lease)
                    continue
                try:
                    new = self.table.renew_lease(held.lease)
                except KclpySparkError as exc:
                    log.warning("renewing lease %s failed: %s", key, exc)
                    failed[key] = exc
                    continue
                if new is None:
                    log.warning("lost lease %s: its renewal lost the conditional write", key)
                    self._drop_slot(key, slot)
                    lost.append(held.lease)
                    continue
                slot.held = HeldLease(new, held.token, self._clock.monotonic())
                renewed.append(key)
        return RenewalReport(tuple(renewed), tuple(lost), failed)

    def update(
        self, lease_key: str, token: uuid.UUID, write: Callable[[Lease], Lease | None]
    ) -> UpdateResult:
        """Make one conditional write for a held lease, serialized with its renewals.

        ``write`` gets the lease as last stored by us and makes exactly one conditional write
        (e.g. ``table.update_checkpoint``), returning the lease as now stored or None if it lost;
        it may also return the lease unchanged to write nothing.
        Nothing is written if the lease is not held, expired locally, or held under another token.
        A lost write drops the lease. Exceptions from ``write`` propagate; the lease stays held.
        """
        with self._lock:
            slot = self._slots.get(lease_key)
        if slot is None:
            return UpdateResult(None, LeaseLoss.NOT_HELD)
        with slot.lock:
            with self._lock:
                if not self._current(lease_key, slot):
                    return UpdateResult(None, LeaseLoss.NOT_HELD)
            held = slot.held
            if held.is_expired(self._clock.monotonic(), self.lease_duration):
                return UpdateResult(None, LeaseLoss.EXPIRED)
            if held.token != token:
                return UpdateResult(None, LeaseLoss.TOKEN_CHANGED)
            new = write(held.lease)
            if new is None:
                log.warning("lost lease %s: a conditional update lost", lease_key)
                self._drop_slot(lease_key, slot)
                return UpdateResult(None, LeaseLoss.WRITE_LOST)
            if new.lease_counter != held.lease.lease_counter:
                slot.held = HeldLease(new, held.token, self._clock.monotonic())
            return UpdateResult(new)
