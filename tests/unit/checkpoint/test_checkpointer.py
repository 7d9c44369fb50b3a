"""Checkpointer: kclpy's validation and error values, SHARD_END, two-phase, and fencing."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import (
    CheckpointRegressionError,
    CorruptLeaseError,
    DependencyError,
    KclpySparkError,
    ResourceNotFoundError,
    ThrottledError,
)
from checkpoint.base.retry import RetryPolicy
from checkpoint.checkpointer import (
    DEPENDENCY,
    ILLEGAL_ARGUMENT,
    INVALID_STATE,
    SHUTDOWN,
    THROTTLING,
    Checkpointer,
    CheckpointError,
    LeaseLostCheckpointer,
)
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable

KEY = "shardId-000000000000"
DURATION = 10.0  # failoverTimeMillis 10 000
LAST = ExtendedSequenceNumber("100")
LARGEST = ExtendedSequenceNumber("200")
WRITES = ("update_checkpoint", "update_lease")


def esn(seq: str, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(seq, sub)


class FaultyTable(MemoryLeaseTable):
    """Counts write calls and raises queued errors from them (the KCL's ExceptionThrowing...)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[Exception] = []
        self.write_calls = 0
        self._nested = False  # MemoryLeaseTable.update_checkpoint calls update_lease: count once

    def fail_next(self, error: Exception, times: int = 1) -> None:
        self.errors.extend([error] * times)

    def _maybe_fail(self) -> None:
        self.write_calls += 1
        if self.errors:
            raise self.errors.pop(0)

    def update_lease(self, lease: Lease) -> Lease | None:
        if not self._nested:
            self._maybe_fail()
        return super().update_lease(lease)

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        self._maybe_fail()
        self._nested = True
        try:
            return super().update_checkpoint(lease, checkpoint, pending)
        finally:
            self._nested = False


@dataclass
class Worker:
    """One worker's view: its own clock and holder over a shared table."""

    table: FaultyTable
    name: str
    clock: ManualClock = field(default_factory=ManualClock)
    sleeps: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.holder = LeaseHolder(self.table, self.name, self.clock, DURATION)

    def take(self, largest: ExtendedSequenceNumber = LARGEST) -> Checkpointer:
        current = self.table.get_lease(KEY)
        assert current is not None
        taken = self.table.take_lease(current, self.name)
        assert taken is not None
        held = self.holder.add_taken(taken)
        return Checkpointer(
            self.holder,
            KEY,
            held.token,
            largest,
            retry_policy=RetryPolicy(base_delay=0.01, max_delay=0.05, max_attempts=4),
            sleep=self.sleeps.append,
        )


@pytest.fixture
def table() -> FaultyTable:
    table = FaultyTable()
    table.create_lease_if_absent(Lease(KEY, LAST))
    return table


@pytest.fixture
def worker(table: FaultyTable) -> Worker:
    return Worker(table, "worker-a")


@pytest.fixture
def cp(worker: Worker) -> Checkpointer:
    return worker.take()


def stored(table: MemoryLeaseTable) -> Lease:
    lease = table.get_lease(KEY)
    assert lease is not None
    return lease


@contextmanager
def raises(value: str) -> Iterator[pytest.ExceptionInfo[CheckpointError]]:
    """pytest.raises(CheckpointError) that also checks kclpy's ``value``."""
    with pytest.raises(CheckpointError) as info:
        yield info
    assert info.value.value == value, f"expected {value}, got {info.value!r}"


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq", "sub", "stored_after"),
    [
        (None, None, LARGEST),  # None: the last record delivered
        (None, 5, LARGEST),  # as kclpy's daemon: the sub-sequence is ignored without a sequence
        ("150", None, esn("150")),
        ("150", 3, esn("150", 3)),
        ("200", 0, LARGEST),  # the upper bound is included
        ("100", None, LAST),  # the lower bound too (nothing to write)
    ],
)
def test_valid_checkpoints_are_stored(
    table: FaultyTable,
    cp: Checkpointer,
    seq: str | None,
    sub: int | None,
    stored_after: ExtendedSequenceNumber,
) -> None:
    cp.checkpoint(seq, sub)
    assert stored(table).checkpoint == stored_after


