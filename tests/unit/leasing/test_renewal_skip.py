"""A checkpoint moves a lease's counter as a renewal does: a lease checkpointed lately skips that
round's renewal (``renewal_due``), with the bounds the rule promises."""

from __future__ import annotations

import random
import threading

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.leasing.renewal_rules import checkpoint_spared, renewal_due
from checkpoint.leasing.timing import RENEW_AFTER, LeaseTiming
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.moves.rules.observer import LeaseObserver

DURATION = 10.0
P = DURATION / 2  # how often renewals alone move the counter
G = DURATION / 12  # the holder's round interval
A = RENEW_AFTER * DURATION  # a lease is due once its counter is this old
KEY = "shardId-000000000000"


@pytest.mark.parametrize(
    ("now", "counter_moved", "renewed", "due", "why"),
    [
        (10.0, 10.0 - A, 10.0 - A, True, "renewed 0.44 duration ago, nothing since"),
        (10.0, 10.0 - A + 0.01, 10.0 - A + 0.01, False, "just under 0.44 duration ago"),
        (10.0, 10.0 - G, 10.0 - G, False, "renewed a round ago"),
        (10.0, 9.0, 10.0 - P, False, "checkpointed a second ago"),
        (10.0, 9.9, 10.0 - DURATION + G / 2 + 0.01, False, "checkpointed; renewed under 10 s ago"),
        (10.0, 9.9, 10.0 - DURATION + G / 2, True, "renewed a duration ago: due, checkpointed"),
        (10.0, 9.9, float("-inf"), True, "never renewed in this tenure (just taken)"),
    ],
)
def test_renewal_due(now: float, counter_moved: float, renewed: float, due: bool, why: str) -> None:
    assert renewal_due(now, counter_moved, renewed, DURATION) is due, why


@pytest.mark.parametrize(
    ("now", "counter_moved", "renewed", "spared"),
    [
        (10.0, 9.0, 10.0 - A, True),  # the round a renewal would have come: saved
        (10.0, 9.0, 10.0 - A - G + 0.01, True),  # still that round (within one round)
        (10.0, 9.0, 10.0 - A - G - 0.01, False),  # the round after: counted already
        (10.0, 9.0, 10.0 - A + 0.01, False),  # the round before: not due anyway
        (10.0, 10.0 - A, 10.0 - A, False),  # the counter last moved by the renewal itself
    ],
)
def test_checkpoint_spared(now: float, counter_moved: float, renewed: float, spared: bool) -> None:
    assert checkpoint_spared(now, counter_moved, renewed, DURATION) is spared


def test_one_skip_is_counted_per_renewal_saved() -> None:
    """Checkpoints every second: a renewal every 2P where an idle lease gets one every P, so one
    renewal saved (and one round reported skipped) per 2P."""
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    skipped = seq = 0
    for k in range(1, int(300 / G)):
        clock.advance(G)
        if k % int(1 / G + 1) == 0:  # about every second
            held = holder.get_if_held(KEY)
            assert held is not None
            seq += 1
            position = ExtendedSequenceNumber(str(seq))
            assert holder.update(
                KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)
            ).won
        skipped += len(holder.renew_all(wait=5).skipped)
    holder.close()
    assert 300 // (2 * P) - 1 <= skipped <= 300 // (2 * P) + 1
    assert 300 // (2 * P) <= table.renewals <= 300 // (2 * P) + 2


class CountingTable(MemoryLeaseTable):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.renewals = 0

    def renew_lease(self, lease: Lease) -> Lease | None:
        self.renewals += 1
        return super().renew_lease(lease)


def _taken(table: MemoryLeaseTable, holder: LeaseHolder) -> None:
    table.create_lease_if_absent(Lease(KEY, TRIM_HORIZON))
    current = table.get_lease(KEY)
    assert current is not None
    taken = table.take_lease(current, holder.worker_id)
    assert taken is not None
    holder.add_taken(taken)


START = 1000.0  # ManualClock's monotonic start; the times below count from it


def _run(skip: bool, checkpoint_every: float, seconds: float = 300.0) -> tuple[int, int, float]:
    """Rounds every ``round_interval`` and checkpoints every ``checkpoint_every`` s on a manual
    clock: the renewal writes, the checkpoint writes, and the longest time between two counter
    moves."""
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=skip)
    _taken(table, holder)
    every = holder.round_interval
    events = sorted(
        [(k * every + 0.3, "round") for k in range(int(seconds / every))]
        + [(k * checkpoint_every, "checkpoint") for k in range(1, int(seconds / checkpoint_every))]
    )
    checkpoints, last_move, longest, seq = 0, 0.0, 0.0, 0
    for at, what in events:
        clock.advance(at - (clock.monotonic() - START))
        before = table.get_lease(KEY)
        assert before is not None
        if what == "round":
            report = holder.renew_all(wait=5)
            assert report.lost == () and report.failed == {}
        else:
            held = holder.get_if_held(KEY)
            assert held is not None, f"lease lost at {at}"
            seq += 1
            position = ExtendedSequenceNumber(str(seq))
            result = holder.update(
                KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)
            )
            assert result.won
            checkpoints += 1
        after = table.get_lease(KEY)
        assert after is not None
        if after.lease_counter != before.lease_counter:
            longest, last_move = max(longest, at - last_move), at
    holder.close()
    return table.renewals, checkpoints, longest


