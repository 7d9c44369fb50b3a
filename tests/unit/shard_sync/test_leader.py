"""Leader election over the coordination record, driven by a manual clock (no sleeps)."""

from __future__ import annotations

import json

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.port import CoordinationRecord
from checkpoint.stores.memory import MemoryLeaseTable
from shard_sync.leader import LEADER_KEY, LIFE, LeaderElection


def _pair(
    duration: float = 10.0,
) -> tuple[MemoryLeaseTable, ManualClock, LeaderElection, LeaderElection]:
    store = MemoryLeaseTable()
    clock = ManualClock()
    a = LeaderElection(store, "A", lease_duration=duration, clock=clock)
    b = LeaderElection(store, "B", lease_duration=duration, clock=clock)
    return store, clock, a, b


def test_first_worker_leads_and_second_does_not() -> None:
    store, _, a, b = _pair()
    assert a.tick() is True
    assert b.tick() is False
    record = store.get_record(LEADER_KEY)
    assert record is not None and record.owner == "A"


def test_live_leader_keeps_leading_while_renewing() -> None:
    _, clock, a, b = _pair()
    a.tick()
    for _ in range(20):
        clock.advance(3.0)
        assert a.tick() is True
        assert b.tick() is False


def test_dead_leader_is_replaced_after_lease_duration_only() -> None:
    _, clock, a, b = _pair(duration=10.0)
    a.tick()
    assert b.tick() is False  # B first sees version 1 now
    clock.advance(9.0)
    assert b.tick() is False  # not yet expired on B's clock
    clock.advance(1.5)
    assert b.tick() is True  # A never renewed: B takes over
    # The old leader notices it lost on its next tick and does not fight back.
    assert a.tick() is False
    assert b.tick() is True


def test_only_one_leader_at_any_tick() -> None:
    _, clock, a, b = _pair(duration=5.0)
    leaders = []
    for step in range(50):
        clock.advance(1.0)
        ticks = [a.tick(), b.tick()] if step % 2 else [b.tick(), a.tick()]
        leaders.append(sum(ticks))
    assert max(leaders) == 1
    assert min(leaders) == 1


def test_resign_hands_over_at_once() -> None:
    _, _, a, b = _pair()
    a.tick()
    b.tick()
    a.resign()
    assert a.is_leader is False
    assert b.tick() is True


def test_a_note_is_written_with_the_next_renewal_and_only_by_the_leader() -> None:
    store, clock, a, b = _pair()
    a.tick()
    b.tick()
    a.note_later(last_sync=123.0)
    b.note_later(last_sync=999.0)
    record = store.get_record(LEADER_KEY)
    assert record is not None and "last_sync" not in record.data  # no request of its own
    clock.advance(3.4)
    a.tick()
    b.tick()
    record = store.get_record(LEADER_KEY)
    assert record is not None and json.loads(record.data)["last_sync"] == 123.0
    a.note_later(other=1)
    clock.advance(3.4)
    a.tick()  # later renewals keep the data
    record = store.get_record(LEADER_KEY)
    assert record is not None and json.loads(record.data)["last_sync"] == 123.0
    assert json.loads(record.data)["other"] == 1


class _Loses(MemoryLeaseTable):
    """A store whose next ``lose`` put_record calls lose their condition; counts calls."""

    lose = 0
    gets = 0
    puts = 0

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        self.gets += 1
        return super().get_record(key)

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        self.puts += 1
        if self.lose:
            self.lose -= 1
            return False
        return super().put_record(record, expected_version)


def test_a_leader_renews_with_one_write_and_reads_only_after_losing_one() -> None:
    store = _Loses()
    clock = ManualClock()
    a = LeaderElection(store, "A", lease_duration=10.0, clock=clock)
    assert a.tick()
    assert (store.gets, store.puts) == (1, 1)
    for _ in range(10):
        clock.advance(10 / 6)
        assert a.tick()
    assert (store.gets, store.puts) == (1, 6)  # a write every other tick, on what it wrote last
    store.lose = 1  # a write lost (its outcome unknown, or someone wrote): read, then write
    clock.advance(3.4)
    assert a.tick()
    assert (store.gets, store.puts) == (2, 8)
    b = LeaderElection(store, "B", lease_duration=10.0, clock=clock)
    assert not b.tick()
    clock.advance(10.5)  # A stalls past its lease; B takes the record over
    assert b.tick()
    puts = store.puts
    assert not a.tick()  # A's write on the version it wrote loses; it reads, sees B, stays out
    assert store.puts == puts + 1
    assert not a.tick()
    assert store.puts == puts + 1  # and writes no more


