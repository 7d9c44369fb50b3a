"""LeaseHolder: renewals, local expiry on the monotonic clock, tokens, per-lease serialization."""

from __future__ import annotations

import functools
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError, ThrottledError
from checkpoint.checkpointer import Checkpointer, CheckpointError
from checkpoint.lease import Lease
from checkpoint.leasing.held_lease import LeaseLoss
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.leasing.renewal_rules import RenewalReport
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable

DURATION = 10.0
KEY = "shardId-000000000000"


class FaultyRenewTable(MemoryLeaseTable):
    """A memory table whose renew_lease raises the queued errors first (fault injection)."""

    def __init__(self) -> None:
        super().__init__()
        self.renew_errors: list[Exception] = []
        self.renew_calls = 0

    def renew_lease(self, lease: Lease) -> Lease | None:
        self.renew_calls += 1
        if self.renew_errors:
            raise self.renew_errors.pop(0)
        return super().renew_lease(lease)


def take(table: MemoryLeaseTable, owner: str, key: str = KEY) -> Lease:
    table.create_lease_if_absent(Lease(key, TRIM_HORIZON))
    current = table.get_lease(key)
    assert current is not None
    taken = table.take_lease(current, owner)
    assert taken is not None
    return taken


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def table() -> FaultyRenewTable:
    return FaultyRenewTable()


@pytest.fixture
def holder(table: FaultyRenewTable, clock: ManualClock) -> LeaseHolder:
    return LeaseHolder(table, "worker-a", clock, DURATION)


def stored(table: MemoryLeaseTable, key: str = KEY) -> Lease:
    lease = table.get_lease(key)
    assert lease is not None
    return lease