def test_the_rounds_come_every_twelfth_of_the_duration_or_the_kcls_third() -> None:
    clock = ManualClock()
    lazy = LeaseHolder(MemoryLeaseTable(clock), "a", clock, DURATION, skip_checkpointed=True)
    kcl = LeaseHolder(MemoryLeaseTable(clock), "a", clock, DURATION, skip_checkpointed=False)
    assert lazy.round_interval == pytest.approx(G)
    assert kcl.round_interval == pytest.approx(LeaseTiming(failover=DURATION).renew_interval)
    lazy.close()
    kcl.close()


def test_a_lease_checkpointed_every_second_is_renewed_every_failover_time_only() -> None:
    renewals, checkpoints, _ = _run(skip=True, checkpoint_every=1.0)
    assert checkpoints == 299
    # The first round renews (a fresh tenure), then one every 2P (its figures).
    assert 300 // (2 * P) <= renewals <= 300 // (2 * P) + 2
    kcl, _, _ = _run(skip=False, checkpoint_every=1.0)
    assert kcl == int(300 / LeaseTiming(failover=DURATION).renew_interval)  # every KCL round


def test_an_idle_lease_is_renewed_every_half_failover_time() -> None:
    renewals, _, longest = _run(skip=True, checkpoint_every=1000.0)
    assert 300 // P - 1 <= renewals <= 300 // P + 1  # 60, where the KCL's rounds make 90
    assert longest == pytest.approx(P)  # the sixth round
    kcl, _, kcl_longest = _run(skip=False, checkpoint_every=1000.0)
    every = LeaseTiming(failover=DURATION).renew_interval
    assert kcl == int(300 / every) and kcl_longest <= every + 1e-9


@pytest.mark.parametrize("every", [0.7, 1.4, 1.7, 2.5, 3.1, 4.9, 5.3, 7.3])
def test_the_counter_moves_at_least_every_half_failover_time(every: float) -> None:
    """Whatever the checkpoint rhythm: the longest time without a counter move is at most 0.44
    failover time and a round, and the lease stays held throughout."""
    renewals, _, longest = _run(skip=True, checkpoint_every=every)
    assert longest <= A + G + 1e-9
    assert renewals >= 300 // (2 * P)
    # A quarter of a duration short of the time a holder may go unrenewed before it is taken
    # for killed a moment ago (no lease given to it: assign_rule.Suspects).
    assert longest + DURATION / 4 <= LeaseTiming(failover=DURATION).quiet_after + 1e-9


def test_random_checkpoint_gaps_keep_the_same_bounds() -> None:
    rng = random.Random(11)
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    next_round, next_checkpoint = 0.3, rng.uniform(0, 4)
    last_move = last_renewal = 0.0
    moves_gap = renewal_gap = 0.0
    for seq in range(2000):
        at = min(next_round, next_checkpoint)
        clock.advance(at - (clock.monotonic() - START))
        before = table.renewals
        if at == next_round:
            holder.renew_all(wait=5)
            next_round += G
            if table.renewals > before:
                renewal_gap, last_renewal = max(renewal_gap, at - last_renewal), at
            else:
                moves_gap = max(moves_gap, at - last_move)
                continue
        else:
            held = holder.get_if_held(KEY)
            assert held is not None
            position = ExtendedSequenceNumber(str(seq + 1))
            assert holder.update(
                KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)
            ).won
            next_checkpoint += rng.expovariate(1 / 1.5)
        moves_gap, last_move = max(moves_gap, at - last_move), at
    holder.close()
    assert moves_gap <= A + G + 1e-9
    assert renewal_gap <= DURATION + G / 2 + 1e-9  # throughput and figures ride on renewals


def test_a_skipped_round_still_reports_a_handoff_a_checkpoint_saw() -> None:
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    holder.renew_all(wait=5)
    stored = table.get_lease(KEY)
    assert stored is not None and table.initiate_handoff(stored, "worker-b") is not None
    clock.advance(P - 0.2)
    held = holder.get_if_held(KEY)
    assert held is not None
    position = ExtendedSequenceNumber("5")
    assert holder.update(KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)).won
    clock.advance(0.2)
    renewals = table.renewals
    report = holder.renew_all(wait=5)
    assert report.skipped == (KEY,) and report.renewed == () and table.renewals == renewals
    (asked,) = report.handoffs
    assert asked.lease.lease_owner == "worker-b" and asked.token == held.token
    holder.close()


