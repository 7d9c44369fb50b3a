"""What one worker has seen of the lease table: which leases are expired, judged by its own clock.

Expiry in the KCL is purely local. Nothing in the lease table says when a lease was renewed; a
holder renews by incrementing the lease counter, and every other worker remembers, per lease, the
time on its own monotonic clock at which it first saw the current counter value (the KCL's
``lastCounterIncrementNanos``). A lease is expired when that time is more than the lease duration
ago. No wall clock is read or compared, so clock skew between machines cannot expire a lease.

First sight, as the KCL's DynamoDBLeaseTaker.updateAllLeases does it:

* a lease first seen **unowned** counts as never renewed: expired and "very old" at once, so it is
  taken before anything else (a brand-new lease from shard sync is picked up on the next scan);
* a lease first seen **owned** counts as renewed at the time of that scan: a worker that just
  started gives every holder a full lease duration to show that it is alive before judging it
  expired.

Later scans keep the remembered time while the counter is unchanged and reset it to the scan time
when the counter has moved. Leases that vanished from the table are forgotten.

Beyond the KCL, the observer notes when it saw a lease pass from one owner directly to another (a
steal, or a take after expiry); the taker uses that to damp stealing back (see taker.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from checkpoint.lease import Lease
from checkpoint.leasing.timing import LeaseTiming


@dataclass(frozen=True)
class ObservedLease:
    """One lease as of a scan, with what this worker concluded about it."""

    lease: Lease
    # Monotonic time this worker first saw the lease's current counter; None: never seen renewed.
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
    ``finished`` only: they are counted nowhere and never taken (see taker.py for why).
    """

    now: float
    leases: tuple[ObservedLease, ...]
    finished: tuple[Lease, ...] = ()
    # Live owner -> number of its leases that are neither available nor finished.
    owner_counts: Mapping[str, int] = field(default_factory=dict)
    # Worker -> the last scan time at which one of its leases was seen owned by another worker.
    taken_from: Mapping[str, float] = field(default_factory=dict)

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


class LeaseObserver:
    """Remembers, per lease key, the last counter seen and since when. One per worker; not shared
    between threads without a lock. Pure apart from that memory: every time is passed in."""

    def __init__(self, timing: LeaseTiming) -> None:
        self._timing = timing
        self._seen: dict[str, _Seen] = {}
        self._taken_from: dict[str, float] = {}

    def observe(self, leases: Iterable[Lease], now: float) -> ObservedScan:
        """Update the memory with a fresh, complete scan of the table made at monotonic ``now``
        (read the clock after the scan returns, as the KCL does) and classify every lease."""
        duration, very_old_after = self._timing.lease_duration, self._timing.very_old
        seen: dict[str, _Seen] = {}
        live: list[ObservedLease] = []
        finished: list[Lease] = []
        counts: dict[str, int] = {}
        for lease in leases:
            since = self._since(lease, now)
            seen[lease.lease_key] = _Seen(lease.lease_counter, since, lease.lease_owner)
            if lease.checkpoint.is_shard_end:
                finished.append(lease)
                continue
            age = None if since is None else now - since
            observed = ObservedLease(
                lease=lease,
                last_change=since,
                expired=age is None or age > duration,
                very_old=age is None or age > very_old_after,
            )
            live.append(observed)
            if not observed.available and lease.lease_owner is not None:
                counts[lease.lease_owner] = counts.get(lease.lease_owner, 0) + 1
        self._seen = seen
        # Keep only what the steal cooldown can still use, so ids of long-gone workers drop out.
        horizon = self._timing.steal_cooldown
        self._taken_from = {w: t for w, t in self._taken_from.items() if now - t <= horizon}
        return ObservedScan(
            now=now,
            leases=tuple(live),
            finished=tuple(finished),
            owner_counts=counts,
            taken_from=dict(self._taken_from),
        )

    def _since(self, lease: Lease, now: float) -> float | None:
        before = self._seen.get(lease.lease_key)
        if before is None:
            # First sight (the KCL's rule): unowned = never renewed; owned = renewed now.
            return None if lease.lease_owner is None else now
        previous_owner, owner = before.owner, lease.lease_owner
        # An owner change is a move even without a counter change (a graceful handoff begun).
        if previous_owner is not None and owner is not None and owner != previous_owner:
            self._taken_from[previous_owner] = now
        if before.counter == lease.lease_counter:
            return before.since
        return now

    def record_write(self, lease: Lease, now: float) -> None:
        """Remember ``lease`` as this worker just stored it (a won take or renewal) at ``now``, so
        the next scan does not mistake our own write for someone else's (the KCL sets
        lastCounterIncrementNanos on a taken lease the same way)."""
        self._seen[lease.lease_key] = _Seen(lease.lease_counter, now, lease.lease_owner)

    def last_change(self, lease_key: str) -> float | None:
        """When the remembered counter of ``lease_key`` was first seen (None: never renewed or
        unknown)."""
        seen = self._seen.get(lease_key)
        return None if seen is None else seen.since

    def forget(self) -> None:
        """Drop all memory (after this, every lease is judged as on first sight)."""
        self._seen.clear()
        self._taken_from.clear()
