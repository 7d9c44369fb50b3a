"""What one worker has seen of the lease table: which leases are expired, judged by its own clock.

Expiry in the KCL is purely local. A holder renews by incrementing the lease counter, and every
other worker remembers, per lease, the time on its own monotonic clock at which it first saw the
current counter value (the KCL's ``lastCounterIncrementNanos``). A lease is expired when that time
is more than the lease duration ago.

First sight, as the KCL's DynamoDBLeaseTaker.updateAllLeases does it:

* a lease first seen **unowned** counts as never renewed: expired and "very old" at once, so it is
  taken before anything else (a brand-new lease from shard sync is picked up on the next scan);
* a lease first seen **owned** counts as renewed at the time of that scan: a worker that just
  started gives every holder a full lease duration to show that it is alive before judging it
  expired.

Later scans keep the remembered time while the counter is unchanged and reset it when the counter
has moved. Leases that vanished from the table are forgotten.

**Write stamps (beyond the KCL).** Seen only at scans, a counter change is dated up to one scan
interval late, so a dead worker's lease moved up to that much later than it had to. kclpy-spark's
stores stamp every counter move with the writer's wall time (``Lease.write_time``), taken before
the write is sent, so never before the holder's own expiry clock started. When a stamp names the
current counter, the change is dated at the stamp plus ``LeaseTiming.max_clock_skew`` (the
largest difference between two workers' wall clocks this allows for), converted to this worker's
monotonic clock, and never earlier than the last time this worker saw the older counter nor later
than now. So the holder, whose clock started before its stamp, gives the lease up before any
other worker may judge it expired, as long as clocks differ by less than ``max_clock_skew``; a
larger difference can only move a live lease early (its holder's next write then loses, the
fencing of the counter is unchanged). An unstamped counter (written by a KCL worker) is dated at
the scan, as the KCL does. ``next_check`` and ``look_again`` let the taker read one lease at the
moment it would expire instead of waiting for its next scan.

Beyond the KCL, the observer notes when it saw a lease pass from one owner directly to another (a
steal, or a take after expiry); the taker uses that to damp stealing back (see take_rule.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from checkpoint.lease import Lease
from checkpoint.leasing.timing import LeaseTiming


@dataclass(frozen=True)
class ObservedLease:
    """One lease as of a scan, with what this worker concluded about it."""

    lease: Lease
    # When the lease's current counter was written, on this worker's monotonic clock: its stamp
    # plus the skew allowed, or when first seen if unstamped; None: never seen renewed.
    last_change: float | None
    expired: bool  # counter unchanged for longer than the lease duration (or never renewed)
    very_old: bool  # counter unchanged for longer than the very-old threshold (or never renewed)

    @property
    def key(self) -> str:
        return self.lease.lease_key

    @property
    def owner(self) -> str | None:
        return self.lease.lease_owner

    @property
    def available(self) -> bool:
        """Free to take without stealing: unowned, or its owner stopped renewing (the KCL's
        ``isAvailable``)."""
        return self.expired or self.lease.lease_owner is None


@dataclass(frozen=True)
class ObservedScan:
    """The result of one scan: every lease with its expiry, and the live workers' loads.

    ``leases`` holds the leases that still have work to do. Leases checkpointed at SHARD_END are in
    ``finished`` only: they are counted nowhere and never taken (see take_rule.py for why).
    """

    now: float
    leases: tuple[ObservedLease, ...]
    finished: tuple[Lease, ...] = ()
    # Live owner -> number of its leases that are neither available nor finished.
    owner_counts: Mapping[str, int] = field(default_factory=dict)
    # Worker -> the last scan time at which one of its leases was seen owned by another worker.
    taken_from: Mapping[str, float] = field(default_factory=dict)
    # Worker -> the last time a lease was seen coming to it or leaving it (owner or the worker
    # processing it changed, by a scan or by our own take; both sides of a pending handoff at
    # every scan; a lease gone from the scan; every holder at the first scan of an empty
    # memory), kept for LeaseTiming.cpu_move_memory.
    moved_at: Mapping[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """The number of leases with work left (the KCL counts all; we skip finished ones)."""
        return len(self.leases)

    @property
    def available(self) -> tuple[ObservedLease, ...]:
        return tuple(o for o in self.leases if o.available)

    @property
    def very_old(self) -> tuple[ObservedLease, ...]:
        return tuple(o for o in self.leases if o.very_old)

    def count(self, worker_id: str) -> int:
        """How many live (renewed, unfinished) leases ``worker_id`` holds."""
        return self.owner_counts.get(worker_id, 0)

    def held_by(self, worker_id: str) -> tuple[ObservedLease, ...]:
        """The live leases ``worker_id`` holds (not expired, not finished)."""
        return tuple(o for o in self.leases if o.owner == worker_id and not o.available)


@dataclass(frozen=True)
class _Seen:
    counter: int
    since: float | None
    owner: str | None
    seen_at: float  # the last time this counter was seen (by a scan or a look)
    watched: bool = False  # owned, unfinished and not yet expired: due a look when it would expire
    actual: str | None = None  # the worker processing it (the checkpoint owner mid-handoff)
    # The counter was written by a move to another worker (a take, an assignment, a completed
    # hand-off) that has not renewed it since: it expires only after MOVED_EXPIRY_FACTOR times
    # the lease duration (see _limit).
    moved: bool = False


# A lease just moved to a worker may wait longer than a lease duration for that worker's first
# renewal: a KCL 3.x worker finds leases given to it through the owner index about every failover
# time, and renews a found lease up to a third of one later (about 13 s after the move at the
# default 10 s); the KCL's own leader judges expiry over two failover times for the same reason.
MOVED_EXPIRY_FACTOR = 2.0


class LeaseObserver:
    """Remembers, per lease key, the last counter seen and since when. One per worker; not shared
    between threads without a lock. Pure apart from that memory: every time is passed in."""

    def __init__(self, timing: LeaseTiming) -> None:
        self._timing = timing
        self._seen: dict[str, _Seen] = {}
        self._taken_from: dict[str, float] = {}
        self._moved_at: dict[str, float] = {}
        # The workers known to stamp their own writes (ours, by their status records), as the
        # last scan showed them; None: not known (no lease is judged moved on first sight).
        self._stamping: frozenset[str] | None = None

    def observe(
        self,
        leases: Iterable[Lease],
        now: float,
        wall: float | None = None,
        *,
        stamping: Collection[str] | None = None,
    ) -> ObservedScan:
        """Update the memory with a fresh, complete scan of the table made at monotonic ``now``
        and wall time ``wall`` (both read after the scan returned, as the KCL does, or later,
        which only dates changes later; without ``wall`` write stamps are not used) and classify
        every lease. ``stamping``: the workers known to stamp their own writes (``_moved``)."""
        if stamping is not None:
            self._stamping = frozenset(stamping)
        very_old_after = self._timing.very_old
        seen: dict[str, _Seen] = {}
        live: list[ObservedLease] = []
        finished: list[Lease] = []
        counts: dict[str, int] = {}
        for lease in leases:
            moved = self._moved(lease)
            since = self._since(lease, now, wall)
            age = None if since is None else now - since
            expired = age is None or age > self._limit(moved)
            seen[lease.lease_key] = self._seen_now(lease, since, now, expired=expired, moved=moved)
            if lease.checkpoint.is_shard_end:
                finished.append(lease)
                continue
            observed = ObservedLease(
                lease=lease,
                last_change=since,
                expired=expired,
                very_old=age is None or age > very_old_after,
            )
            live.append(observed)
            if not observed.available and lease.lease_owner is not None:
                counts[lease.lease_owner] = counts.get(lease.lease_owner, 0) + 1
        self._date_unseen_moves(seen, now)
        self._seen = seen
        # Keep only what the steal cooldown can still use, so ids of long-gone workers drop out.
        horizon = self._timing.steal_cooldown
        self._taken_from = {w: t for w, t in self._taken_from.items() if now - t <= horizon}
        memory = self._timing.cpu_move_memory
        self._moved_at = {w: t for w, t in self._moved_at.items() if now - t <= memory}
        return ObservedScan(
            now=now,
            leases=tuple(live),
            finished=tuple(finished),
            owner_counts=counts,
            taken_from=dict(self._taken_from),
            moved_at=dict(self._moved_at),
        )

    @staticmethod
    def _seen_now(
        lease: Lease, since: float | None, now: float, *, expired: bool, moved: bool
    ) -> _Seen:
        watched = lease.lease_owner is not None and not expired
        watched = watched and not lease.checkpoint.is_shard_end
        return _Seen(
            lease.lease_counter, since, lease.lease_owner, now, watched, lease.actual_owner, moved
        )

    def _moved(self, lease: Lease) -> bool:
        """Whether ``lease``'s current counter was written by a move to another worker (the
        worker processing it changed with the counter, from another or from none), remembered
        until the counter moves on."""
        before = self._seen.get(lease.lease_key)
        if before is None:
            return self._moved_on_first_sight(lease)
        if before.counter == lease.lease_counter:
            return before.moved
        actual = lease.actual_owner  # a lease assigned from unowned (a KCL leader after a
        return actual is not None and actual != before.actual  # reshard) is moved too

    def _moved_on_first_sight(self, lease: Lease) -> bool:
        """A lease first seen (an empty memory: a start, a new leader) whose current counter one
        of our stores stamped, owned by a worker that stamps nothing (a KCL worker: its renewals
        leave an older stamp behind): that counter was written by a move to it (a hand-off
        completed, an assignment), which it may take a failover time to find. Judged by one lease
        duration from the stamp, it was taken from that worker just as it began to process it."""
        owner = lease.lease_owner
        if self._stamping is None or owner is None or lease.handoff_pending:
            return False
        return lease.write_time is not None and owner not in self._stamping

    def _limit(self, moved: bool) -> float:
        """How long a lease's counter may stay unchanged before it counts as expired."""
        duration = self._timing.lease_duration
        return duration * MOVED_EXPIRY_FACTOR if moved else duration

    def _since(self, lease: Lease, now: float, wall: float | None) -> float | None:
        before = self._seen.get(lease.lease_key)
        self._note_moves(before, lease, now)
        if before is None:
            # First sight (the KCL's rule): unowned = never renewed; owned = renewed now, or
            # when its stamp says.
            return None if lease.lease_owner is None else self._written(lease, now, wall, None)
        previous_owner, owner = before.owner, lease.lease_owner
        # An owner change is a move even without a counter change (a graceful handoff begun).
        if previous_owner is not None and owner is not None and owner != previous_owner:
            self._taken_from[previous_owner] = now
        if before.counter == lease.lease_counter:
            return before.since
        return self._written(lease, now, wall, before.seen_at)

    def _written(self, lease: Lease, now: float, wall: float | None, floor: float | None) -> float:
        """When the lease's current counter was written, on our monotonic clock: its stamp plus
        the clock skew allowed, within [``floor``, ``now``]; ``now`` if it is not stamped."""
        at = lease.write_time
        if wall is None or at is None:
            return now
        estimate = now - (wall - at) + self._timing.max_clock_skew
        if floor is not None:
            estimate = max(estimate, floor)
        return min(estimate, now)

    def _date_unseen_moves(self, seen: dict[str, _Seen], now: float) -> None:
        """The moves a scan cannot show as an owner change: after an empty memory (a start, a
        new leader) every worker holding a lease may just have gained or lost one; a lease gone
        from the open ones (parked, deleted) left its worker."""
        gone = [s for key, s in self._seen.items() if key not in seen]
        if not self._seen:
            gone = list(seen.values())
        for s in gone:
            self._moved_at.update({w: now for w in (s.owner, s.actual) if w is not None})

    def _note_moves(self, before: _Seen | None, lease: Lease, now: float) -> None:
        """Date, for both workers, a lease coming or going (owner or actual owner changed since
        ``before``); both sides of a handoff still pending are dated at every sight."""
        pending = lease.handoff_pending and not lease.checkpoint.is_shard_end
        pairs = [(lease.lease_owner, lease.actual_owner)] if pending else []
        if before is not None:
            pairs += [(before.owner, lease.lease_owner), (before.actual, lease.actual_owner)]
        for old, new in pairs:
            if old != new:
                self._moved_at.update({w: now for w in (old, new) if w is not None})

    def record_write(self, lease: Lease, now: float) -> None:
        """Remember ``lease`` as this worker just stored it (a won take or renewal) at ``now``, so
        the next scan does not mistake our own write for someone else's (the KCL sets
        lastCounterIncrementNanos on a taken lease the same way); a take is dated as a move."""
        before = self._seen.get(lease.lease_key)
        self._note_moves(before, lease, now)
        moved = before is not None and before.actual != lease.actual_owner
        self._seen[lease.lease_key] = _Seen(
            lease.lease_counter, now, lease.lease_owner, now, actual=lease.actual_owner,
            moved=moved,
        )  # fmt: skip

    def next_check(self, exclude_owner: str) -> float | None:
        """The monotonic time at which the first watched lease not processed by
        ``exclude_owner`` (its actual owner) would expire unless its counter moves; None if no
        such lease."""
        times = [
            s.since + self._limit(s.moved)
            for s in self._seen.values()
            if s.watched and s.since is not None and s.actual != exclude_owner
        ]
        return min(times, default=None)

    def due(self, now: float, exclude_owner: str) -> list[str]:
        """Keys of watched leases not processed by ``exclude_owner`` that expire by ``now``
        unless a fresh read shows their counter moved (``look_again`` each)."""
        return sorted(
            key
            for key, s in self._seen.items()
            if s.watched
            and s.since is not None
            and s.actual != exclude_owner
            and now - s.since > self._limit(s.moved)
        )

    def unwatch(self, keys: Iterable[str]) -> None:
        """Look at these leases no more until the next scan (their look failed or was left to a
        scan): a lease that stays due must not end every wait."""
        for key in keys:
            seen = self._seen.get(key)
            if seen is not None:
                self._seen[key] = replace(seen, watched=False)

    def look_again(
        self, lease_key: str, lease: Lease | None, now: float, wall: float | None
    ) -> bool:
        """Update the memory of one lease from a fresh read made at ``now`` / ``wall`` (None:
        deleted) and tell whether it is available now: expired, or released. Such a lease is
        watched no more (the next scan decides who takes it)."""
        if lease is None:
            self._seen.pop(lease_key, None)
            return False
        moved = self._moved(lease)
        since = self._since(lease, now, wall)
        expired = since is None or now - since > self._limit(moved)
        self._seen[lease_key] = self._seen_now(lease, since, now, expired=expired, moved=moved)
        return expired or lease.lease_owner is None

    def last_change(self, lease_key: str) -> float | None:
        """When the remembered counter of ``lease_key`` was written, as this worker dates it (None:
        never renewed or unknown)."""
        seen = self._seen.get(lease_key)
        return None if seen is None else seen.since

    def forget(self) -> None:
        """Drop all memory (after this, every lease is judged as on first sight)."""
        self._seen.clear()
        self._taken_from.clear()
        self._moved_at.clear()