def test_a_lease_taken_again_is_renewed_at_its_first_round() -> None:
    """A new tenure starts without a renewal: its first round renews whatever was checkpointed
    (a renewal of the last tenure says nothing about this one's figures)."""
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    holder.renew_all(wait=5)  # renewed: renewed_at is now
    stored = table.get_lease(KEY)
    assert stored is not None
    retaken = table.take_lease(stored, "worker-a")
    assert retaken is not None
    held = holder.add_taken(retaken)
    clock.advance(0.5)
    position = ExtendedSequenceNumber("3")
    assert holder.update(KEY, held.token, lambda x: table.update_checkpoint(x, position)).won
    clock.advance(0.5)
    before = table.renewals
    assert holder.renew_all(wait=5).renewed == (KEY,)
    assert table.renewals == before + 1
    holder.close()


class FlakyTable(CountingTable):
    """Renewals fail while ``failing`` is set, or block until ``release`` is set."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.failing = False
        self.release = threading.Event()
        self.release.set()

    def renew_lease(self, lease: Lease) -> Lease | None:
        self.release.wait(10)
        if self.failing:
            raise DependencyError("the lease table does not answer")
        return super().renew_lease(lease)


def test_a_failed_renewal_is_tried_again_at_the_next_round_not_a_period_later() -> None:
    clock = ManualClock()
    table = FlakyTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    assert holder.renew_all(wait=5).renewed == (KEY,)  # a fresh tenure: renewed at once
    clock.advance(P)
    table.failing = True
    tries = []
    for _ in range(4):  # every round until the lease would expire tries again
        report = holder.renew_all(wait=5)
        tries.append(KEY in report.failed)
        clock.advance(G)
    assert tries == [True, True, True, True]
    table.failing = False
    report = holder.renew_all(wait=5)
    assert report.renewed == (KEY,) and report.lost == ()
    holder.close()


def test_a_hung_renewal_is_not_sent_again_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    table = FlakyTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    table.release.clear()
    try:
        assert holder.renew_all(wait=0.05).slow == (KEY,)
        assert "taking long" not in caplog.text  # in flight for less than DURATION / 6
        clock.advance(DURATION / 6 + 0.1)
        for _ in range(3):
            assert holder.renew_all(wait=0.05).slow == (KEY,)
        assert caplog.text.count("renewing lease shardId-000000000000 is taking long") == 1
    finally:
        table.release.set()
        holder.close()


@pytest.mark.parametrize("checkpoints", [False, True])
@pytest.mark.parametrize("late", [0.0, 0.25])
@pytest.mark.parametrize("phase", [0.0, 0.9, 1.7, 2.6, 3.3, 4.1, 4.9])
def test_another_worker_scanning_at_the_take_interval_never_reads_a_live_lease_again(
    phase: float, late: float, checkpoints: bool
) -> None:
    """The taker reads a lease once more (a GetItem) when its would-be expiry (the stamp plus the
    lease duration and the clock skew, or the scan that saw it plus the duration when that came
    sooner) comes before a scan has shown a newer counter. Counter moves come at most 0.52 lease
    duration apart and scans every 0.55, so a live lease never comes due between scans: with
    each renewal round up to ``late`` seconds behind its time (at random), and with checkpoints
    now and then at random moments (a renewal then comes 0.44-0.52 duration after one)."""
    timing = LeaseTiming(failover=DURATION)
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    observer = LeaseObserver(timing)
    rng = random.Random(int(phase * 10))
    events = [(k * holder.round_interval + rng.uniform(0, late), "round") for k in range(1, 200)]
    events += [(phase + k * timing.take_interval, "scan") for k in range(30)]
    if checkpoints:
        events += [(rng.uniform(0, 160), "checkpoint") for _ in range(25)]
    for seq, (at, what) in enumerate(sorted(events)):
        clock.advance(START + at - clock.monotonic())
        if what == "round":
            assert holder.renew_all(wait=5).lost == ()
        elif what == "checkpoint":
            held = holder.get_if_held(KEY)
            assert held is not None
            position = ExtendedSequenceNumber(str(seq))
            assert holder.update(
                KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)
            ).won
        else:
            due_at = observer.next_check("worker-b")
            assert due_at is None or due_at > clock.monotonic(), f"a read was due before {at}"
            observer.observe(table.list_leases(), clock.monotonic(), clock.wall())
    holder.close()