def test_add_taken_issues_a_token_and_rejects_other_owners(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    assert holder.get_if_held(KEY) == held
    assert holder.held_keys() == {KEY}
    other = take(table, "worker-b", "shardId-000000000001")
    with pytest.raises(ValueError, match="worker-b"):
        holder.add_taken(other)


def test_a_tenure_expires_a_lease_duration_after_the_write_that_won_it_began(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """A take that took 2 s to return: the tenure counts from before the write (other workers
    date it by the write's stamp), not from when the answer came back."""
    started = clock.monotonic()
    clock.advance(2.0)
    held = holder.add_taken(take(table, "worker-a"), started)
    assert held.last_counter_change == started
    clock.advance(DURATION - 2.0 + 0.001)
    assert holder.get_if_held(KEY) is None


def test_retaking_issues_a_new_token(table: FaultyRenewTable, holder: LeaseHolder) -> None:
    first = holder.add_taken(take(table, "worker-a"))
    second = holder.add_taken(stored(table))
    assert first.token != second.token
    result = holder.update(KEY, first.token, lambda lease: pytest.fail("must not write"))
    assert result.loss is LeaseLoss.TOKEN_CHANGED


def test_renew_bumps_the_counter_and_restarts_the_expiry_clock(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    holder.add_taken(take(table, "worker-a"))
    before = stored(table).lease_counter
    clock.advance(6)
    report = holder.renew_all()
    assert report.renewed == (KEY,) and report.lost == () and report.failed == {}
    assert stored(table).lease_counter == before + 1
    held = holder.get_if_held(KEY)
    assert held is not None and held.lease == stored(table)
    clock.advance(6)  # 12 s after the take, 6 s after the renewal
    assert holder.get_if_held(KEY) is not None


@pytest.mark.parametrize(
    ("elapsed", "held"), [(0.0, True), (DURATION, True), (DURATION + 0.001, False)]
)
def test_local_expiry_is_judged_by_the_monotonic_clock(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock, elapsed: float, held: bool
) -> None:
    holder.add_taken(take(table, "worker-a"))
    clock.advance(elapsed)
    assert (holder.get_if_held(KEY) is not None) is held
    assert (KEY in holder.held_keys()) is held


def test_a_lost_renewal_drops_the_lease(table: FaultyRenewTable, holder: LeaseHolder) -> None:
    mine = holder.add_taken(take(table, "worker-a"))
    assert table.take_lease(stored(table), "worker-b") is not None
    report = holder.renew_all()
    assert report.lost == (mine.lease,) and report.renewed == ()
    assert holder.get_if_held(KEY) is None
    assert stored(table).lease_owner == "worker-b"


def test_an_expired_lease_is_dropped_without_a_write(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    holder.add_taken(take(table, "worker-a"))
    counter = stored(table).lease_counter
    clock.advance(DURATION + 1)
    report = holder.renew_all()
    assert [lease.lease_key for lease in report.lost] == [KEY]
    assert table.renew_calls == 0
    assert stored(table).lease_counter == counter


@pytest.mark.parametrize("error", [ThrottledError("slow down"), DependencyError("boom")])
def test_a_failing_renewal_keeps_the_lease_until_it_expires(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock, error: Exception
) -> None:
    holder.add_taken(take(table, "worker-a"))
    table.renew_errors = [error, error]
    clock.advance(6)
    report = holder.renew_all()
    assert report.failed == {KEY: error} and report.lost == ()
    assert holder.get_if_held(KEY) is not None
    clock.advance(6)
    assert holder.get_if_held(KEY) is None  # never renewed: expired locally
    assert [lease.lease_key for lease in holder.renew_all().lost] == [KEY]


def test_update_replaces_the_held_lease_so_renewals_keep_winning(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    clock.advance(5)
    position = ExtendedSequenceNumber("42")
    result = holder.update(KEY, held.token, lambda lease: table.update_checkpoint(lease, position))
    assert result.won and result.loss is None
    assert result.lease == stored(table)
    current = holder.get_if_held(KEY)
    assert current is not None
    assert current.lease.checkpoint == position and current.last_counter_change == clock.monotonic()
    assert holder.renew_all().renewed == (KEY,)


def test_update_that_writes_nothing_does_not_extend_the_lease(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION)
    assert holder.update(KEY, held.token, lambda lease: lease).won
    clock.advance(0.001)
    assert holder.get_if_held(KEY) is None


@pytest.mark.parametrize(
    ("setup", "loss"),
    [
        ("never-taken", LeaseLoss.NOT_HELD),
        ("dropped", LeaseLoss.NOT_HELD),
        ("expired", LeaseLoss.EXPIRED),
        ("wrong-token", LeaseLoss.TOKEN_CHANGED),
    ],
)
def test_update_refuses_without_writing(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock, setup: str, loss: LeaseLoss
) -> None:
    token = uuid.uuid4()
    if setup != "never-taken":
        held = holder.add_taken(take(table, "worker-a"))
        if setup != "wrong-token":
            token = held.token
    if setup == "dropped":
        assert holder.drop(KEY) is not None
    if setup == "expired":
        clock.advance(DURATION + 1)
    result = holder.update(KEY, token, lambda lease: pytest.fail("must not write"))
    assert result == type(result)(None, loss)
    assert not result.won


def test_a_lost_update_drops_the_lease(table: FaultyRenewTable, holder: LeaseHolder) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    assert table.renew_lease(stored(table)) is not None  # the counter moves behind our back
    before = stored(table)
    result = holder.update(
        KEY, held.token, lambda lease: table.update_checkpoint(lease, ExtendedSequenceNumber("7"))
    )
    assert result.loss is LeaseLoss.WRITE_LOST
    assert stored(table) == before
    assert holder.get_if_held(KEY) is None


def test_update_errors_propagate_and_keep_the_lease(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    held = holder.add_taken(take(table, "worker-a"))

    def failing(lease: Lease) -> Lease | None:
        raise DependencyError("store down")

    with pytest.raises(DependencyError):
        holder.update(KEY, held.token, failing)
    assert holder.get_if_held(KEY) == held


def test_renewals_and_updates_of_one_lease_never_race(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    """Both writes are conditional on the same counter: unserialized, one would lose sometimes."""
    held = holder.add_taken(take(table, "worker-a"))
    initial_counter = held.lease.lease_counter
    rounds = 300
    outcomes: list[object] = []

    def checkpoints() -> None:
        for i in range(rounds):
            position = ExtendedSequenceNumber(str(i + 1))

            def write(lease: Lease, p: ExtendedSequenceNumber = position) -> Lease | None:
                return table.update_checkpoint(lease, p)

            outcomes.append(holder.update(KEY, held.token, write).loss)

    def renewals() -> None:
        for _ in range(rounds):
            outcomes.extend(holder.renew_all().lost)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible to provoke races
    try:
        threads = [threading.Thread(target=checkpoints), threading.Thread(target=renewals)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert outcomes == [None] * rounds
    final = stored(table)
    assert final.checkpoint == ExtendedSequenceNumber(str(rounds))
    assert final.lease_counter == initial_counter + 2 * rounds  # every write won
    current = holder.get_if_held(KEY)
    assert current is not None and current.lease == final


def test_drop_returns_what_was_held(table: FaultyRenewTable, holder: LeaseHolder) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    assert holder.drop(KEY) == held
    assert holder.drop(KEY) is None
    assert holder.held() == []
    assert holder.renew_all() == type(holder.renew_all())()


def test_lease_duration_must_be_positive(table: FaultyRenewTable, clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaseHolder(table, "w", clock, 0)


def test_held_lease_is_a_separate_runtime_object(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    lease = take(table, "worker-a")
    held = holder.add_taken(lease)
    assert held.lease == lease  # the stored value is untouched by runtime state
    assert replace(held, token=held.token) == held


# --- one slow lease never costs the others (issue 14, finding 2) -------------------------------


class HangingTable(MemoryLeaseTable):
    """Fault injection: renew_lease (or update_checkpoint) of ``stuck`` blocks until released."""

    def __init__(self, stuck: str) -> None:
        super().__init__()
        self.stuck = stuck
        self.release = threading.Event()
        self.entered = threading.Event()
        self.stuck_renewals = 0

    def renew_lease(self, lease: Lease) -> Lease | None:
        if lease.lease_key == self.stuck:
            self.stuck_renewals += 1
            self.entered.set()
            assert self.release.wait(30.0)
        return super().renew_lease(lease)

    def update_checkpoint(
        self, lease: Lease, checkpoint: ExtendedSequenceNumber, pending: object = None
    ) -> Lease | None:
        if lease.lease_key == self.stuck:
            self.entered.set()
            assert self.release.wait(30.0)
        return super().update_checkpoint(lease, checkpoint)


KEYS = ("shardId-000000000000", "shardId-000000000001", "shardId-000000000002")


def _renew_in_thread(holder: LeaseHolder, wait: float) -> RenewalReport:
    """renew_all in a thread: a pass that blocks on one lease fails the test instead of hanging."""
    out: list[RenewalReport] = []
    thread = threading.Thread(target=lambda: out.append(holder.renew_all(wait=wait)), daemon=True)
    thread.start()
    thread.join(10.0)
    assert out, "renew_all did not return while one lease's request hung"
    return out[0]


def test_a_hung_renewal_of_one_lease_never_expires_the_others(clock: ManualClock) -> None:
    table = HangingTable(stuck=KEYS[0])
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    for key in KEYS:
        holder.add_taken(take(table, "worker-a", key))
    try:
        for _ in range(2):  # each round well inside the others' lease duration
            clock.advance(5.0)
            report = _renew_in_thread(holder, wait=2.0)
            assert isinstance(report, RenewalReport)
            assert report.renewed == KEYS[1:], report
            assert report.slow == (KEYS[0],)
        assert table.stuck_renewals == 1  # in flight: never submitted again, no thread per round
        clock.advance(1.0)
        assert holder.get_if_held(KEYS[0]) is None  # the hung one expired on our own clock
        assert {h.lease_key for h in holder.held()} == set(KEYS[1:])
    finally:
        table.release.set()
        holder.close()


def test_a_hung_checkpoint_write_holds_only_its_own_lease(clock: ManualClock) -> None:
    table = HangingTable(stuck=KEYS[0])
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = [holder.add_taken(take(table, "worker-a", key)) for key in KEYS]
    writer = threading.Thread(
        target=holder.update,
        args=(
            KEYS[0],
            held[0].token,
            lambda lease: table.update_checkpoint(lease, ExtendedSequenceNumber("5")),
        ),
        daemon=True,
    )
    writer.start()
    assert table.entered.wait(10.0)  # the write of KEYS[0] now holds its lease's lock
    try:
        clock.advance(4.0)
        report = _renew_in_thread(holder, wait=2.0)
        assert report.renewed == KEYS[1:], report
    finally:
        table.release.set()
        writer.join(10.0)
        holder.close()


def test_a_write_waits_for_its_leases_lock_no_longer_than_the_lease(clock: ManualClock) -> None:
    """A hung renewal holds the lease's lock: a checkpoint of it waited for ever (its processor's
    thread with it); now until the lease would expire, then it fails as a busy lease."""
    from checkpoint.leasing.held_lease import LeaseBusyError

    table = HangingTable(stuck=KEY)
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION / 2 + 0.1)  # the renewal is due
    renewal = threading.Thread(target=holder.renew_all, daemon=True)
    renewal.start()
    assert table.entered.wait(10.0)  # the renewal now holds the lease's lock
    clock.advance(DURATION / 2 - 0.4)  # 0.3 s of the lease left
    outcome: list[object] = []

    def checkpoint() -> None:
        write = functools.partial(table.update_checkpoint, checkpoint=ExtendedSequenceNumber("5"))
        try:
            outcome.append(holder.update(KEY, held.token, write))
        except LeaseBusyError as exc:
            outcome.append(exc)

    writer = threading.Thread(target=checkpoint, daemon=True)
    try:
        writer.start()
        writer.join(10.0)
        assert len(outcome) == 1 and isinstance(outcome[0], LeaseBusyError)
    finally:
        table.release.set()
        renewal.join(10.0)
        holder.close()


def test_a_retake_behind_a_hung_renewal_waits_a_moment_and_holds_a_live_tenure() -> None:
    """The renewal that let the lease expire still hung (a stuck SQLite disk) holding its lock:
    retaking the lease waited for it for ever, on the thread that takes leases. It waits a
    moment now, then takes a fresh slot whose tenure is live: waiting a whole lease (its tenure
    counted from before the take), it came out expired. On the real clock: the wait is real."""
    import time

    from checkpoint.base.clock import SystemClock

    duration = 1.0
    table = HangingTable(stuck=KEY)
    holder = LeaseHolder(table, "worker-a", SystemClock(), duration)
    first = holder.add_taken(take(table, "worker-a"))
    time.sleep(duration / 2 + 0.02)  # the renewal is due
    renewal = threading.Thread(target=holder.renew_all, daemon=True)
    renewal.start()
    assert table.entered.wait(10.0)  # the renewal now holds the lease's lock
    current = table.get_lease(KEY)
    assert current is not None
    started = time.monotonic()  # before the take, as the taker passes it
    retaken = table.take_lease(current, "worker-a")
    assert retaken is not None
    taken: list[object] = []

    def add() -> None:
        taken.append(holder.add_taken(retaken, started))

    retake = threading.Thread(target=add, daemon=True)
    try:
        retake.start()
        retake.join(10.0)
        assert len(taken) == 1
        held = holder.get_if_held(KEY)  # live: not expired on return
        assert held is not None and held.token != first.token
        table.release.set()  # the stale renewal's write loses: the new tenure stays
        renewal.join(10.0)
        again = holder.get_if_held(KEY)
        assert again is not None and again.token == held.token
    finally:
        table.release.set()
        holder.close()


def test_renewals_of_many_leases_run_in_parallel_threads_bounded_by_the_pool(
    clock: ManualClock,
) -> None:
    table = MemoryLeaseTable()
    holder = LeaseHolder(table, "worker-a", clock, DURATION, renewal_threads=4)
    keys = [f"shardId-{i:012d}" for i in range(40)]
    for key in keys:
        holder.add_taken(take(table, "worker-a", key))
    before = threading.active_count()
    for _ in range(25):
        clock.advance(1.0)
        assert len(holder.renew_all().renewed) == 40
    assert threading.active_count() - before <= 4  # the pool, not a thread per lease or round
    holder.close()


def test_release_evicts_then_drops_and_can_park_first(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    result = holder.release(KEY, held.token, change=lambda lease: replace(lease, closed_count=3))
    assert result.won and holder.get_if_held(KEY) is None
    assert stored(table).lease_owner is None and stored(table).closed_count == 3
    # A release with a stale token writes nothing and leaves a newer tenure alone.
    again = holder.add_taken(take(table, "worker-a"))
    assert holder.release(KEY, held.token).loss is LeaseLoss.TOKEN_CHANGED
    assert holder.get_if_held(KEY) == again


def test_a_late_renewal_of_an_ended_tenure_reports_nothing_against_the_next(
    clock: ManualClock,
) -> None:
    """A renewal queued behind a slow one ran after its tenure was released and the lease taken
    again: it reported the lease LOST by key, which stopped the new tenure's consumer."""
    table = HangingTable(stuck=KEYS[1])
    holder = LeaseHolder(table, "worker-a", clock, DURATION, renewal_threads=1)
    holder.add_taken(take(table, "worker-a", KEYS[1]))  # its renewal takes the one thread
    old = holder.add_taken(take(table, "worker-a", KEYS[0]))  # queued behind it
    out: list[RenewalReport] = []
    thread = threading.Thread(target=lambda: out.append(holder.renew_all(wait=5.0)), daemon=True)
    try:
        thread.start()
        assert table.entered.wait(10.0)
        clock.advance(DURATION + 1.0)  # the queued tenure is past its time
        holder.release(KEYS[0], old.token)
        new = holder.add_taken(take(table, "worker-a", KEYS[0]))  # taken again: a new tenure
        table.release.set()
        thread.join(10.0)
        [report] = out
        assert KEYS[0] not in {lease.lease_key for lease in report.lost}
        held = holder.get_if_held(KEYS[0])
        assert held is not None and held.token == new.token
        assert holder.drop(KEYS[0], old.token) is None  # a stale drop leaves the new tenure
        assert holder.drop(KEYS[0], new.token) == held
    finally:
        table.release.set()
        holder.close()


def test_an_expiry_seen_for_a_tenure_never_drops_the_one_that_replaced_it(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """A renewal reads the slot's tenure before it gets the lease's lock; a retake may replace
    the tenure in the same slot meanwhile. The expiry of what it read must not drop the new one."""
    old = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION + 1.0)  # the old tenure is past its time
    new = holder.add_taken(take(table, "worker-a"))  # retaken: same slot, fresh tenure
    slot = holder._slots[KEY]
    assert not holder._expired_now(KEY, slot, old)
    held = holder.get_if_held(KEY)
    assert held is not None and held.token == new.token


# --- graceful handoff --------------------------------------------------------------------------


def test_a_renewal_reports_a_handoff_asked_of_us_and_keeps_the_lease(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    assert holder.renew_all(wait=5).handoffs == ()
    assert table.initiate_handoff(stored(table), "worker-b") is not None
    report = holder.renew_all(wait=5)
    assert report.renewed == (KEY,) and report.lost == ()
    (asked,) = report.handoffs
    assert asked.token == held.token
    assert asked.lease.lease_owner == "worker-b" and asked.lease.checkpoint_owner == "worker-a"
    # Still ours to checkpoint until we complete it.
    moved = holder.update(
        KEY, held.token, lambda x: table.update_checkpoint(x, ExtendedSequenceNumber("7"))
    )
    assert moved.won
    result = holder.release(KEY, held.token)  # completes the handoff
    assert result.won and holder.get_if_held(KEY) is None
    after = stored(table)
    assert after.lease_owner == "worker-b" and after.checkpoint_owner is None
    assert after.checkpoint == ExtendedSequenceNumber("7")
    assert after.lease_counter == moved.lease.lease_counter + 1  # fences the old tenure


def test_a_zombie_old_owner_cannot_checkpoint_after_the_handoff(
    table: FaultyRenewTable, clock: ManualClock
) -> None:
    """The old owner paused past the handoff: the new owner completed nothing, the lease expired
    and was taken. A write of the old tenure is refused and the lease dropped."""
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = holder.add_taken(take(table, "worker-a"))
    table.initiate_handoff(stored(table), "worker-b")
    holder.renew_all(wait=5)  # sees the handoff; then pauses
    assert table.take_lease(stored(table), "worker-b") is not None  # expired for the others
    result = holder.update(
        KEY, held.token, lambda x: table.update_checkpoint(x, ExtendedSequenceNumber("9"))
    )
    assert result.loss is LeaseLoss.WRITE_LOST
    assert stored(table).checkpoint == TRIM_HORIZON and stored(table).lease_owner == "worker-b"


def test_an_update_that_begins_a_handoff_is_remembered_without_extending_the_lease(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """hand_out() on SIGTERM: initiate_handoff keeps the counter; the held view must show the
    handoff (so the release completes it rather than losing its condition), and the expiry clock
    must not restart (no counter moved)."""
    held = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION - 1)
    result = holder.update(KEY, held.token, lambda x: table.initiate_handoff(x, "worker-b"))
    assert result.won
    now = holder.get_if_held(KEY)
    assert now is not None and now.lease.handoff_pending
    assert now.last_counter_change == held.last_counter_change
    assert holder.release(KEY, held.token).won
    assert stored(table).lease_owner == "worker-b" and not stored(table).handoff_pending


def test_a_stopping_worker_whose_view_predates_a_thiefs_ask_still_hands_over(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    """begin_handoff and release with a view from before another worker began a handoff: the
    lease stays held, and the release completes the handoff (not a lost write and an expiry)."""
    held = holder.add_taken(take(table, "worker-a"))
    assert table.initiate_handoff(stored(table), "worker-b") is not None  # not renewed since
    begun = holder.begin_handoff(KEY, held.token, "worker-c")
    assert begun.won and begun.lease is not None and begun.lease.lease_owner == "worker-b"
    assert holder.get_if_held(KEY) is not None
    assert holder.release(KEY, held.token).won
    after = stored(table)
    assert after.lease_owner == "worker-b" and not after.handoff_pending


def test_a_release_with_a_view_from_before_a_handoff_completes_it(
    table: FaultyRenewTable, holder: LeaseHolder
) -> None:
    held = holder.add_taken(take(table, "worker-a"))
    table.initiate_handoff(stored(table), "worker-b")
    result = holder.release(KEY, held.token)
    assert result.won
    after = stored(table)
    assert after.lease_owner == "worker-b" and after.checkpoint_owner is None
    assert after.lease_counter == held.lease.lease_counter + 1


# --- no write after a release (#49 item 11) ---------------------------------------------------
# ``release`` makes its handoff or evict write under the lease's lock, which leaves the handed-over
# (or unowned) lease in the slot; the slot is dropped a moment later, outside that lock. A renewal
# or checkpoint that got the lock in between wrote under the new owner's name (its condition is
# "actual owner == the lease's", which the handed-over lease satisfies) and won. These tests put a
# write exactly there: the slot holding the lease as the release's write left it.


def _given_up(
    table: FaultyRenewTable, holder: LeaseHolder, to: str | None
) -> tuple[uuid.UUID, int]:
    held = holder.add_taken(take(table, "worker-a"))
    if to is None:
        after = holder.update(KEY, held.token, table.evict_lease)
    else:
        begun = table.initiate_handoff(stored(table), to)
        assert begun is not None
        after = holder.update(KEY, held.token, lambda _: table.complete_handoff(begun))
    assert after.lease is not None and after.lease.actual_owner == to
    return held.token, after.lease.lease_counter


@pytest.mark.parametrize("to", [None, "worker-b"])
def test_a_renewal_in_the_slot_a_release_left_writes_nothing(
    table: FaultyRenewTable, holder: LeaseHolder, to: str | None
) -> None:
    _, counter = _given_up(table, holder, to)
    calls = table.renew_calls
    report = holder.renew_all()
    assert report.renewed == () and report.lost == ()
    assert table.renew_calls == calls and stored(table).lease_counter == counter


@pytest.mark.parametrize("to", [None, "worker-b"])
def test_a_checkpoint_in_the_slot_a_release_left_writes_nothing(
    table: FaultyRenewTable, holder: LeaseHolder, to: str | None
) -> None:
    token, counter = _given_up(table, holder, to)
    result = holder.update(
        KEY, token, lambda lease: table.update_checkpoint(lease, ExtendedSequenceNumber("7"))
    )
    assert result.loss is LeaseLoss.NOT_HELD
    assert stored(table).lease_counter == counter and stored(table).checkpoint == TRIM_HORIZON


class HeldRenewTable(MemoryLeaseTable):
    """Each renewal waits for ``go`` once ``armed``: a slow lease-table call."""

    def __init__(self) -> None:
        super().__init__()
        self.armed, self.entered, self.go = False, threading.Event(), threading.Event()

    def renew_lease(self, lease: Lease) -> Lease | None:
        if self.armed:
            self.entered.set()
            assert self.go.wait(10)
        return super().renew_lease(lease)


def _checkpoint_through_the_holder(table: MemoryLeaseTable, holder: LeaseHolder,
                                   token: uuid.UUID) -> None:  # fmt: skip
    result = holder.update(KEY, token, lambda lease: table.update_checkpoint(
        lease, ExtendedSequenceNumber("5")))  # fmt: skip
    assert result.loss is LeaseLoss.EXPIRED


def _checkpoint_through_a_checkpointer(table: MemoryLeaseTable, holder: LeaseHolder,
                                       token: uuid.UUID) -> None:  # fmt: skip
    """The Spark sink's pending checkpoints and commits: refused before any write is tried."""
    checkpointer = Checkpointer(holder, KEY, token, ExtendedSequenceNumber("9"))
    with pytest.raises(CheckpointError, match="doesn't hold the lease"):
        checkpointer.prepare_checkpoint("5")


@pytest.mark.parametrize(
    "write", [_checkpoint_through_the_holder, _checkpoint_through_a_checkpointer]
)
def test_a_write_refused_as_expired_ends_the_tenure_a_late_renewal_cannot_revive(
    clock: ManualClock, write: Callable[[MemoryLeaseTable, LeaseHolder, uuid.UUID], None]
) -> None:
    """A renewal began before local expiry and its call was slow; a checkpoint write just past
    expiry was refused (the Spark sink closed the lease's lane for good), then the renewal
    landed and the lease was held again, same token: its consumer read on, nothing written or
    checkpointed, until the shard's end. The refusal ends the tenure; the late renewal is
    reported lost. A checkpointer refuses such a write before it reaches the holder's update:
    it ended nothing there (a helper's review found it)."""
    table = HeldRenewTable()
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION - 1.0)
    table.armed = True
    reports: list[RenewalReport] = []
    renewer = threading.Thread(target=lambda: reports.append(holder.renew_all(wait=5.0)))
    renewer.start()
    assert table.entered.wait(5)
    clock.advance(1.5)  # past local expiry while the renewal's call is under way
    write(table, holder, held.token)
    table.go.set()
    renewer.join(5)
    assert holder.get_if_held(KEY) is None and not holder.held()
    (report,) = reports
    assert [x.lease_key for x in report.lost] == [KEY] and report.renewed == ()


def test_a_write_of_an_old_tenure_refused_as_expired_leaves_a_retaken_one(
    table: FaultyRenewTable, holder: LeaseHolder, clock: ManualClock
) -> None:
    """The refusal ends the writer's tenure only: an old tenure's write that found the slot
    just filled by a retake (its lock held by add_taken) dropped the new tenure, whose
    consumer then lost a lease still ours in the table."""
    old = holder.add_taken(take(table, "worker-a"))
    clock.advance(DURATION + 1.0)
    new = holder.add_taken(table.take_lease(stored(table), "worker-a"))  # type: ignore[arg-type]
    slot = holder._slots[KEY]
    assert holder._refused_expired(KEY, slot, old.token).loss is LeaseLoss.EXPIRED
    assert holder.get_if_held(KEY) == new
    assert holder._refused_expired(KEY, slot, new.token).loss is LeaseLoss.EXPIRED
    assert holder.get_if_held(KEY) is None