@pytest.mark.parametrize(
    ("seq", "sub"),
    [
        ("99", None),  # below the last checkpoint
        ("201", None),  # above the largest permitted
        ("200", 1),  # above it by a sub-sequence number
        ("abc", None),
        ("", None),
        ("-150", None),
        ("1.5", None),
        ("SHARD_END", None),  # a sentinel is not a sequence number the application may pass
        ("150", -1),  # negative sub-sequence number
        # Past a Java long: DynamoDB stored it, then every read of the lease table refused it
        # (no lease taken by any worker, a Java KCL's included).
        ("150", 2**63),
        (150, None),  # not a str
        ("150", "1"),
        ("150", True),
    ],
)
def test_invalid_checkpoints_raise_illegal_argument_and_write_nothing(
    table: FaultyTable, cp: Checkpointer, seq: object, sub: object
) -> None:
    before = stored(table)
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint(seq, sub)  # type: ignore[arg-type]
    with raises(ILLEGAL_ARGUMENT):
        cp.prepare_checkpoint(seq, sub)  # type: ignore[arg-type]
    assert stored(table) == before and table.write_calls == 0


def test_checkpoint_moves_the_lower_bound(table: FaultyTable, cp: Checkpointer) -> None:
    cp.checkpoint("180")
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("150")
    assert stored(table).checkpoint == esn("180")
    assert stored(table).owner_switches_since_checkpoint == 0


def test_largest_permitted_follows_deliveries(table: FaultyTable, cp: Checkpointer) -> None:
    cp.set_largest_permitted(esn("300", 2))
    assert cp.largest_permitted == esn("300", 2)
    cp.checkpoint()
    assert stored(table).checkpoint == esn("300", 2)


def test_before_any_delivery_checkpoint_writes_nothing(worker: Worker, table: FaultyTable) -> None:
    cp = worker.take(largest=LAST)  # the worker starts with the lease's own checkpoint
    cp.checkpoint()
    assert table.write_calls == 0 and stored(table).checkpoint == LAST


# --- SHARD_END (KCL #211) ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("last_sequence", "seq", "expected"),
    [
        (None, None, SHARD_END),
        (None, "200", SHARD_END),  # the last delivered record of the closed shard
        (esn("250"), "250", SHARD_END),
        (None, "150", esn("150")),  # earlier positions stay positions
    ],
)
def test_shard_end_conversion(
    table: FaultyTable,
    cp: Checkpointer,
    last_sequence: ExtendedSequenceNumber | None,
    seq: str | None,
    expected: ExtendedSequenceNumber,
) -> None:
    cp.mark_shard_end(last_sequence)
    assert cp.largest_permitted == SHARD_END
    cp.checkpoint(seq)
    assert stored(table).checkpoint == expected


def test_a_checkpoint_at_the_name_shard_end_at_a_closed_shards_end_is_shard_end(
    table: FaultyTable, cp: Checkpointer
) -> None:
    """The KCL accepts ``checkpoint("SHARD_END")`` there (a MultiLang app's way): it was refused
    as no sequence number, the shard-end step failed until the lease parked, children waited."""
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("SHARD_END")  # not at the shard's end yet
    cp.mark_shard_end()
    cp.checkpoint("SHARD_END")
    assert stored(table).checkpoint == SHARD_END


def test_checkpoint_at_shard_end_is_final(table: FaultyTable, cp: Checkpointer) -> None:
    cp.mark_shard_end()
    cp.checkpoint()
    cp.checkpoint()  # again: already stored, nothing to write
    assert table.write_calls == 1
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("150")  # nothing comes after SHARD_END


# --- two-phase -----------------------------------------------------------------------------------


def test_prepare_then_commit(table: FaultyTable, cp: Checkpointer) -> None:
    prepared = cp.prepare_checkpoint("150", 2, application_state=b"state")
    assert prepared.pending == esn("150", 2)
    lease = stored(table)
    assert lease.checkpoint == LAST
    assert lease.pending_checkpoint == esn("150", 2)
    assert lease.pending_checkpoint_state == b"state"
    prepared.checkpoint()
    lease = stored(table)
    assert lease.checkpoint == esn("150", 2)
    assert lease.pending_checkpoint is None and lease.pending_checkpoint_state is None