def test_a_resigned_leader_never_takes_the_record_back() -> None:
    _, _, a, b = _pair()
    a.tick()
    a.resign()
    assert a.tick() is False  # a tick queued before the stop ran after it
    assert b.tick() is True


def test_a_note_is_kept_while_a_renewal_fails_and_dropped_on_resigning() -> None:
    store, clock = _Loses(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=10.0, clock=clock)
    a.tick()
    a.note_later(last_sync=1.0)
    store.lose = 2
    clock.advance(3.4)
    assert a.tick() is False  # both writes lost their condition: the note waits
    assert a.tick() is True
    record = store.get_record(LEADER_KEY)
    assert record is not None and json.loads(record.data)["last_sync"] == 1.0
    a.note_later(last_sync=2.0)
    a.resign()
    assert b_takes(store)
    record = store.get_record(LEADER_KEY)
    assert record is not None and "2.0" not in record.data


def b_takes(store: MemoryLeaseTable) -> bool:
    """Another worker takes the record (it has no owner after a resignation)."""
    return LeaderElection(store, "B", lease_duration=10.0, clock=ManualClock()).tick()


def test_a_stalled_leader_stops_leading_on_its_own_clock_before_anyone_can_take_over() -> None:
    """Issue 14, finding 7: leadership was a cached flag; a leader whose loop stalled went on
    acting as leader after another took over."""
    _, clock, a, b = _pair(duration=10.0)
    assert a.tick() is True and a.is_leader
    assert b.tick() is False  # B sees A's version now
    clock.advance(9.9)
    assert a.is_leader  # renewed 9.9 s ago: still within the lease
    clock.advance(0.2)  # A's loop stalled: no tick for 10.1 s
    assert not a.is_leader  # expired on A's own clock...
    assert b.tick() is True  # ...no later than B may take over
    assert not a.is_leader
    assert a.tick() is False  # and a late tick does not bring it back


def test_leadership_is_extended_by_every_renewal() -> None:
    _, clock, a, _ = _pair(duration=10.0)
    a.tick()
    for _ in range(5):
        clock.advance(6.0)
        a.note_later(last_sync=clock.wall())
        assert a.tick()
        assert a.is_leader
    clock.advance(10.5)
    assert not a.is_leader


def test_a_note_never_waits_for_a_request_in_flight() -> None:
    """note_later is called on the event loop: it must not queue behind a tick's slow write."""
    import threading

    entered, release = threading.Event(), threading.Event()

    class Slow(MemoryLeaseTable):
        def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
            entered.set()
            release.wait(60)  # set once the note is done: a note behind it waits the minute
            return super().put_record(record, expected_version)

    a = LeaderElection(Slow(), "A", lease_duration=10.0, clock=ManualClock())
    ticking = threading.Thread(target=a.tick)
    ticking.start()
    assert entered.wait(5)
    done = threading.Event()
    threading.Thread(target=lambda: (a.note_later(last_sync=1.0), done.set())).start()
    try:
        assert done.wait(30.0)  # while the tick's write is still in flight
    finally:
        release.set()
    ticking.join(5)


def test_led_by_names_a_live_leader_only() -> None:
    _, clock, a, b = _pair(duration=10.0)
    assert b.led_by() is None  # never looked
    a.tick()
    b.tick()
    assert b.led_by() == "A" and a.led_by() is None  # a leader is led by nobody
    clock.advance(5.0)
    a.tick()
    b.tick()
    clock.advance(9.0)
    assert b.led_by() == "A"  # seen moving 9 s ago
    clock.advance(1.5)
    assert b.led_by() is None  # not seen moving for a lease duration: nobody leads
    a.resign()
    clock.advance(0.1)
    b.tick()
    assert b.is_leader and b.led_by() is None  # it took the released record


