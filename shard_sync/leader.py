"""Shard-sync leader election through the lease store's coordination record (no extra service).

The leader's liveness is judged the way the KCL judges leases: each worker remembers, on its own
monotonic clock, when it last saw the record's version change. A leader renews (bumps the version)
when its record is ``renew_at`` of its life old (a third if it assigns leases), from ticks every
sixth of the life; when a worker has not seen the version move for ``lease_duration``, it
takes the record with a write conditional on the version it saw. Wall-clock time is stored only for
people reading ``status``; no decision depends on clocks agreeing across machines.

A worker that scans the table anyway (the taker's Scan returns every coordination record) hands
the record to ``observe``; a tick within ``observed_max_age`` of that scan judges from it instead
of reading the record again (a follower's own reads are eventually consistent too). Either may
show an older version than one seen before (a scan in flight across a read, a replica behind):
that only delays a takeover (a version is dated when the read or scan returned, so never before
it was written), or costs a takeover write that loses, being conditional on the version seen.

Leadership also expires on the holder's own monotonic clock, like a lease: ``is_leader`` is true
only until ``lease_duration`` after the start of the last write that renewed it. Another worker can
take over only after it has seen that write and waited ``lease_duration`` more, so a leader whose
loop stalls stops acting as leader no later than anyone else may start.

Every record states how long it lives (``lapses_after``, seconds) and whether its leader assigns
leases. Others judge it by the life it states (a record without one, written by an older
version, by their own ``lease_duration``), so a leader may change its record's life while it
leads: with ``lease_assignment = "auto"`` one that starts assigning leases renews every third of
``assigning_duration`` (a failover time) instead of ``lease_duration`` (three), and a dead
leader's own leases then move about as fast as any worker's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.port import CoordinationRecord, CoordinationStore, record_data

log = logging.getLogger(__name__)

LEADER_KEY = "shard-sync-leader"
# The leader record's data: how many seconds it lives without a renewal (older versions do not
# say); a larger figure is not believed.
LIFE = "lapses_after"
MAX_LIFE = 3600.0


@dataclass
class _Seen:
    version: int
    since: float  # monotonic time we first saw this version


class LeaderElection:
    """One worker per application leads shard sync. Call ``tick()`` periodically (thread-safe per
    instance only if one thread ticks); it returns whether this worker leads after the tick."""

    def __init__(
        self,
        store: CoordinationStore,
        worker_id: str,
        *,
        lease_duration: float,
        clock: Clock | None = None,
        key: str = LEADER_KEY,
        assigns: bool = False,
        assigning_duration: float | None = None,
        renew_at: float = 1 / 3,
        observed_max_age: float = 0.0,
    ) -> None:
        if lease_duration <= 0 or (assigning_duration is not None and assigning_duration <= 0):
            raise ValueError("lease_duration and assigning_duration must be > 0")
        if not 0 < renew_at <= 0.5:
            raise ValueError("renew_at must be within (0, 0.5]")
        self._store = store
        self._worker_id = worker_id
        self._duration = lease_duration  # our record's life while we do not assign
        self._assigning_duration = assigning_duration or lease_duration  # ... while we do
        self._written_life = lease_duration  # the life our last winning write stated
        self._written_at = float("-inf")  # monotonic: when that write started
        # How old (a fraction of its life) a record that does not say it assigns gets before we
        # renew it; one that does: a third.
        self._renew_at = renew_at
        self._other_life = lease_duration  # the life the other leader's record states
        self._clock = clock or SystemClock()
        self._key = key
        self._seen: _Seen | None = None
        self._leading = False
        self._leading_until = float("-inf")  # monotonic: our last renewing write's start + duration
        self._later: dict[str, object] = {}  # data for the next renewal (note_later)
        # Guards _later and _observed, never held across a request (note_later and observe are
        # called on the event loop).
        self._later_lock = threading.Lock()
        self._mine: CoordinationRecord | None = None  # the record as we last wrote it
        self._other: str | None = None  # the record's owner at our last read, if not us
        # Written into every record of ours: whether this leader assigns leases (lease_assignment
        # = "leader", or "auto" and the fleet is large: set_assigns); read from another's, so
        # that workers follow only a leader that assigns (a fleet changing the setting).
        self._assigns = assigns  # guarded by _later_lock: set on the event loop
        self._configured_assigns = assigns  # what a worker that does not lead goes back to
        self.other_assigns = False
        self._resigned = False  # for good: this worker is stopping
        self._observed_max_age = observed_max_age
        # The record as a scan saw it and when the scan returned (monotonic); guarded by
        # _later_lock (observe runs on the event loop, tick on a thread).
        self._observed: tuple[CoordinationRecord | None, float] | None = None
        self._read_at = float("-inf")  # when our last own read of the record returned
        # tick, note and resign may run in different threads of one worker; serialized here so
        # they never make each other's conditional writes lose.
        self._lock = threading.RLock()

    @property
    def is_leader(self) -> bool:
        """True while our leadership is renewed, judged on our own monotonic clock."""
        return self._leading and self._clock.monotonic() < self._leading_until

    @property
    def assigning(self) -> bool:
        """We lead and our record, as last written, says we assign leases (the others follow
        only from then on)."""
        return self.is_leader and _assigns(self._mine)

    @property
    def wants_assigns(self) -> bool:
        """Whether our next write will say we assign leases."""
        return self._assigns

    def set_assigns(self, assigns: bool) -> None:
        """Whether our record says we assign leases (and lives ``assigning_duration``) from our
        next write on; only while we lead (losing leadership resets it to the configured
        value, so a worker that comes to lead again says what its scans decide, not what
        they decided before)."""
        with self._later_lock:
            if self._leading or not assigns:
                self._assigns = assigns

    def tick_interval(self) -> float:
        """How long until the next tick: a sixth of our record's life while we lead (the
        shorter of the life written and the life wanted; a tick writes only when the record
        is due, so a write that failed is tried again a sixth of its life later), else a third
        of the life the leader's record states (a worker led by a leader that assigns notices
        within a third of a failover time that it stopped renewing)."""
        if self._leading:
            return min(self._written_life, self._life_for(self._assigns)) / 6
        return (self._other_life if self._other is not None else self._duration) / 3

    def _life_for(self, assigns: bool) -> float:
        return self._assigning_duration if assigns else self._duration

    def led_by(self) -> str | None:
        """Another worker that leads, as far as we can tell: the record's owner at our last
        read, whose version we saw move within the life its record states (on our clock)."""
        seen, other = self._seen, self._other
        if self._leading or other is None or seen is None:
            return None
        return other if self._clock.monotonic() - seen.since <= self._other_life else None

    def _record(self, version: int, data: dict[str, object] | None = None) -> CoordinationRecord:
        assigns = self._assigns  # read once: the flag and the life it implies agree
        return CoordinationRecord(
            key=self._key,
            owner=self._worker_id,
            version=version,
            expires_at=self._clock.wall() + self._life_for(assigns),
            # Our id, not a flag: an older version leading after us carries the data forward
            # unchanged, and must not look as if it assigned.
            data=record_data(
                {
                    **(data or {}),
                    "assigns": self._worker_id if assigns else None,
                    LIFE: self._life_for(assigns),
                }
            ),
        )

    def _set_leading(self, leading: bool, reason: str, since: float | None = None) -> bool:
        """Record the outcome of a tick; ``since``: when the write that won it started."""
        if leading and since is not None:
            self._leading_until = since + self._written_life
        if not leading:
            with self._later_lock:
                self._assigns = self._configured_assigns
        if leading != self._leading:
            log.info(
                "worker %s %s shard-sync leadership (%s)",
                self._worker_id,
                "takes" if leading else "loses",
                reason,
            )
        self._leading = leading
        return leading

    def tick(self) -> bool:
        with self._lock:
            if self._resigned:
                return False  # a tick queued before the stop must not take leadership back
            return self._tick()

    def _tick(self) -> bool:
        now = self._clock.monotonic()
        mine = self._mine
        if mine is not None and self._leading and not self._due(mine, now):
            return self.is_leader  # written lately, as we want it: nothing to do
        if mine is not None and self._renew(mine, now):
            return self._set_leading(True, "renewed", now)  # one write: nobody wrote since
        current, seen_at = self._look(now)
        self._other = None if current is None or current.owner == self._worker_id else current.owner
        self.other_assigns = self._other is not None and _assigns(current)
        self._other_life = _life(current, self._duration)
        if current is None:
            won = self._put(self._record(1), None, now)
            return self._set_leading(won, "no leader yet", now)
        if self._seen is None or self._seen.version != current.version:
            self._seen = _Seen(current.version, seen_at)
        if current.owner == self._worker_id:
            won = self._renew(current, now)
            return self._set_leading(won, "renewed" if won else "renewal lost", now)
        stale = current.owner is None or now - self._seen.since > self._other_life
        if not stale:
            return self._set_leading(False, f"{current.owner} leads")
        won = self._put(self._record(current.version + 1), current.version, now)
        return self._set_leading(won, f"previous leader {current.owner} expired", now)

    def _due(self, mine: CoordinationRecord, now: float) -> bool:
        """Whether our record is to be written now: it is old enough (a third of its life if it
        says we assign, else ``renew_at``), or what it says about assigning is not what we
        want (a switch is written at once)."""
        says = _assigns(mine)
        if says != self._assigns:
            return True
        at = self._written_life * (1 / 3 if says else self._renew_at)
        return now - self._written_at >= at - self._written_life / 12  # half a tick early: due

    def _look(self, now: float) -> tuple[CoordinationRecord | None, float]:
        """The record and when it was read (monotonic, after the read: a version seen then was
        written before): from a recent scan if there is one, else read now."""
        with self._later_lock:
            observed = self._observed
        if observed is not None:
            at = observed[1]
            # Not older than a third of the life the leader's record states (a leader that
            # assigns: one failover time), whatever the setting.
            max_age = min(self._observed_max_age, self._other_life / 3)
            if at > self._read_at and now - at <= max_age:
                return observed  # returned after our last read
        # Eventually consistent: a version seen late only delays a takeover (module docstring).
        current = self._store.get_record(self._key, consistent=False)
        self._read_at = self._clock.monotonic()
        return current, self._read_at

    def observe(self, records: Iterable[CoordinationRecord], returned_at: float) -> None:
        """The coordination records of a scan that returned at ``returned_at`` (monotonic): the
        next ticks within ``observed_max_age`` judge from them (none: nobody leads)."""
        if self._observed_max_age > 0:
            record = next((r for r in records if r.key == self._key), None)
            with self._later_lock:
                self._observed = (record, returned_at)

    def _renew(self, current: CoordinationRecord, now: float) -> bool:
        """Write our record over ``current`` (ours), with the notes for it; True if won."""
        with self._later_lock:
            later = dict(self._later)
        data = {**json.loads(current.data or "{}"), **later}
        won = self._put(self._record(current.version + 1, data), current.version, now)
        if won:
            with self._later_lock:
                for key in later:
                    if self._later.get(key) is later[key]:
                        del self._later[key]
        return won

    def _put(self, record: CoordinationRecord, expected: int | None, now: float) -> bool:
        """A conditional write of the leader record; remembers it when it wins, so the next
        renewal needs no read (it is conditional on this version: it loses if anyone wrote)."""
        if self._leading:  # a shorter life counts from now, whether or not we learn we won
            self._leading_until = min(self._leading_until, now + _life(record, self._duration))
        try:
            won = self._store.put_record(record, expected_version=expected)
        except BaseException:
            self._written_at = float("-inf")  # it may have landed: due again at the next tick
            raise
        self._mine = record if won else None
        if won:
            self._seen = _Seen(record.version, now)
            self._written_life = _life(record, self._duration)
            self._written_at = now
        return won

    def resign(self) -> None:
        """Give leadership up at once (graceful shutdown) so another worker need not wait."""
        with self._lock:
            self._resign()

    def _resign(self) -> None:
        self._resigned = True
        current = self._store.get_record(self._key)
        if current is not None and current.owner == self._worker_id:
            released = CoordinationRecord(
                key=self._key,
                owner=None,
                version=current.version + 1,
                expires_at=self._clock.wall(),
                data=current.data,
            )
            self._store.put_record(released, expected_version=current.version)
        self._set_leading(False, "resigned")
        with self._later_lock:
            self._later.clear()
        self._mine = None

    def note_later(self, **data: object) -> None:
        """Merge ``data`` into the record with our next renewal (no request of its own); dropped
        when we resign. Never waits for a request in flight (safe on the event loop)."""
        with self._later_lock:
            self._later.update(data)


def _life(record: CoordinationRecord | None, default: float) -> float:
    """How long a leader record lives without a renewal, as it states (``default`` if it does
    not, or states nonsense)."""
    if record is None:
        return default
    try:
        life = json.loads(record.data or "{}").get(LIFE)
    except (ValueError, AttributeError):
        return default
    ok = isinstance(life, int | float) and not isinstance(life, bool) and 0 < life <= MAX_LIFE
    return float(life) if ok else default


def _assigns(record: CoordinationRecord | None) -> bool:
    """Whether a leader record says its leader assigns leases: it names its own owner (older
    versions write nothing there, or carry forward what an earlier leader wrote)."""
    if record is None or record.owner is None:
        return False
    try:
        data = json.loads(record.data or "{}")
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("assigns") == record.owner