def test_prepare_at_shard_end_prepares_shard_end(table: FaultyTable, cp: Checkpointer) -> None:
    cp.mark_shard_end()
    prepared = cp.prepare_checkpoint()
    assert stored(table).pending_checkpoint == SHARD_END
    prepared.checkpoint()
    assert stored(table).checkpoint == SHARD_END


@pytest.mark.parametrize(("prepared_at", "expected"), [("200", SHARD_END), ("150", esn("150"))])
def test_a_commit_after_the_shard_end_of_the_last_record_prepared_is_shard_end(
    table: FaultyTable, cp: Checkpointer, prepared_at: str, expected: ExtendedSequenceNumber
) -> None:
    """Prepared at the closed shard's last record in process_records, committed in
    shard_ended: it was stored as that record, the shard-end step failed every time (it wants
    SHARD_END) and parked the lease, tenure after tenure; its children never started."""
    prepared = cp.prepare_checkpoint(prepared_at)
    cp.mark_shard_end()
    prepared.checkpoint()
    assert stored(table).checkpoint == expected and stored(table).pending_checkpoint is None


def test_prepare_at_the_last_checkpoint_writes_nothing(
    table: FaultyTable, cp: Checkpointer
) -> None:
    prepared = cp.prepare_checkpoint("100")
    prepared.checkpoint()
    assert table.write_calls == 0


def test_prepare_at_the_last_checkpoint_replaces_a_pending_checkpoint_beyond_it(
    table: FaultyTable, cp: Checkpointer
) -> None:
    """It wrote nothing, so the pending 150 stayed: a sink reading its pending checkpoint at a
    restart re-formed a range it was no longer writing (the KCL writes the pending value)."""
    cp.prepare_checkpoint("150")
    cp.prepare_checkpoint("100")  # the stored checkpoint
    lease = stored(table)
    assert lease.checkpoint == LAST and lease.pending_checkpoint in (None, LAST)
    writes = table.write_calls
    cp.prepare_checkpoint("100")  # again: nothing more to write
    assert table.write_calls == writes


def test_checkpoint_clears_a_pending_checkpoint(table: FaultyTable, cp: Checkpointer) -> None:
    cp.prepare_checkpoint("150")
    cp.checkpoint("120")
    assert stored(table).pending_checkpoint is None
    assert stored(table).checkpoint == esn("120")


def test_checkpoint_keeping_pending_keeps_only_a_pending_checkpoint_beyond_it(
    table: FaultyTable, cp: Checkpointer
) -> None:
    """Pipelined batches: committing the first while a later one's pending checkpoint is stored
    keeps that one (and its state); committing up to it clears it."""
    cp.prepare_checkpoint("150", application_state=b"two in flight")
    cp.checkpoint_keeping_pending("120")
    lease = stored(table)
    assert lease.checkpoint == esn("120") and lease.pending_checkpoint == esn("150")
    assert lease.pending_checkpoint_state == b"two in flight"
    cp.checkpoint_keeping_pending("150")
    lease = stored(table)
    assert lease.checkpoint == esn("150")
    assert lease.pending_checkpoint is None and lease.pending_checkpoint_state is None
    writes = table.write_calls
    cp.checkpoint_keeping_pending("150")  # already stored: nothing to write
    assert table.write_calls == writes
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint_keeping_pending("120")  # never backwards


def test_commit_after_lease_loss_raises_shutdown(
    worker: Worker, table: FaultyTable, cp: Checkpointer
) -> None:
    prepared = cp.prepare_checkpoint("150")
    worker.holder.drop(KEY)
    before = stored(table)
    with raises(SHUTDOWN):
        prepared.checkpoint()
    assert stored(table) == before


# --- lease loss: nothing is written --------------------------------------------------------------


