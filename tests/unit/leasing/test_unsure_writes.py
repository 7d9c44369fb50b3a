"""LeaseHolder after a write whose answer never came (a timeout after the store applied it).

Every write of a held lease is conditional on the counter we last saw. If one lands but its
answer is lost, the next write's condition fails on our own write. The store puts the failed
write's stamp on its error; the holder then reads the lease: when it carries our owner, the
counter one past ours and that stamp, the earlier write landed and the holder goes on from it
instead of dropping a lease nobody else touched. Anything else (another owner, another counter,
an operator's reset that kept our owner, no write of ours in doubt) stays a lost race.
"""

from __future__ import annotations

import logging

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError
from checkpoint.checkpointer import DEPENDENCY, Checkpointer, CheckpointError
from checkpoint.lease import Lease, WriteStamp
from checkpoint.leasing.held_lease import LeaseLoss
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable

DURATION = 10.0
KEY = "shardId-000000000000"


class TimeoutTable(MemoryLeaseTable):
    """A memory table whose next ``land`` writes are applied and then answered with a timeout,
    whose next ``refuse`` writes fail before anything is written, and whose reads can fail."""

    def __init__(self) -> None:
        super().__init__()
        self.land = 0
        self.refuse = 0
        self.fail_reads = False
        self.reads = 0
        self.refuse_after_read = 0

    def _answer(self, result: Lease | None) -> Lease | None:
        if self.land:
            self.land -= 1
            error = DependencyError("read timeout (the write was applied)")
            error.sent_stamp = result.written if result is not None else None  # as DynamoDB's
            raise error
        return result

    def _before(self, lease: Lease) -> None:
        if self.refuse:
            self.refuse -= 1
            error = DependencyError("connection refused (nothing written)")
            error.sent_stamp = WriteStamp(lease.lease_counter + 1, self._clock.wall())
            raise error

    def renew_lease(self, lease: Lease) -> Lease | None:
        self._before(lease)
        return self._answer(super().renew_lease(lease))

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        self._before(lease)
        return self._answer(super().update_checkpoint(lease, checkpoint, pending))

    def get_lease(self, lease_key: str) -> Lease | None:
        self.reads += 1
        if self.fail_reads:
            raise DependencyError("read failed")
        self.refuse, self.refuse_after_read = self.refuse_after_read, 0
        return super().get_lease(lease_key)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def table() -> TimeoutTable:
    return TimeoutTable()


@pytest.fixture
def holder(table: TimeoutTable, clock: ManualClock) -> LeaseHolder:
    return LeaseHolder(table, "worker-a", clock, DURATION)


def stored(table: MemoryLeaseTable) -> Lease:
    lease = MemoryLeaseTable.get_lease(table, KEY)
    assert lease is not None
    return lease


def take(table: TimeoutTable, holder: LeaseHolder) -> None:
    table.create_lease_if_absent(Lease(KEY, TRIM_HORIZON))
    taken = table.take_lease(stored(table), "worker-a")
    assert taken is not None
    holder.add_taken(taken)


def checkpoint_to(table: TimeoutTable, sequence: str):  # type: ignore[no-untyped-def]
    return lambda lease: table.update_checkpoint(lease, ExtendedSequenceNumber(sequence))


def token(holder: LeaseHolder):  # type: ignore[no-untyped-def]
    held = holder.get_if_held(KEY)
    assert held is not None
    return held.token


def test_a_renewal_after_a_landed_renewal_goes_on_from_it(
    table: TimeoutTable, holder: LeaseHolder, caplog: pytest.LogCaptureFixture
) -> None:
    take(table, holder)
    table.land = 1
    first = holder.renew_all(wait=5)
    assert list(first.failed) == [KEY]
    assert stored(table).lease_counter == 2  # applied, though we never heard
    with caplog.at_level(logging.WARNING, logger="checkpoint.leasing.held_lease"):
        second = holder.renew_all(wait=5)
    assert second.renewed == (KEY,) and second.lost == ()
    assert stored(table).lease_counter == 3
    held = holder.get_if_held(KEY)
    assert held is not None and held.lease == stored(table)
    assert "had landed (counter 2)" in caplog.text