def test_a_leader_record_says_whether_its_leader_assigns() -> None:
    store, clock = MemoryLeaseTable(), ManualClock()
    old = LeaderElection(store, "A", lease_duration=10.0, clock=clock)  # lease_assignment worker
    new = LeaderElection(store, "B", lease_duration=10.0, clock=clock, assigns=True)
    assert old.tick() and not new.tick()
    assert new.led_by() == "A" and new.other_assigns is False
    old.resign()
    assert new.tick()  # B leads now, and says it assigns
    c = LeaderElection(store, "C", lease_duration=10.0, clock=clock)
    assert not c.tick() and c.led_by() == "B" and c.other_assigns is True
    clock.advance(3.0)
    assert new.tick()  # renewed without a read: still says so
    assert not c.tick() and c.other_assigns is True


def test_an_older_leader_carrying_the_data_forward_does_not_look_as_if_it_assigned() -> None:
    store, clock = MemoryLeaseTable(), ManualClock()
    new = LeaderElection(store, "B", lease_duration=10.0, clock=clock, assigns=True)
    assert new.tick()
    record = store.get_record(LEADER_KEY)
    assert record is not None
    # An older version takes over: same data, its own id as owner.
    older = CoordinationRecord(LEADER_KEY, "OLD", record.version + 1, 0.0, record.data)
    assert store.put_record(older, record.version)
    c = LeaderElection(store, "C", lease_duration=10.0, clock=clock, assigns=True)
    assert not c.tick() and c.led_by() == "OLD" and c.other_assigns is False


def _scan(store: MemoryLeaseTable) -> tuple[CoordinationRecord, ...]:
    return store.scan_table("").records


def test_a_tick_judges_from_a_recent_scan_instead_of_reading() -> None:
    store = _Loses()
    clock = ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, observed_max_age=10.0)
    assert a.tick()
    assert not b.tick()  # nothing scanned yet: one read
    gets = store.gets
    for _ in range(6):  # A renews every 10 s; B's taker scans 3 s before each of B's ticks
        clock.advance(7.0)
        b.observe(_scan(store), clock.monotonic())
        clock.advance(3.0)
        assert a.tick()
        assert not b.tick()
        assert b.led_by() == "A"
    assert store.gets == gets  # every look came from a scan
    clock.advance(11.0)  # the last scan is older than observed_max_age: read
    assert not b.tick()
    assert store.gets == gets + 1


def test_a_leader_seen_only_in_scans_is_replaced_a_lease_duration_after_the_scan_that_saw_it() -> (
    None
):
    """Dated when the scan returned (after its read: the version was written before), never
    earlier; so nobody takes over before the dead leader's own leadership has lapsed."""
    store, clock, a, _ = _pair(duration=30.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, observed_max_age=10.0)
    assert a.tick()  # A's write starts now: it leads until now + 30
    clock.advance(2.0)
    b.observe(_scan(store), clock.monotonic())  # the scan that first shows A's version
    seen = clock.monotonic()
    while clock.monotonic() - seen <= 30.0:
        assert not b.tick()
        clock.advance(5.0)
        b.observe(_scan(store), clock.monotonic())
    assert not a.is_leader
    assert b.tick()  # A died after its first write: B takes over, by a conditional write


def test_a_scan_older_than_our_last_read_is_not_used() -> None:
    """An eventually consistent scan must not take a follower back to a version it read past."""
    store = _Loses()
    clock = ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, observed_max_age=10.0)
    a.tick()
    old, scanned = _scan(store), clock.monotonic()  # shows version 1
    clock.advance(10.0)
    a.tick()  # version 2
    assert not b.tick()  # no scan since: reads version 2
    clock.advance(1.0)
    b.observe(old, scanned)  # returned before that read
    gets = store.gets
    assert not b.tick()
    assert store.gets == gets + 1  # read again instead
    assert b._seen is not None and b._seen.version == 2


def test_without_observed_max_age_scans_are_ignored() -> None:
    store = _Loses()
    clock = ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock)
    a.tick()
    b.observe(_scan(store), clock.monotonic())
    gets = store.gets
    b.tick()
    assert store.gets == gets + 1