@pytest.mark.parametrize("a_clock_runs", [False, True], ids=["a-paused", "a-clock-ran"])
def test_fencing_after_failover(table: FaultyTable, a_clock_runs: bool) -> None:
    """A holds the lease; B sees its counter stand still for longer than the failover time on B's
    own clock and takes it; A's checkpoint then fails with ShutdownException and B's checkpoint is
    what the store keeps. Whether A noticed (its clock ran) or not (paused), A writes nothing."""
    a, b = Worker(table, "worker-a"), Worker(table, "worker-b")
    a_cp = a.take()
    seen_by_b = stored(table)  # B's scan; B's clock starts counting from here
    b.clock.advance(DURATION + 0.001)
    if a_clock_runs:
        a.clock.advance(DURATION + 0.001)
    assert stored(table).lease_counter == seen_by_b.lease_counter  # expired in B's eyes
    b_cp = b.take()
    b_cp.checkpoint("120")
    writes_before = table.write_calls
    after_b = stored(table)

    with raises(SHUTDOWN):
        a_cp.checkpoint("180")
    with raises(SHUTDOWN):
        a_cp.prepare_checkpoint("180")

    assert stored(table) == after_b
    assert after_b.checkpoint == esn("120") and after_b.lease_owner == "worker-b"
    assert a.holder.get_if_held(KEY) is None
    # A paused: it tried one conditional write, which lost. A's clock ran: it did not even try.
    assert table.write_calls == writes_before + (0 if a_clock_runs else 1)


def test_token_change_refuses_the_old_checkpointer(worker: Worker, table: FaultyTable) -> None:
    old = worker.take()
    assert table.evict_lease(stored(table)) is not None
    new = worker.take()  # taken again: a new tenure, a new token
    with raises(SHUTDOWN):
        old.checkpoint("150")
    assert table.write_calls == 0
    new.checkpoint("150")
    assert stored(table).checkpoint == esn("150")


def test_lost_conditional_write_writes_nothing(
    worker: Worker, table: FaultyTable, cp: Checkpointer
) -> None:
    moved = table.renew_lease(stored(table))  # the counter moves without our holder seeing it
    assert moved is not None
    with raises(SHUTDOWN):
        cp.checkpoint("150")
    assert stored(table) == moved
    assert worker.holder.get_if_held(KEY) is None
    with raises(SHUTDOWN):
        cp.checkpoint("150")  # and it stays lost, without another write
    assert table.write_calls == 1


def test_lease_lost_checkpointer_always_refuses() -> None:
    lost = LeaseLostCheckpointer()
    with raises(SHUTDOWN):
        lost.checkpoint()
    with raises(SHUTDOWN):
        lost.prepare_checkpoint("1")


# --- infrastructure failures ---------------------------------------------------------------------


def test_throttling_is_retried_then_succeeds(
    worker: Worker, table: FaultyTable, cp: Checkpointer
) -> None:
    table.fail_next(ThrottledError("ProvisionedThroughputExceeded"), times=3)
    cp.checkpoint("150")
    assert stored(table).checkpoint == esn("150")
    assert table.write_calls == 4 and len(worker.sleeps) == 3


def test_throttling_that_persists_raises_throttling_exception(
    worker: Worker, table: FaultyTable, cp: Checkpointer
) -> None:
    table.fail_next(ThrottledError("ProvisionedThroughputExceeded"), times=10)
    before = stored(table)
    with raises(THROTTLING) as info:
        cp.checkpoint("150")
    assert info.value.retry_may_help
    assert table.write_calls == 4 and stored(table) == before
    assert worker.holder.get_if_held(KEY) is not None  # throttled, not lost


@pytest.mark.parametrize(
    ("error", "value", "attempts"),
    [
        (DependencyError("InternalServerError"), DEPENDENCY, 1),  # outcome unknown: no retry
        (CorruptLeaseError(KEY, "checkpoint is not a string"), INVALID_STATE, 1),
        (ResourceNotFoundError("no table"), INVALID_STATE, 1),
    ],
)
def test_dependency_failures_map_to_kclpy_values(
    table: FaultyTable, cp: Checkpointer, error: Exception, value: str, attempts: int
) -> None:
    table.fail_next(error, times=5)
    with raises(value) as info:
        cp.checkpoint("150")
    assert info.value.__cause__ is error
    assert table.write_calls == attempts


def test_checkpoint_error_looks_like_kclpys() -> None:
    err = CheckpointError(SHUTDOWN, "lease lost")
    assert isinstance(err, KclpySparkError)
    assert err.value == "ShutdownException"
    assert str(err) == "ShutdownException: lease lost"
    assert CheckpointError(INVALID_STATE).value == str(CheckpointError(INVALID_STATE))
    assert not err.retry_may_help