def test_a_checkpoint_that_landed_unheard_is_kept_and_the_lease_too(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    """The flaky case seen in CI: a checkpoint write timed out after DynamoDB applied it; the next
    renewal lost its condition and the lease was dropped, so its records came again."""
    take(table, holder)
    table.land = 1
    with pytest.raises(DependencyError):
        holder.update(KEY, token(holder), checkpoint_to(table, "42"))
    report = holder.renew_all(wait=5)
    assert report.renewed == (KEY,) and report.lost == ()
    assert stored(table).checkpoint == ExtendedSequenceNumber("42")
    # The next checkpoint is conditional on the landed one and wins.
    assert holder.update(KEY, token(holder), checkpoint_to(table, "43")).won
    assert stored(table).checkpoint == ExtendedSequenceNumber("43")


def test_a_checkpoint_after_a_landed_renewal_is_written_once_more_and_wins(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.land = 1
    holder.renew_all(wait=5)
    result = holder.update(KEY, token(holder), checkpoint_to(table, "7"))
    assert result.won and result.loss is None
    assert stored(table).checkpoint == ExtendedSequenceNumber("7")
    assert stored(table).lease_counter == 3


def test_several_unsure_writes_in_a_row_of_which_one_landed(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.land = 1
    holder.renew_all(wait=5)  # landed, unheard: counter 2
    table.refuse = 1
    holder.renew_all(wait=5)  # refused before writing: still unsure about the first
    assert stored(table).lease_counter == 2
    assert holder.renew_all(wait=5).renewed == (KEY,)
    assert stored(table).lease_counter == 3


def test_an_unsure_write_that_did_not_land_changes_nothing(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.refuse = 1
    assert list(holder.renew_all(wait=5).failed) == [KEY]
    assert holder.renew_all(wait=5).renewed == (KEY,)
    assert table.reads == 0  # the write won at once: nothing to look up


def test_a_lease_another_worker_took_after_our_unsure_write_is_lost(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.land = 1
    holder.renew_all(wait=5)
    assert table.take_lease(stored(table), "worker-b") is not None
    report = holder.renew_all(wait=5)
    assert [lease.lease_key for lease in report.lost] == [KEY]
    assert holder.get_if_held(KEY) is None
    assert stored(table).lease_owner == "worker-b"


def test_a_taker_that_took_and_gave_back_is_not_mistaken_for_our_write(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    """Owner ours again but the counter two past: a stranger's writes, not ours."""
    take(table, holder)
    table.refuse = 1
    holder.renew_all(wait=5)
    b = table.take_lease(stored(table), "worker-b")
    assert b is not None and table.take_lease(b, "worker-a") is not None
    assert [lease.lease_key for lease in holder.renew_all(wait=5).lost] == [KEY]


def test_a_counter_moved_with_our_owner_but_no_write_in_doubt_is_a_lost_race(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    assert table.renew_lease(stored(table)) is not None  # not through the holder
    result = holder.update(KEY, token(holder), checkpoint_to(table, "5"))
    assert result.loss is LeaseLoss.WRITE_LOST
    assert table.reads == 1  # only whether the item vanished (vanished.py): it had not
    assert stored(table).lease_counter == 2


def test_a_failed_look_keeps_the_lease_and_the_doubt(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.land = 1
    holder.renew_all(wait=5)
    table.fail_reads = True
    report = holder.renew_all(wait=5)
    assert list(report.failed) == [KEY] and report.lost == ()
    table.fail_reads = False
    assert holder.renew_all(wait=5).renewed == (KEY,)


def test_the_expiry_still_counts_from_before_the_unsure_write(
    table: TimeoutTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """Others date the landed write by its stamp, taken when it was sent: going on from it must not
    give us a longer lease than the last write we heard back from."""
    take(table, holder)
    start = clock.monotonic()
    clock.advance(3)
    table.land = 1
    holder.renew_all(wait=5)  # sent at 3, applied, unheard
    clock.advance(3)
    table.refuse_after_read = 1
    report = holder.renew_all(wait=5)  # at 6: lost, looked, adopted; the write once more refused
    assert list(report.failed) == [KEY]
    held = holder.get_if_held(KEY)
    assert held is not None and held.lease.lease_counter == 2  # going on from the landed write
    assert held.last_counter_change == start  # not start + 3: the expiry counts from what we heard
    clock.advance(DURATION - 6 + 0.5)
    assert holder.get_if_held(KEY) is None


def test_a_processor_that_checkpoints_again_after_a_lost_answer_keeps_its_lease(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    """Through the Checkpointer, as a processor sees it: the first call raises the KCL's
    dependency error (outcome unknown); calling again with the same or a later position
    succeeds, and the lease is neither lost nor moved backwards."""
    take(table, holder)
    largest = ExtendedSequenceNumber("100")
    checkpointer = Checkpointer(holder, KEY, token(holder), largest, sleep=lambda _: None)
    table.land = 1
    with pytest.raises(CheckpointError) as raised:
        checkpointer.checkpoint("42")
    assert raised.value.value == DEPENDENCY
    checkpointer.checkpoint("42")  # the same again: already stored
    assert stored(table).lease_counter == 2  # nothing written twice
    checkpointer.checkpoint("50")
    assert stored(table).checkpoint == ExtendedSequenceNumber("50")
    assert holder.get_if_held(KEY) is not None


def test_a_reset_that_kept_our_owner_is_not_mistaken_for_our_write(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    """`kclpy-spark reset` rewrites the lease with its owner (counter + 1) while our last write was
    in doubt: our owner and the next counter, but not our stamp. The reset must stand."""
    take(table, holder)
    table.refuse = 1
    holder.renew_all(wait=5)
    reset = table.update_lease(stored(table))  # what reset does, owner kept
    assert reset is not None and reset.lease_owner == "worker-a"
    result = holder.update(KEY, token(holder), checkpoint_to(table, "5"))
    assert result.loss is LeaseLoss.WRITE_LOST
    assert stored(table).checkpoint == TRIM_HORIZON


def test_a_take_by_another_worker_after_a_refused_write_is_a_lost_race(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.refuse = 1
    holder.renew_all(wait=5)
    assert table.take_lease(stored(table), "worker-b") is not None  # counter + 1, not ours
    assert [lease.lease_key for lease in holder.renew_all(wait=5).lost] == [KEY]


def test_a_handoff_asked_after_our_landed_renewal_is_seen_and_the_lease_kept(
    table: TimeoutTable, holder: LeaseHolder
) -> None:
    take(table, holder)
    table.land = 1
    holder.renew_all(wait=5)
    assert table.initiate_handoff(stored(table), "worker-b") is not None  # keeps the counter
    report = holder.renew_all(wait=5)
    assert report.renewed == (KEY,) and report.lost == ()
    (asked,) = report.handoffs
    assert asked.lease.lease_owner == "worker-b" and asked.lease.checkpoint_owner == "worker-a"


def test_a_handoff_begun_on_an_unanswered_renewal_keeps_the_earlier_expiry(
    table: TimeoutTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """initiate_handoff moves no counter: the counter it returns (one past ours) is the unanswered
    renewal's, sent before; the tenure's expiry must not count from the handoff's write."""
    take(table, holder)
    start = clock.monotonic()
    clock.advance(3)
    table.land = 1
    holder.renew_all(wait=5)
    clock.advance(3)
    begun = holder.begin_handoff(KEY, token(holder), "worker-b")
    assert begun.won and begun.lease is not None and begun.lease.lease_counter == 2
    held = holder.get_if_held(KEY)
    assert held is not None and held.last_counter_change == start