class _SlowReads(MemoryLeaseTable):
    """A store whose record reads take ``delay`` seconds of the manual clock."""

    def __init__(self, clock: ManualClock, delay: float) -> None:
        super().__init__()
        self._clock, self._delay = clock, delay

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        record = super().get_record(key)
        self._clock.advance(self._delay)
        return record


def test_a_version_is_dated_when_the_read_that_showed_it_returned() -> None:
    """A read that takes 4 s: the version it shows may have been written at its end, so B
    counts the lease duration from then, not from when its tick began."""
    clock = ManualClock()
    store = _SlowReads(clock, 4.0)
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock)
    assert a.tick()  # no record yet: A's first tick reads it (4 s), then writes
    assert not b.tick()  # B's read ends 4 s after it began: version 1 dated then
    returned = clock.monotonic()
    clock.advance(30.0 - 4.0 + 1.0)  # 31 s after B's tick began, 27 after its read returned
    assert not b.tick()  # not yet (dated from the tick's start, B would take over here)
    assert clock.monotonic() - returned > 30.0
    assert b.tick()  # the read of this tick ended past the duration: B takes over


def _life(store: MemoryLeaseTable) -> tuple[object, object]:
    record = store.get_record(LEADER_KEY)
    assert record is not None
    data = json.loads(record.data or "{}")
    return data.get("assigns"), data.get(LIFE)