def test_checkpoint_of_a_lease_starting_at_a_sentinel(table: FaultyTable) -> None:
    table.create_lease_if_absent(Lease("shardId-000000000009", TRIM_HORIZON))
    worker = Worker(table, "worker-a")
    current = table.get_lease("shardId-000000000009")
    assert current is not None
    taken = table.take_lease(current, "worker-a")
    assert taken is not None
    held = worker.holder.add_taken(taken)
    cp = Checkpointer(worker.holder, "shardId-000000000009", held.token, TRIM_HORIZON)
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("1")  # nothing delivered yet
    cp.set_largest_permitted(esn("5"))
    cp.checkpoint("1")
    held_now = worker.holder.get_if_held("shardId-000000000009")
    assert held_now is not None
    assert table.get_lease("shardId-000000000009") == held_now.lease
    assert held_now.lease.checkpoint == esn("1")


# --- concurrent checkpoints never move the stored checkpoint back (issue 14, finding 3) ----------


class PausingHolder(LeaseHolder):
    """Fault injection: the first ``update`` stops at its door until ``go`` is set, so another
    thread's checkpoint can overtake it (the interleaving that used to write 100 over 200)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.paused = threading.Event()
        self.go = threading.Event()
        self._first = True

    def update(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        if self._first:
            self._first = False
            self.paused.set()
            assert self.go.wait(10.0)
        return super().update(*args, **kwargs)  # type: ignore[arg-type]


def _overtaken(table: FaultyTable, later: Callable[[Checkpointer], None]) -> list[object]:
    """checkpoint("150") stops at the holder's door; ``later`` runs to completion; then the first
    goes on. Returns what the first call raised (or returned)."""
    clock = ManualClock()
    holder = PausingHolder(table, "worker-a", clock, DURATION)
    current = table.get_lease(KEY)
    assert current is not None
    taken = table.take_lease(current, "worker-a")
    assert taken is not None
    held = holder.add_taken(taken)
    cp = Checkpointer(holder, KEY, held.token, LARGEST, sleep=lambda s: None)
    outcome: list[object] = []

    def first() -> None:
        try:
            cp.checkpoint("150")
            outcome.append("written")
        except CheckpointError as exc:
            outcome.append(exc.value)

    thread = threading.Thread(target=first)
    thread.start()
    assert holder.paused.wait(10.0)
    holder._first = False
    later(cp)
    holder.go.set()
    thread.join(10.0)
    return outcome


def test_an_overtaken_smaller_checkpoint_is_refused_not_written_over_a_larger_one(
    table: FaultyTable,
) -> None:
    outcome = _overtaken(table, lambda cp: cp.checkpoint("180"))
    assert outcome == [ILLEGAL_ARGUMENT]
    assert stored(table).checkpoint == esn("180")


def test_an_overtaken_checkpoint_never_moves_a_parent_off_shard_end(table: FaultyTable) -> None:
    def shard_end(cp: Checkpointer) -> None:
        cp.mark_shard_end()
        cp.checkpoint()

    outcome = _overtaken(table, shard_end)
    assert outcome == [ILLEGAL_ARGUMENT]
    assert stored(table).checkpoint == SHARD_END


def test_racing_checkpoint_threads_end_at_the_maximum(table: FaultyTable) -> None:
    worker = Worker(table, "worker-a")
    cp = worker.take(largest=esn("1000"))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    refused: list[str] = []

    def run(values: range) -> None:
        for value in values:
            try:
                cp.checkpoint(str(value))
            except CheckpointError as exc:
                refused.append(exc.value)

    try:
        threads = [threading.Thread(target=run, args=(range(101 + i, 1001, 4),)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert stored(table).checkpoint == esn("1000")
    assert set(refused) <= {ILLEGAL_ARGUMENT}


def test_the_store_refuses_a_backward_checkpoint_write(table: FaultyTable) -> None:
    lease = table.take_lease(stored(table), "worker-a")
    assert lease is not None
    forward = table.update_checkpoint(lease, esn("150"))
    assert forward is not None
    with pytest.raises(CheckpointRegressionError):
        table.update_checkpoint(forward, esn("120"))
    assert stored(table) == forward


# --- a checkpoint names a record this lease delivered (issue 15) --------------------------------


def test_a_sequence_number_inside_the_range_but_not_delivered_is_refused(
    table: FaultyTable, cp: Checkpointer
) -> None:
    """It used to be accepted (it lies numerically between the last checkpoint and the last
    record delivered); on restart the lease was then parked as older than the retention."""
    delivered = ["110", "120", "130"]
    cp.set_largest_permitted(esn("130"), delivered)
    with raises(ILLEGAL_ARGUMENT) as info:
        cp.checkpoint("125")  # e.g. a record of another shard
    assert "no record this lease delivered" in str(info.value)
    assert table.write_calls == 0
    cp.checkpoint("120")
    assert stored(table).checkpoint == esn("120")
    cp.set_largest_permitted(esn("150"), ["140", "150"])
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("145")
    cp.checkpoint("150")
    cp.checkpoint()  # no argument: the last record delivered, always fine
    assert stored(table).checkpoint == esn("150")


def test_a_checkpoint_at_the_lease_checkpoint_the_tenure_started_from_is_allowed(
    table: FaultyTable, worker: Worker
) -> None:
    """As the KCL (a checkpoint may equal the last one): an app that checkpoints at the sequence
    number its initialize gave it, after a batch was delivered, was refused as naming no record
    delivered."""
    start = stored(table).checkpoint
    cp = worker.take(largest=start)  # as a tenure makes it: nothing delivered yet
    cp.set_largest_permitted(esn("130"), ["110", "120", "130"])
    cp.checkpoint(start.sequence_number)
    assert stored(table).checkpoint == start
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("105")  # between the start and the batch: still no record delivered


def test_a_batch_that_failed_is_forgotten_with_its_records(
    table: FaultyTable, cp: Checkpointer
) -> None:
    cp.set_largest_permitted(esn("120"), ["110", "120"])
    cp.set_largest_permitted(esn("140"), ["130", "140"])
    cp.set_largest_permitted(esn("120"))  # process_records of the second batch raised
    with raises(ILLEGAL_ARGUMENT):
        cp.checkpoint("130")
    cp.checkpoint("110")


def test_delivered_records_are_bounded_and_forgotten_ranges_fall_back_to_the_range_check() -> None:
    from checkpoint.delivered import DeliveredRecords

    seen = DeliveredRecords(max_records=4)
    for first in range(0, 40, 2):  # 20 batches of 2
        seen.delivered([str(100 + first), str(101 + first)], esn(str(101 + first)))
    assert seen.names_a_record(esn("137")) and seen.names_a_record(esn("139"))
    assert not seen.names_a_record(esn("1370"))  # beyond every batch
    assert seen.names_a_record(esn("102"))  # forgotten: only the range check applies
    seen.checkpointed(esn("139"))
    assert seen.names_a_record(esn("139"))  # the same checkpoint again is fine
    assert not seen.names_a_record(esn("140"))  # nothing delivered after it


DELIVERED_BASE = 49_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000


def _traced_growth(work: Callable[[], None]) -> int:
    """Bytes ``work()`` left allocated (tracemalloc, after a full collection first)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_delivered_records_keep_eight_bytes_per_record_not_the_records_strings() -> None:
    """It used to keep every sequence-number string alive (about 100 bytes each, plus a set
    per batch looked up): up to ~150 MB per lease that checkpoints rarely."""
    from checkpoint.delivered import DeliveredRecords

    seen = DeliveredRecords()
    base = DELIVERED_BASE

    def deliver() -> None:
        for batch in range(50):  # 50 000 records, each batch's strings freed after delivery
            seqs = [str(base + batch * 1000 + i) for i in range(1000)]
            seen.delivered(seqs, esn(seqs[-1]))
            del seqs

    grown = _traced_growth(deliver)
    assert grown < 50_000 * 12  # ~8 bytes a record and a little per batch
    inside = base + 7 * 1000 + 500
    assert seen.names_a_record(esn(str(inside)))
    assert seen.names_a_record(esn(str(base + 49 * 1000 + 999)))
    assert not seen.names_a_record(esn(str(base + 49 * 1000 + 999 + 1)))


