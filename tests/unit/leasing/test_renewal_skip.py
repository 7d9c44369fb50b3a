"""A checkpoint moves a lease's counter as a renewal does: a lease checkpointed lately skips that
round's renewal (``renewal_due``), with the bounds the rule promises."""

from __future__ import annotations

import random

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.lease import Lease
from checkpoint.leasing.held import renewal_due
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable

DURATION = 10.0
P = DURATION / 3  # the holder's round interval in renewal_due
KEY = "shardId-000000000000"


@pytest.mark.parametrize(
    ("now", "counter_moved", "renewed", "due", "why"),
    [
        (10.0, 10.0 - P, 10.0 - P, True, "renewed a round ago, nothing since"),
        (10.0, 9.0, 10.0 - P, False, "checkpointed a second ago"),
        (10.0, 10.0 - P / 2 + 0.01, 10.0 - P, False, "checkpointed just inside half a round"),
        (10.0, 10.0 - P / 2 - 0.01, 10.0 - P, True, "checkpointed just over half a round ago"),
        (10.0, 9.9, 10.0 - 2 * P, False, "second round without a renewal"),
        (10.0, 9.9, 10.0 - 2.5 * P, True, "the third round renews, checkpointed or not"),
        (10.0, 9.9, float("-inf"), True, "never renewed in this tenure (just taken)"),
    ],
)
def test_renewal_due(now: float, counter_moved: float, renewed: float, due: bool, why: str) -> None:
    assert renewal_due(now, counter_moved, renewed, P) is due, why


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
    """Rounds every P and checkpoints every ``checkpoint_every`` s on a manual clock: the renewal
    writes, the checkpoint writes, and the longest time between two counter moves."""
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=skip)
    _taken(table, holder)
    events = sorted(
        [(k * P + 0.3, "round") for k in range(int(seconds / P))]
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


def test_a_lease_checkpointed_every_second_is_renewed_every_third_round_only() -> None:
    rounds = int(300 / P)
    renewals, checkpoints, _ = _run(skip=True, checkpoint_every=1.0)
    assert checkpoints == 299
    # The first round renews (a fresh tenure), then one round in three.
    assert rounds // 3 <= renewals <= rounds // 3 + 2
    kcl, _, _ = _run(skip=False, checkpoint_every=1.0)
    assert kcl == rounds


def test_an_idle_lease_is_renewed_every_round() -> None:
    renewals, _, longest = _run(skip=True, checkpoint_every=1000.0)
    assert renewals == int(300 / P)
    assert longest <= P + 1e-9


@pytest.mark.parametrize("every", [0.7, 1.4, 1.7, 2.5, 3.1, 4.9, 7.3])
def test_the_counter_moves_at_least_every_half_failover_time(every: float) -> None:
    """Whatever the checkpoint rhythm: the longest time without a counter move is 1.5 rounds
    (half the failover time: two tries before the lease could expire), and the lease stays
    held throughout."""
    renewals, _, longest = _run(skip=True, checkpoint_every=every)
    assert longest <= 1.5 * P + 1e-9
    assert renewals >= int(300 / P) // 3


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
            next_round += P
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
    assert moves_gap <= 1.5 * P + 1e-9
    assert renewal_gap <= 3 * P + 1e-9  # throughput and figures ride on renewals


def test_a_skipped_round_still_reports_a_handoff_a_checkpoint_saw() -> None:
    clock = ManualClock()
    table = CountingTable(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION, skip_checkpointed=True)
    _taken(table, holder)
    holder.renew_all(wait=5)
    stored = table.get_lease(KEY)
    assert stored is not None and table.initiate_handoff(stored, "worker-b") is not None
    clock.advance(P - 0.5)
    held = holder.get_if_held(KEY)
    assert held is not None
    position = ExtendedSequenceNumber("5")
    assert holder.update(KEY, held.token, lambda x, p=position: table.update_checkpoint(x, p)).won
    clock.advance(0.5)
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
