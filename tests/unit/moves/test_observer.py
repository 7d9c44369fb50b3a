"""LeaseObserver: expiry judged only from when this worker saw each lease counter change."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import ConfigError
from checkpoint.lease import Lease, WriteStamp
from checkpoint.leasing import LeaseTiming
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.moves.rules import LeaseObserver, ObservedScan

TIMING = LeaseTiming(failover=10.0)
DURATION = TIMING.lease_duration


def lease(key: str, owner: str | None = None, counter: int = 1, *, done: bool = False) -> Lease:
    return Lease(key, SHARD_END if done else TRIM_HORIZON, lease_owner=owner, lease_counter=counter)


def by_key(scan: ObservedScan) -> dict[str, tuple[bool, bool, bool]]:
    return {o.key: (o.expired, o.very_old, o.available) for o in scan.leases}


def test_first_sight_unowned_is_never_renewed_and_owned_is_renewed_now() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    scan = observer.observe([lease("free"), lease("held", "a")], clock.monotonic())
    # (expired, very_old, available)
    assert by_key(scan) == {"free": (True, True, True), "held": (False, False, False)}
    assert observer.last_change("free") is None
    assert observer.last_change("held") == clock.monotonic()
    assert scan.owner_counts == {"a": 1}


def test_expiry_needs_more_than_a_lease_duration_without_a_counter_change() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a", 5)], clock.monotonic())
    clock.advance(DURATION)
    assert by_key(observer.observe([lease("s", "a", 5)], clock.monotonic()))["s"][0] is False
    clock.advance(0.001)
    scan = observer.observe([lease("s", "a", 5)], clock.monotonic())
    assert by_key(scan)["s"] == (True, False, True)
    assert scan.owner_counts == {}  # an expired lease's owner is no longer counted as a worker


def test_a_counter_change_resets_the_timer() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a", 1)], clock.monotonic())
    for counter in range(2, 8):
        clock.advance(DURATION * 0.9)
        scan = observer.observe([lease("s", "a", counter)], clock.monotonic())
        assert by_key(scan)["s"] == (False, False, False)
        assert scan.leases[0].last_change == clock.monotonic()
    clock.advance(DURATION * 0.9)  # unchanged now: 0.9 + 0.9 durations since the last change
    scan = observer.observe([lease("s", "a", 7)], clock.monotonic())
    assert by_key(scan)["s"] == (False, False, False)
    clock.advance(DURATION * 0.2)
    assert by_key(observer.observe([lease("s", "a", 7)], clock.monotonic()))["s"][0] is True


def test_very_old_after_three_lease_durations() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a")], clock.monotonic())
    clock.advance(3 * DURATION)
    assert by_key(observer.observe([lease("s", "a")], clock.monotonic()))["s"] == (
        True,
        False,
        True,
    )
    clock.advance(0.001)
    assert by_key(observer.observe([lease("s", "a")], clock.monotonic()))["s"] == (True, True, True)


def test_an_unowned_lease_seen_changing_is_available_but_not_very_old() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a", 1)], clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe([lease("s", None, 2)], clock.monotonic())  # released by its owner
    assert by_key(scan)["s"] == (False, False, True)
    assert scan.owner_counts == {}


def test_vanished_leases_are_forgotten() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a", 3)], clock.monotonic())
    observer.observe([], clock.monotonic())
    assert observer.last_change("s") is None
    clock.advance(DURATION * 0.5)
    scan = observer.observe([lease("s", "a", 3)], clock.monotonic())
    assert scan.leases[0].last_change == clock.monotonic()  # first sight again


def test_shard_end_leases_are_finished_and_not_counted() -> None:
    observer = LeaseObserver(TIMING)
    scan = observer.observe(
        [lease("done", "a", done=True), lease("old-done", done=True), lease("live", "a")], 0.0
    )
    assert [o.key for o in scan.leases] == ["live"]
    assert sorted(x.lease_key for x in scan.finished) == ["done", "old-done"]
    assert scan.total == 1
    assert scan.owner_counts == {"a": 1}
    assert scan.very_old == ()


def test_counts_are_per_live_owner() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    leases = [lease(f"a{i}", "a") for i in range(3)] + [lease("b0", "b"), lease("free")]
    scan = observer.observe(leases, clock.monotonic())
    assert scan.owner_counts == {"a": 3, "b": 1}
    assert scan.count("a") == 3 and scan.count("nobody") == 0
    assert [o.key for o in scan.held_by("b")] == ["b0"]
    assert [o.key for o in scan.available] == ["free"]


def test_our_own_write_is_remembered_with_its_time() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", None, 1)], clock.monotonic())
    clock.advance(2.0)
    taken = lease("s", "me", 2)
    observer.record_write(taken, clock.monotonic())
    clock.advance(DURATION)
    scan = observer.observe([taken], clock.monotonic())
    assert scan.leases[0].last_change == clock.monotonic() - DURATION
    assert by_key(scan)["s"] == (False, False, False)


def test_a_lease_passing_between_owners_is_noted_for_the_previous_owner() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "me", 1), lease("t", "me", 1)], clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe([lease("s", "thief", 2), lease("t", None, 2)], clock.monotonic())
    taken_at = clock.monotonic()
    assert scan.taken_from == {"me": taken_at}  # the release of "t" is not a take
    clock.advance(TIMING.steal_cooldown - 0.001)
    assert observer.observe([], clock.monotonic()).taken_from == {"me": taken_at}
    clock.advance(0.002)
    assert observer.observe([], clock.monotonic()).taken_from == {}  # pruned after the cooldown


def test_forget_drops_all_memory() -> None:
    observer = LeaseObserver(TIMING)
    observer.observe([lease("s", "a")], 0.0)
    observer.forget()
    scan = observer.observe([lease("s", "a")], 50.0)
    assert scan.leases[0].last_change == 50.0


def test_wall_clock_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_wall_clock() -> float:
        raise AssertionError("the observer read a clock")

    monkeypatch.setattr(time, "time", no_wall_clock)
    monkeypatch.setattr(time, "monotonic", no_wall_clock)
    observer = LeaseObserver(TIMING)
    parked = replace(lease("p", "a"), closed_until=1.0)  # a wall-clock field: ignored here
    observer.observe([parked, lease("s", "a")], 100.0)
    scan = observer.observe([parked, lease("s", "a")], 100.0 + DURATION + 1)
    assert all(o.expired for o in scan.leases)


def test_sub_sequence_checkpoints_are_not_shard_end() -> None:
    observer = LeaseObserver(TIMING)
    mid = Lease("s", ExtendedSequenceNumber("123", 4), lease_owner="a", lease_counter=1)
    assert observer.observe([mid], 0.0).total == 1


def test_lease_timing_follows_the_kcls_formulas() -> None:
    timing = LeaseTiming.from_failover_millis(10_000)
    assert timing.lease_duration == 10.0
    assert timing.renew_interval == pytest.approx(3.30833, abs=1e-5)  # the KCL's 3308 ms
    assert timing.take_interval == pytest.approx(5.51375)  # 0.275x the KCL's 20 050 ms
    assert timing.renewal_period == 5.0 and timing.renew_round_interval == pytest.approx(10 / 12)
    kcl = LeaseTiming(failover=10.0, take_interval_multiplier=2.0)
    assert kcl.take_interval == pytest.approx(20.05)  # the KCL's 20 050 ms
    assert timing.very_old == 30.0
    assert timing.steal_cooldown == pytest.approx(11.0275)
    assert timing.leader_duration == 30.0  # the shard-sync leader's record (KCL 3.x lock: 120 s)
    assert timing.leader_renew_interval == 10.0  # (KCL 3.x heartbeat: 30 s)
    assert LeaseTiming.from_failover_millis(60_000, epsilon_millis=0).renew_interval == 20.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failover": 0.0},
        {"failover": float("nan")},
        {"failover": 0.07},  # failover/3 - 0.025 <= 0
        {"failover": 10.0, "epsilon": -1.0},
        {"failover": 10.0, "very_old_multiplier": 0.5},
        {"failover": 10.0, "steal_cooldown_intervals": -1.0},
        {"failover": 10.0, "max_clock_skew": -0.5},
        {"failover": 10.0, "max_clock_skew": float("inf")},
    ],
)
def test_lease_timing_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        LeaseTiming(**kwargs)


def test_a_handoff_begun_is_a_move_though_the_counter_did_not_change() -> None:
    """initiate_handoff renames the owner without a counter change: still a lease taken from
    the old owner (the steal cooldown's input), and the expiry clock keeps running."""
    clock = ManualClock()
    observer = LeaseObserver(LeaseTiming(failover=10.0, steal_cooldown_intervals=2.0))
    observer.observe([lease("s", "a", 5)], clock.monotonic())
    clock.advance(3.0)
    pending = replace(lease("s", "b", 5), checkpoint_owner="a")
    scan = observer.observe([pending], clock.monotonic())
    assert scan.taken_from == {"a": clock.monotonic()}
    assert scan.leases[0].last_change == clock.monotonic() - 3.0


# -- write stamps ---------------------------------------------------------------------------------

SKEW = TIMING.max_clock_skew  # 1 s
WALL = 1_700_000_000.0  # our wall clock at monotonic 1,000 (ManualClock's start)


def stamped(key: str, owner: str | None, counter: int, at: float | None) -> Lease:
    """A lease whose counter ``counter`` was written at wall time ``at`` (None: not stamped)."""
    written = None if at is None else WriteStamp(counter, at)
    return replace(lease(key, owner, counter), written=written)


@pytest.mark.parametrize(
    ("before", "written_ago", "stamp_counter", "expected_since"),
    [
        # First sight, owned: dated by its stamp plus the skew allowed.
        (None, 5.0, 7, 1_000.0 - 5.0 + SKEW),
        (None, 30.0, 7, 1_000.0 - 30.0 + SKEW),  # a long-dead owner: expired at first sight
        (None, -4.0, 7, 1_000.0),  # stamped in our future (a clock ahead): never after now
        (None, 5.0, 6, 1_000.0),  # the stamp names an older counter (a KCL write): now
        (None, None, 7, 1_000.0),  # not stamped: now, as the KCL
        # Counter moved since a scan at 997 saw counter 6: never dated before that scan.
        (997.0, 2.0, 7, 1_000.0 - 2.0 + SKEW),
        (997.0, 8.0, 7, 997.0),
    ],
)
def test_a_counter_change_is_dated_by_its_stamp_within_what_was_seen(
    before: float | None, written_ago: float | None, stamp_counter: int, expected_since: float
) -> None:
    observer = LeaseObserver(TIMING)
    if before is not None:
        observer.observe([lease("s", "a", 6)], before, WALL - (1_000.0 - before))
    at = None if written_ago is None else WALL - written_ago
    current = replace(
        lease("s", "a", 7), written=None if at is None else WriteStamp(stamp_counter, at)
    )
    scan = observer.observe([current], 1_000.0, WALL)
    assert scan.leases[0].last_change == pytest.approx(expected_since)
    assert scan.leases[0].expired is (1_000.0 - expected_since > DURATION)


def test_stamps_are_ignored_without_our_wall_clock() -> None:
    observer = LeaseObserver(TIMING)
    scan = observer.observe([stamped("s", "a", 7, WALL - 30.0)], 1_000.0)
    assert scan.leases[0].last_change == 1_000.0 and not scan.leases[0].expired


def test_a_dead_owners_lease_is_due_a_look_when_its_last_write_expires() -> None:
    """The failover path: one scan sees the last write; the look at its expiry finds it unchanged
    and the lease expired, though no scan came in between."""
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe(
        [stamped("theirs", "a", 7, clock.wall() - 1.0), stamped("mine", "me", 3, clock.wall())],
        clock.monotonic(),
        clock.wall(),
    )
    written = clock.monotonic() - 1.0
    assert observer.next_check("me") == pytest.approx(written + SKEW + DURATION)
    clock.advance(DURATION - 1.0 + SKEW)  # exactly at the expiry: not past it
    assert observer.due(clock.monotonic(), "me") == []
    clock.advance(0.01)
    assert observer.due(clock.monotonic(), "me") == ["theirs"]  # never our own lease
    unchanged = stamped("theirs", "a", 7, clock.wall() - DURATION - 1.01)
    assert observer.look_again("theirs", unchanged, clock.monotonic(), clock.wall()) is True
    assert observer.next_check("me") is None and observer.due(clock.monotonic(), "me") == []
    scan = observer.observe([unchanged], clock.monotonic(), clock.wall())
    assert scan.leases[0].available and scan.leases[0].expired


def test_a_look_that_finds_a_newer_write_moves_the_next_check() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([stamped("s", "a", 7, clock.wall())], clock.monotonic(), clock.wall())
    clock.advance(DURATION + SKEW + 0.01)
    renewed = stamped("s", "a", 8, clock.wall() - 2.0)  # written 2 s before our look
    assert observer.look_again("s", renewed, clock.monotonic(), clock.wall()) is False
    assert observer.next_check("other") == pytest.approx(clock.monotonic() - 2.0 + SKEW + DURATION)
    assert observer.due(clock.monotonic(), "other") == []


@pytest.mark.parametrize(
    ("found", "expired"),
    [(None, False), (stamped("s", None, 8, None), True)],
    ids=["deleted", "released"],
)
def test_a_look_at_a_deleted_or_released_lease(found: Lease | None, expired: bool) -> None:
    """Deleted: forgotten, nothing to take. Released (unowned): free now, so take at once."""
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    observer.observe([stamped("s", "a", 7, clock.wall())], clock.monotonic(), clock.wall())
    clock.advance(DURATION + SKEW + 0.01)
    assert observer.look_again("s", found, clock.monotonic(), clock.wall()) is expired
    assert observer.next_check("other") is None


def test_expired_finished_and_unowned_leases_are_not_watched() -> None:
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    leases = [
        stamped("old", "a", 7, clock.wall() - 60.0),  # expired already: the scan decides
        replace(stamped("done", "a", 7, clock.wall()), checkpoint=SHARD_END),
        stamped("free", None, 7, clock.wall()),
    ]
    observer.observe(leases, clock.monotonic(), clock.wall())
    assert observer.next_check("me") is None
    clock.advance(DURATION * 5)
    assert observer.due(clock.monotonic(), "me") == []


def test_leases_coming_and_going_are_dated_per_worker_for_the_cpu_rule() -> None:
    """moved_at: the workers a lease came to or left (owner, or the worker processing it), at the
    scan that saw it; every holder at the first scan (nothing is known of what just moved); both
    sides of a pending handoff at every scan; our own takes when we write them; a lease gone
    from the scan; kept for cpu_move_memory."""
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    first = observer.observe([lease("s", "a", 1), lease("t", None, 1)], clock.monotonic())
    assert first.moved_at == {"a": clock.monotonic()}  # an empty memory: every holder dated
    clock.advance(1.0)
    scan = observer.observe([lease("s", "b", 2), lease("t", "c", 2)], clock.monotonic())
    at = clock.monotonic()
    assert scan.moved_at == {"a": at, "b": at, "c": at}
    clock.advance(1.0)
    done = observer.observe([lease("s", "b", 3), lease("t", "c", 3)], clock.monotonic())
    assert done.moved_at == {"a": at, "b": at, "c": at}  # renewals move nothing
    clock.advance(1.0)
    handing = replace(lease("s", "d", 3), checkpoint_owner="b")  # begun: d owns, b processes
    begun = observer.observe([handing, lease("t", "c", 4)], clock.monotonic())
    assert begun.moved_at["d"] == begun.moved_at["b"] == clock.monotonic()
    clock.advance(1.0)
    still = observer.observe([handing, lease("t", "c", 5)], clock.monotonic())
    assert still.moved_at["d"] == still.moved_at["b"] == clock.monotonic()  # pending: again
    clock.advance(1.0)
    completed = observer.observe([lease("s", "d", 4), lease("t", "c", 6)], clock.monotonic())
    assert completed.moved_at["b"] == completed.moved_at["d"] == clock.monotonic()
    clock.advance(1.0)
    observer.record_write(lease("t", "me", 7), clock.monotonic())  # we took it ourselves
    taken = observer.observe([lease("s", "d", 5), lease("t", "me", 7)], clock.monotonic() + 0.5)
    assert taken.moved_at["me"] == taken.moved_at["c"] == clock.monotonic()
    clock.advance(TIMING.cpu_move_memory + 1.0)
    parked = observer.observe([lease("s", "d", 5)], clock.monotonic())  # "t" gone: parked
    assert parked.moved_at == {"me": clock.monotonic()}
    clock.advance(TIMING.cpu_move_memory + 1.0)
    assert observer.observe([lease("s", "d", 5)], clock.monotonic()).moved_at == {}  # pruned


def test_a_pending_handoff_dates_both_sides_until_it_ends_unless_the_shard_is_done() -> None:
    observer = LeaseObserver(TIMING)
    pending = replace(lease("s", "new", 3), checkpoint_owner="old")
    assert observer.observe([pending], 5.0).moved_at == {"new": 5.0, "old": 5.0}
    assert observer.observe([pending], 6.0).moved_at == {"new": 6.0, "old": 6.0}
    stuck = replace(lease("s", "new", 3, done=True), checkpoint_owner="old")
    assert observer.observe([stuck], 7.0).moved_at == {"new": 6.0, "old": 6.0}  # finished