def test_delivered_records_of_one_record_batches_stay_near_the_bound() -> None:
    """A quiet shard gives a record or two a call; a processor that checkpoints rarely kept each
    as a batch of its own, ~500 bytes, so the 250,000-record bound was ~120 MB a lease."""
    from checkpoint.delivered import BATCH_WEIGHT, MAX_RECORDS, DeliveredRecords

    seen = DeliveredRecords()
    base = DELIVERED_BASE

    def deliver() -> None:
        for n in range(20_000):
            text = str(base + n)
            seen.delivered([text], esn(text))

    grown = _traced_growth(deliver)
    assert len(seen._batches) <= MAX_RECORDS // (1 + BATCH_WEIGHT)
    assert grown < 4_000_000
    assert seen.names_a_record(esn(str(base + 19_999)))


def test_a_batch_that_raised_after_a_checkpoint_keeps_what_it_checkpointed(
    table: FaultyTable, cp: Checkpointer
) -> None:
    """Rolling "the last record delivered" back below a checkpoint the batch itself wrote made
    a later no-argument checkpoint() (e.g. in shutdown_requested) fail as backwards."""
    cp.set_largest_permitted(esn("120"), ["110", "120"])
    cp.checkpoint()
    cp.set_largest_permitted(esn("150"), ["130", "140", "150"])
    cp.checkpoint("140")  # part of the batch, then process_records raises
    cp.set_largest_permitted(esn("120"))  # the consumer rolls back to the previous batch
    assert cp.largest_permitted == esn("140")
    cp.checkpoint()  # fine: at what is stored
    assert stored(table).checkpoint == esn("140")