def test_an_auto_leader_that_starts_assigning_states_a_shorter_life_from_its_next_write() -> None:
    """lease_assignment = "auto": three failover times while the leader only syncs shards, one
    once it assigns; it says it assigns only once its record does, and others judge each
    record by the life it states."""
    store, clock = MemoryLeaseTable(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    assert a.tick() and not b.tick()
    assert _life(store) == (None, 30.0) and a.tick_interval() == 5.0  # a sixth of its life
    assert b.tick_interval() == 10.0 and b.led_by() == "A" and not b.other_assigns
    a.set_assigns(True)
    assert not a.assigning  # not until its record says so
    clock.advance(10.0)
    assert a.tick() and a.assigning
    assert _life(store) == ("A", 10.0) and a.tick_interval() == pytest.approx(10 / 6)
    assert not b.tick() and b.other_assigns and b.tick_interval() == pytest.approx(10 / 3)
    # A dies: B takes over after the life the record states (10 s), not its own 30 s.
    clock.advance(9.9)
    assert not b.tick() and b.led_by() == "A"
    clock.advance(0.2)
    assert b.led_by() is None  # a led worker stops following: it takes for itself
    assert b.tick() and b.is_leader
    assert _life(store) == (None, 30.0)  # B does not assign until its own scans say so
    # and A, paused past its shorter life, no longer thinks it leads
    assert not a.is_leader and not a.assigning


def test_an_auto_leader_that_stops_assigning_goes_back_to_the_longer_life() -> None:
    store, clock = MemoryLeaseTable(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    assert a.tick()
    a.set_assigns(True)
    assert a.tick() and a.assigning and not b.tick() and b.other_assigns
    a.set_assigns(False)
    assert a.tick_interval() == pytest.approx(10 / 6)  # its record still lives 10 s
    clock.advance(1.0)
    assert a.tick() and not a.assigning and _life(store) == (None, 30.0)  # a switch: at once
    assert a.tick_interval() == 5.0
    assert not b.tick() and not b.other_assigns
    clock.advance(25.0)  # past the old life, within the new one: A still leads for everyone
    assert a.is_leader and not b.tick() and b.led_by() == "A"
    clock.advance(5.1)
    assert b.tick()  # 30 s without a renewal


def test_a_leader_writes_its_record_when_it_is_due_and_tries_a_failed_write_at_the_next_tick() -> (
    None
):
    """A record that lives three failover times (30 s) is renewed at half its life, from ticks
    every sixth of it; one that says its leader assigns (10 s), at a third."""
    store, clock = _Loses(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0,
                       renew_at=0.5)  # fmt: skip
    assert a.tick() and store.puts == 1
    for _ in range(5):  # 25 s at the pace it asks for: one write, at 15 s
        clock.advance(a.tick_interval())
        assert a.tick()
    assert store.puts == 2
    store.lose = 1
    clock.advance(a.tick_interval())  # 30 s: due again, and the write fails
    assert a.tick() is True  # it read the record: still its own, written over at once
    assert store.puts == 4
    a.set_assigns(True)
    assert a.tick() and store.puts == 5  # the switch is written at once
    for _ in range(6):  # 10 s: a write every second tick (3.3 s)
        clock.advance(a.tick_interval())
        assert a.tick()
    assert store.puts == 8


NONSENSE = ['{"lapses_after": "soon"}', '{"lapses_after": -1}', '{"lapses_after": 1e9}',
            '{"lapses_after": true}', "[1]"]  # fmt: skip


@pytest.mark.parametrize("data", [None, *NONSENSE])
def test_a_record_that_states_no_sensible_life_is_judged_by_our_own(data: str | None) -> None:
    """Records of older versions state none: each worker's own lease_duration applies."""
    store, clock = MemoryLeaseTable(), ManualClock()
    assert store.put_record(CoordinationRecord(LEADER_KEY, "OLD", 1, 0.0, data), None)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    assert not b.tick() and b.led_by() == "OLD" and b.tick_interval() == 10.0
    clock.advance(29.9)
    assert not b.tick()
    clock.advance(0.2)
    assert b.tick()


def test_a_wish_to_assign_needs_leadership_and_ends_with_it() -> None:
    store, clock = MemoryLeaseTable(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b.set_assigns(True)  # not leading: ignored
    assert a.tick() and not b.tick() and not b.wants_assigns
    a.set_assigns(True)
    assert a.tick() and a.assigning
    a.resign()
    assert not a.wants_assigns  # lost with the leadership
    assert b.tick() and not b.assigning and _life(store) == (None, 30.0)
    clock.advance(1.0)
    assert not a.tick() and _life(store) == (None, 30.0)


class LandsThenFails(MemoryLeaseTable):
    """A write whose outcome the caller never learns: it lands, then the call raises."""

    fail = False

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        won = super().put_record(record, expected_version)
        if self.fail:
            raise TimeoutError("no answer")
        return won


def test_a_shorter_life_written_with_an_unknown_outcome_ends_our_leadership_in_time() -> None:
    """A leader that wrote a 30 s life and then a 10 s one it never heard back about stops
    leading before another worker may take over on the 10 s record."""
    store, clock = LandsThenFails(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    assert a.tick() and not b.tick()
    a.set_assigns(True)
    clock.advance(10.0)
    store.fail = True
    with pytest.raises(TimeoutError):
        a.tick()
    assert not b.tick() and b.other_assigns  # B saw the 10 s record
    clock.advance(10.01)
    assert not a.is_leader  # before B may take over
    store.fail = False
    assert b.tick() and b.is_leader


def test_after_a_write_with_no_answer_the_next_tick_writes_again() -> None:
    """A write that timed out may have landed (with a shorter life): the record is due at once,
    whatever the last write known to have won."""
    store, clock = LandsThenFails(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0,
                       renew_at=0.5)  # fmt: skip
    assert a.tick()
    a.set_assigns(True)
    clock.advance(5.0)
    store.fail = True
    with pytest.raises(TimeoutError):
        a.tick()  # the 10 s record landed
    store.fail = False
    a.set_assigns(False)
    clock.advance(a.tick_interval())
    version = store.get_record(LEADER_KEY).version  # type: ignore[union-attr]
    assert a.tick()
    record = store.get_record(LEADER_KEY)
    assert record is not None and record.version == version + 1 and _life(store) == (None, 30.0)


def test_a_scan_older_than_a_third_of_the_leaders_stated_life_is_not_used() -> None:
    store, clock = _Loses(), ManualClock()
    a = LeaderElection(store, "A", lease_duration=30.0, clock=clock, assigning_duration=10.0)
    b = LeaderElection(store, "B", lease_duration=30.0, clock=clock, assigning_duration=10.0,
                       observed_max_age=10.0)  # fmt: skip
    assert a.tick()
    a.set_assigns(True)
    assert a.tick()
    assert not b.tick() and b.other_assigns  # a read: the leader assigns, its record lives 10 s
    clock.advance(0.5)
    b.observe(_scan(store), clock.monotonic())
    clock.advance(4.0)  # the scan is 4 s old: more than a third of 10 s
    gets = store.gets
    assert not b.tick()
    assert store.gets == gets + 1