def test_acheckpoint_writes_from_a_thread() -> None:
    import asyncio

    table = FaultyTable()
    table.create_lease_if_absent(Lease(KEY, LAST))
    cp = Worker(table, "worker-a").take()
    cp.set_largest_permitted(esn("130"), ["110", "120", "130"])
    loop_thread: list[int] = []

    async def main() -> None:
        loop_thread.append(threading.get_ident())
        await cp.acheckpoint("120")

    writers: list[int] = []
    original = table.update_checkpoint

    def spy(*args: object, **kwargs: object) -> Lease | None:
        writers.append(threading.get_ident())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    table.update_checkpoint = spy  # type: ignore[method-assign]
    asyncio.run(main())
    assert stored(table).checkpoint == esn("120")
    assert writers and writers[0] != loop_thread[0]


@pytest.mark.parametrize("state", ["text", bytearray(b"x"), 7])
def test_application_state_that_a_store_would_refuse_or_change_is_illegal(
    table: FaultyTable, cp: Checkpointer, state: object
) -> None:
    """Memory kept a str, SQLite refused it as a corrupt lease, DynamoDB gave bytes back."""
    before = stored(table)
    with raises(ILLEGAL_ARGUMENT):
        cp.prepare_checkpoint("150", application_state=state)  # type: ignore[arg-type]
    assert stored(table) == before and table.write_calls == 0


def test_the_codec_writes_no_number_its_readers_would_refuse() -> None:
    from checkpoint.sequence import ExtendedSequenceNumber
    from checkpoint.stores.dynamo_codec import n_value

    assert n_value(2**63 - 1) == {"N": str(2**63 - 1)}
    with pytest.raises(ValueError, match="Java long"):
        n_value(2**63)
    with pytest.raises(ValueError, match="sub-sequence"):
        ExtendedSequenceNumber("150", 2**63)


def test_a_checkpoint_at_an_aggregate_given_whole_below_a_stored_sub_record_writes_nothing(
    table: FaultyTable, worker: Worker
) -> None:
    """kpl_deaggregation off after a checkpoint at sub-record 5 of aggregate 150: the aggregate
    is given whole as (150, 0), below what is stored. A checkpoint at it was refused as going
    back, and the lease stalled on it (a quiet shard, or the end of a batch)."""
    current = table.get_lease(KEY)
    assert current is not None
    assert table.update_checkpoint(current, esn("150", 5)) is not None
    cp = worker.take(largest=esn("150"))
    cp.checkpoint()
    cp.checkpoint("150", 0)
    cp.prepare_checkpoint("150")
    assert stored(table).checkpoint == esn("150", 5)
    with raises(ILLEGAL_ARGUMENT):  # still no going back past the aggregate
        cp.checkpoint("140")
