"""MicroBatcher without Spark: flush rules, stable ids, acknowledgments and checkpoints, retries,
parking, dead letters, re-forming a pending piece after a crash, backpressure and timeouts.

Real Checkpointers over a MemoryLeaseTable, a ManualClock and a fake sink; no sleeping: manual mode
(``threaded=False``) drives the batcher with ``step()``, threaded tests wait on events.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError, ThrottledError
from checkpoint.base.retry import RetryPolicy
from checkpoint.checkpointer import INVALID_STATE, THROTTLING, Checkpointer, CheckpointError
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from checkpoint.stores.sqlite import SQLiteLeaseTable
from checkpoint.stores.sqlite_pool import POOL_SIZE
from kclpy_spark.processor import Record
from kclpy_spark.spark.lane import Lane, LaneClosedError, LaneState
from kclpy_spark.spark.micro_batcher import (
    BatcherClosedError,
    BatcherSettings,
    DrainResult,
    MicroBatcher,
    SinkParkedError,
)
from kclpy_spark.spark.pieces import (
    InFlight,
    PendingState,
    Piece,
    PieceKey,
    batch_id_of,
    records_to_chunk,
)
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.writer import WriteTimeoutError
from tests.resources import descriptors_under

SHARDS = ("shardId-000000000000", "shardId-000000000001")
NO_RETRY = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=1)


def esn(seq: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), sub)


def records(first: int, count: int) -> list[Record]:
    """Sequence numbers first*10, (first+1)*10, ... (gaps, like Kinesis)."""
    return [Record(f"r{i}".encode(), f"k{i}", str(i * 10)) for i in range(first, first + count)]


class FakeSink:
    """Records successful writes; ``fail(batch)`` decides whether an attempt raises."""

    def __init__(self) -> None:
        self.fail: Callable[[SinkBatch], bool] = lambda batch: False
        self.attempts: list[tuple[int, int]] = []  # (batch_id, attempt)
        self.attempts_pieces: list[Piece] = []
        self.written: list[SinkBatch] = []
        self.on_write: Callable[[SinkBatch], None] = lambda batch: None

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {p.lease_key: f"token-{p.key.last}" for p in pieces}

    def write(self, batch: SinkBatch) -> None:
        self.attempts.append((batch.batch_id, batch.attempt))
        self.attempts_pieces += batch.pieces
        self.on_write(batch)
        if self.fail(batch):
            raise RuntimeError(f"boom on attempt {batch.attempt}")
        self.written.append(batch)

    def rows(self) -> list[tuple[str, str]]:
        out = []
        for batch in self.written:
            table = batch.table
            out += list(
                zip(
                    table.column("shard_id").to_pylist(),
                    table.column("sequence_number").to_pylist(),
                    strict=True,
                )
            )
        return out


@dataclass
class Env:
    """A lease table, one worker's holder and clock, a fake sink and a manual-mode batcher."""

    settings: BatcherSettings = field(default_factory=BatcherSettings)
    threaded: bool = False
    table: MemoryLeaseTable = field(default_factory=MemoryLeaseTable)
    clock: ManualClock = field(default_factory=ManualClock)
    sink: FakeSink = field(default_factory=FakeSink)
    sleeps: list[float] = field(default_factory=list)
    worker: str = "worker-a"

    def __post_init__(self) -> None:
        for shard in SHARDS:
            self.table.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
        self.holder = LeaseHolder(self.table, self.worker, self.clock, 1e9)
        self.batcher = self.new_batcher()
        self.cps: dict[str, Checkpointer] = {}
        self.lanes: dict[str, Lane] = {}

    def new_batcher(self, **kwargs: Any) -> MicroBatcher:
        return MicroBatcher(
            self.sink,
            self.settings,
            clock=self.clock,
            sleep=self.sleeps.append,
            threaded=self.threaded,
            **kwargs,
        )

    def take(self, shard: str, worker: str | None = None) -> Lane:
        """Take the lease (as ``worker``: a new holder, as after a crash) and open its lane."""
        if worker is not None:
            self.holder = LeaseHolder(self.table, worker, self.clock, 1e9)
        lease = self.table.get_lease(shard)
        assert lease is not None
        taken = self.table.take_lease(lease, self.holder.worker_id)
        assert taken is not None
        held = self.holder.add_taken(taken)
        cp = Checkpointer(self.holder, shard, held.token, taken.checkpoint, retry_policy=NO_RETRY)
        self.cps[shard] = cp
        lane = self.batcher.open_lane(shard, shard, cp, taken.checkpoint)
        self.lanes[shard] = lane
        return lane

    def take_lease_only(self, shard: str) -> None:
        """Take the lease with the current holder without opening its lane yet."""
        lease = self.table.get_lease(shard)
        assert lease is not None
        taken = self.table.take_lease(lease, self.holder.worker_id)
        assert taken is not None
        held = self.holder.add_taken(taken)
        self.cps[shard] = Checkpointer(
            self.holder, shard, held.token, taken.checkpoint, retry_policy=NO_RETRY
        )

    def open(self, shard: str) -> Lane:
        """Open the lane of a lease taken with take_lease_only."""
        lease = self.table.get_lease(shard)
        assert lease is not None
        lane = self.batcher.open_lane(shard, shard, self.cps[shard], lease.checkpoint)
        self.lanes[shard] = lane
        return lane

    def deliver(self, shard: str, recs: list[Record]) -> None:
        """What the consumer and processor do: widen the checkpointable range, then add."""
        last = recs[-1]
        self.cps[shard].set_largest_permitted(esn(int(last.sequence_number)))
        self.batcher.add(self.lanes[shard], records_to_chunk(recs, "stream", shard))

    def lease(self, shard: str) -> Lease:
        lease = self.table.get_lease(shard)
        assert lease is not None
        return lease


def manual(**settings: Any) -> Env:
    return Env(BatcherSettings(**settings))


def checkpoints_failing(env: Env, *errors: BaseException) -> list[BaseException]:
    """The table's checkpoint writes raise ``errors`` first (the last one first), then pass.
    Returns the errors not raised yet."""
    original = env.table.update_checkpoint
    left = list(errors)

    def flaky(lease: Lease, cp: ExtendedSequenceNumber, pending: Any = None) -> Lease | None:
        if left:
            raise left.pop()
        return original(lease, cp, pending)

    env.table.update_checkpoint = flaky  # type: ignore[method-assign]
    return left


# --- ids ----------------------------------------------------------------------------------------


def test_ids_are_pure_functions_of_the_pieces() -> None:
    a = PieceKey(SHARDS[0], esn(10), esn(50))
    b = PieceKey(SHARDS[1], esn(20, 1), esn(90))
    same_a = PieceKey(SHARDS[0], esn(10), esn(50))
    assert batch_id_of([a, b]) == batch_id_of([b, same_a])
    assert 0 <= batch_id_of([a, b]) < 2**63
    assert batch_id_of([a]) != batch_id_of([a, b])
    assert batch_id_of([a]) != batch_id_of([PieceKey(SHARDS[0], esn(10), esn(60))])
    assert a.piece_id == same_a.piece_id != b.piece_id
    assert a.piece_id.startswith("p") and len(a.piece_id) == 33
    state = PendingState((InFlight((a, b), {"v": 3}),))
    assert PendingState.decode(state.encode()) == state
    assert b"kclpy-spark-sink/1" in state.encode()  # one piece: the format earlier versions read
    two = PendingState((InFlight((a, b), 1), InFlight((PieceKey(SHARDS[0], esn(60), esn(70)),))))
    assert PendingState.decode(two.encode()) == two and b"kclpy-spark-sink/2" in two.encode()
    assert [k.last for k, _ in two.after(SHARDS[0], esn(50))] == [esn(70)]
    assert PendingState.decode(b"not ours") is None and PendingState.decode(None) is None


# --- flush rules --------------------------------------------------------------------------------


def test_nothing_is_written_before_a_limit_is_reached() -> None:
    env = manual(max_records=5, max_wait=10.0)
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 4))
    assert env.batcher.step() == 0
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


def test_flush_on_max_records_cuts_exactly_at_the_limit() -> None:
    env = manual(max_records=5, max_wait=10.0)
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 7))
    assert env.batcher.step() == 1
    [batch] = env.sink.written
    assert batch.rows == 5 and batch.pieces[0].key == PieceKey(SHARDS[0], esn(10), esn(50))
    assert env.lease(SHARDS[0]).checkpoint == esn(50)
    assert env.lease(SHARDS[0]).pending_checkpoint is None
    assert env.batcher.step() == 0  # 2 left, below every limit


def test_flush_on_max_bytes() -> None:
    env = manual(max_records=1000, max_bytes=2000, max_wait=10.0)
    env.take(SHARDS[0])
    big = [Record(b"x" * 300, "k", str(i * 10)) for i in range(1, 11)]  # ~3.5 kB of Arrow
    env.deliver(SHARDS[0], big)
    env.batcher.run_until_idle()
    sizes = [b.table.nbytes for b in env.sink.written]
    assert len(env.sink.written) >= 1 and all(size <= 2000 for size in sizes)
    assert sum(b.rows for b in env.sink.written) < 10 or len(env.sink.written) > 1


def test_flush_on_max_wait_uses_the_injected_clock() -> None:
    env = manual(max_records=100, max_wait=5.0)
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    env.clock.advance(4.9)
    assert env.batcher.step() == 0
    env.clock.advance(0.2)
    assert env.batcher.step() == 1
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_worker_scope_puts_every_lease_in_one_batch_lease_scope_does_not() -> None:
    for scope, batches in (("worker", 1), ("lease", 2)):
        env = manual(max_records=100, max_wait=1.0, scope=scope)
        for shard in SHARDS:
            env.take(shard)
            env.deliver(shard, records(1, 3))
        env.clock.advance(1.0)
        assert env.batcher.step() == batches, scope
        assert sorted(env.sink.rows()) == sorted(
            (shard, str(i * 10)) for shard in SHARDS for i in range(1, 4)
        )
        assert all(env.lease(s).checkpoint == esn(30) for s in SHARDS)


def test_a_cross_lease_batch_respects_max_records() -> None:
    env = manual(max_records=4, max_wait=100.0)
    for shard in SHARDS:
        env.take(shard)
        env.deliver(shard, records(1, 3))
    env.batcher.run_until_idle()
    assert [b.rows for b in env.sink.written] == [4]  # 2 left, not due
    env.clock.advance(100.0)
    env.batcher.run_until_idle()
    assert sorted(env.sink.rows()) == sorted((s, str(i * 10)) for s in SHARDS for i in (1, 2, 3))


# --- checkpoints follow writes ------------------------------------------------------------------


def test_the_pending_checkpoint_is_written_before_the_write_and_committed_after() -> None:
    env = manual(max_records=3)
    env.take(SHARDS[0])
    seen: list[Lease] = []
    env.sink.on_write = lambda batch: seen.append(env.lease(SHARDS[0]))
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    [during] = seen
    assert during.checkpoint == TRIM_HORIZON and during.pending_checkpoint == esn(30)
    state = PendingState.decode(during.pending_checkpoint_state)
    assert state is not None and [p.token for p in state.pieces] == ["token-30"]
    assert state.pieces[0].group == (PieceKey(SHARDS[0], esn(10), esn(30)),)
    after = env.lease(SHARDS[0])
    assert after.checkpoint == esn(30) and after.pending_checkpoint is None


def test_no_checkpoint_ever_passes_an_unwritten_record() -> None:
    """Checked at every write attempt: no stored checkpoint is beyond what was written."""
    env = manual(max_records=4, max_wait=1.0)
    checks = [0]

    def check(batch: SinkBatch) -> None:
        done: dict[str, int] = {}
        for shard, seq in env.sink.rows():
            done[shard] = max(done.get(shard, 0), int(seq))
        for shard in SHARDS:
            cp = env.lease(shard).checkpoint
            assert cp.is_sentinel or int(cp.sequence_number) <= done.get(shard, 0)
        checks[0] += 1

    env.sink.on_write = check
    env.sink.fail = lambda batch: batch.attempt == 1 and batch.batch_id % 2 == 0
    for shard in SHARDS:
        env.take(shard)
    for n in range(1, 40, 3):
        for shard in SHARDS:
            env.deliver(shard, records(n, 3))
        env.batcher.run_until_idle()
    env.clock.advance(1.0)
    env.batcher.run_until_idle()
    rows = env.sink.rows()
    assert len(rows) == len(set(rows)) == 2 * 39
    assert all(env.lease(s).checkpoint == esn(390) for s in SHARDS)
    assert checks[0] > len(env.sink.written) > 10  # some first attempts failed


# --- failures -----------------------------------------------------------------------------------


def test_a_failed_attempt_is_retried_with_backoff_and_written_once() -> None:
    env = manual(max_records=3, max_attempts=3, retry_base_delay=1.0, retry_max_delay=8.0)
    env.take(SHARDS[0])
    env.sink.fail = lambda batch: batch.attempt < 3
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    batch_id = batch_id_of([PieceKey(SHARDS[0], esn(10), esn(30))])
    assert env.sink.attempts == [(batch_id, 1), (batch_id, 2), (batch_id, 3)]
    assert len(env.sleeps) == 2 and all(0 <= s <= 8.0 for s in env.sleeps)
    assert len(env.sink.written) == 1 and env.lease(SHARDS[0]).checkpoint == esn(30)
    assert env.batcher.stats.failed_attempts == 2


class SyncFailsOnce(SQLiteLeaseTable):
    """A SQLite store whose first sync of a durability block fails (an fsync error); it notes
    its syncs, its pending checkpoint writes and (through the sink) the writes, in order."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, namespace="app")
        self.ensure_table()
        self.events: list[str] = []
        self.failed = False

    def sync(self) -> None:
        if not self.failed:
            self.failed = True
            self.events.append("sync failed")
            raise DependencyError("fsync: input/output error")
        self.events.append("synced")
        super().sync()

    def update_lease(self, lease: Lease) -> Lease | None:
        self.events.append("pending")
        return super().update_lease(lease)


def test_a_batchs_pending_checkpoints_are_on_disk_before_any_sink_writes(tmp_path: Path) -> None:
    """A batch's pending checkpoints are committed without waiting for the disk, then synced
    together before the sink writes. A sync that failed gives the batch up, unwritten (written
    again, they would not be durable either: the disk lost what it could not write); the lanes
    park, and their records are written once the disk syncs again."""
    table = SyncFailsOnce(tmp_path / "leases.db")
    env = Env(BatcherSettings(max_records=3, max_attempts=3), table=table)  # type: ignore[arg-type]
    env.sink.on_write = lambda batch: table.events.append("write")
    lanes = [env.take(SHARDS[0]), env.take(SHARDS[1])]
    env.deliver(SHARDS[0], records(1, 2))
    env.deliver(SHARDS[1], records(5, 1))
    env.batcher.step()
    assert table.events == ["pending", "pending", "sync failed"] and env.sink.attempts == []
    assert env.sleeps == []  # not retried
    assert all(env.batcher.lane_state(lane) is LaneState.PARKED for lane in lanes)
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    table.events.clear()
    for lane in lanes:  # re-armed (as at a shard end): the same pieces again
        assert env.batcher.drain(lane, None, final=True) is DrainResult.DONE
    written = table.events.index("write")
    assert table.events[:written][-1] == "synced" and "pending" in table.events[:written]
    assert env.lease(SHARDS[0]).checkpoint == esn(20) and env.lease(SHARDS[1]).checkpoint == esn(50)
    assert sorted(env.sink.rows()) == sorted(
        [(SHARDS[0], "10"), (SHARDS[0], "20"), (SHARDS[1], "50")]
    )
    table.close()


def test_after_the_last_attempt_the_lease_is_parked_and_nothing_is_checkpointed() -> None:
    env = manual(max_records=3, max_attempts=2)
    lane = env.take(SHARDS[0])
    env.sink.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    stored = env.lease(SHARDS[0])
    assert stored.checkpoint == TRIM_HORIZON and stored.pending_checkpoint == esn(30)
    with pytest.raises(SinkParkedError):
        env.deliver(SHARDS[0], records(4, 1))
    assert env.batcher.status()["lanes"][SHARDS[0]]["state"] == "parked"
    # Shard end re-arms the lane: the same piece (same id) is tried again and written.
    env.sink.fail = lambda batch: False
    assert env.batcher.drain(lane, None, final=True) is DrainResult.DONE
    assert [b.batch_id for b in env.sink.written] == [env.sink.attempts[0][0]]
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_rows_lost_on_the_executors_are_read_again_not_retried_parked_or_dead_lettered() -> None:
    """read_on = executors: an executor lost after a read took the rows it stored with it; every
    write of that frame fails the same way. The batch's pieces go back to be read again, pinned
    to their ends (the lane stays active), and the same batch is written from the new read."""
    from kclpy_spark.spark.frames import RangeChunk

    stored: list[SinkBatch] = []

    class DeadLetter:
        def write(self, batch: SinkBatch, error: BaseException) -> None:
            stored.append(batch)

    env = manual(max_records=3, max_attempts=5)
    env.batcher = env.new_batcher(dead_letter=DeadLetter())
    lane = env.take(SHARDS[0])

    def read(first: int, last: int) -> RangeChunk:
        return RangeChunk(None, esn(first), esn(last), read=object(), lease_key=SHARDS[0],
                          row_count=3, byte_count=30)  # fmt: skip

    env.cps[SHARDS[0]].set_largest_permitted(esn(30))
    env.batcher.add(lane, read(10, 30))
    lost = "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_3_0 not found!"
    env.sink.fail = lambda batch: len(env.sink.attempts) == 1  # the first write only
    original = env.sink.write

    def write(batch: SinkBatch) -> None:
        try:
            original(batch)
        except RuntimeError as exc:
            raise RuntimeError(lost) from exc

    env.sink.write = write  # type: ignore[method-assign]
    env.batcher.step()
    batch_id = batch_id_of([PieceKey(SHARDS[0], esn(10), esn(30))])
    assert env.sink.attempts == [(batch_id, 1)], "not retried: the same write fails again"
    assert stored == [] and env.batcher.stats.parked_batches == 0
    assert env.batcher.lane_state(lane) is LaneState.ACTIVE
    assert lane.unfilled() == (esn(30), esn(10)) and lane.read_to == esn(30)
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    env.batcher.add(lane, read(10, 30))  # the pinned read again
    env.batcher.run_until_idle()
    assert [b.batch_id for b in env.sink.written] == [batch_id]
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_reading_on_the_executors_a_rounds_lanes_go_in_one_batch_past_the_budget() -> None:
    """A round's reads are kept to the budget (at most 1.5 times it); cut by it again, the
    round's lanes went in two batches, each a write job, a sync and commits of its own. Lanes
    of another round wait for the next batch once the budget is spent: rounds that piled up
    while the writers were busy are not one batch of several budgets."""
    from kclpy_spark.spark.executor_reads import ExecutorReads, ReadSettings
    from kclpy_spark.spark.frames import RangeChunk
    from kclpy_spark.spark.range_tasks import AwsTarget

    env = manual(max_records=4, scope="worker")
    reads = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(max_records=4))
    env.batcher = env.new_batcher(reads=reads)
    third = "shardId-000000000002"
    env.table.create_lease_if_absent(Lease(third, TRIM_HORIZON))
    round_one, round_two = object(), object()
    try:
        for shard, read in ((SHARDS[0], round_one), (third, round_two), (SHARDS[1], round_one)):
            lane = env.take(shard)
            env.cps[shard].set_largest_permitted(esn(30))
            chunk = RangeChunk(None, esn(10), esn(30), read=read, lease_key=shard,
                               row_count=4, byte_count=40)  # fmt: skip
            env.batcher.add(lane, chunk)
        assert env.batcher.step() == 1
        first = env.sink.written[0]
        assert env.batcher.step() == 1
    finally:
        reads.close()
    assert sorted(p.lease_key for p in first.pieces) == sorted(SHARDS)
    assert [p.lease_key for p in env.sink.written[1].pieces] == [third]


def test_a_batch_whose_rows_keep_being_lost_is_given_up_on_after_max_attempts_reads() -> None:
    """A batch whose write itself kills executors (each time its rows are lost again) is read
    again at most ``max_attempts`` times without its checkpoint moving, then parked as any
    write that keeps failing, instead of being read and written for ever."""
    from kclpy_spark.spark.frames import RangeChunk

    env = manual(max_records=3, max_attempts=2)
    lane = env.take(SHARDS[0])
    chunk = RangeChunk(None, esn(10), esn(30), read=object(), lease_key=SHARDS[0],
                       row_count=3, byte_count=30)  # fmt: skip
    env.cps[SHARDS[0]].set_largest_permitted(esn(30))

    def write(batch: SinkBatch) -> None:
        env.sink.attempts.append((batch.batch_id, batch.attempt))
        raise RuntimeError(
            "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_7_0 not found!"
        )

    env.sink.write = write  # type: ignore[method-assign]
    env.batcher.add(lane, chunk)
    for _ in range(2):  # read again twice: the lane waits for its pinned read each time
        env.batcher.run_until_idle()
        assert env.batcher.lane_state(lane) is LaneState.ACTIVE and lane.unfilled() is not None
        env.batcher.add(lane, chunk)
    env.batcher.run_until_idle()
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    assert len(env.sink.attempts) == 3 and env.batcher.stats.parked_batches == 1
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


def test_dead_letter_policy_stores_the_batch_then_acknowledges_it() -> None:
    stored: list[tuple[SinkBatch, BaseException]] = []

    class DeadLetter:
        def write(self, batch: SinkBatch, error: BaseException) -> None:
            stored.append((batch, error))

    env = manual(max_records=3, max_attempts=2)
    env.batcher = env.new_batcher(dead_letter=DeadLetter())
    env.take(SHARDS[0])
    env.sink.fail = lambda batch: batch.table.column("sequence_number")[0].as_py() == "10"
    env.deliver(SHARDS[0], records(1, 6))
    env.batcher.run_until_idle()
    assert [b.rows for b, _ in stored] == [3] and "boom" in str(stored[0][1])
    assert env.sink.rows() == [(SHARDS[0], str(i * 10)) for i in (4, 5, 6)]
    assert env.lease(SHARDS[0]).checkpoint == esn(60)
    assert env.batcher.stats.dead_lettered_batches == 1


@pytest.mark.parametrize(("replayed", "retire_fails"), [(True, False), (True, True), (False, True)])
def test_a_dead_lettered_replayed_batch_has_its_tokens_retired_before_it_is_acknowledged(
    replayed: bool, retire_fails: bool
) -> None:
    """Delta: a batch re-formed from a pending checkpoint could still be committed by the
    earlier tenure's write of it; dead-lettered, the lease's next batch got the same version and
    was skipped as committed when that write landed (its records nowhere). Its tokens are
    retired first; if that fails, it is not acknowledged (parked). A batch first formed here has
    no write that could outlive it: dead-lettered as before, whatever the table says."""

    class DeadLetter:
        def write(self, batch: SinkBatch, error: BaseException) -> None:
            pass

    retired: list[int] = []

    def retire(batch: SinkBatch) -> None:
        if retire_fails:
            raise OSError("the table did not answer")
        retired.append(batch.rows)

    env = manual(max_records=3, max_attempts=1, max_wait=1.0)
    if replayed:
        crash_during_write(env, SHARDS[:1], 3)  # worker A's write of it may still land
        env.batcher = env.new_batcher(dead_letter=DeadLetter())
        lane = env.take(SHARDS[0], worker="worker-b")
    else:
        env.batcher = env.new_batcher(dead_letter=DeadLetter())
        lane = env.take(SHARDS[0])
    env.sink.retire_tokens = retire  # type: ignore[attr-defined]
    env.sink.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.clock.advance(1.0)
    env.batcher.run_until_idle()
    if replayed and retire_fails:
        assert env.batcher.lane_state(lane) is LaneState.PARKED
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    else:
        assert retired == ([3] if replayed else [])
        assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_a_failing_dead_letter_write_parks_instead() -> None:
    class BrokenDeadLetter:
        def write(self, batch: SinkBatch, error: BaseException) -> None:
            raise OSError("disk full")

    env = manual(max_records=3, max_attempts=1)
    env.batcher = env.new_batcher(dead_letter=BrokenDeadLetter())
    lane = env.take(SHARDS[0])
    env.sink.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_throttled_commit_is_retried_and_the_checkpoint_waits_for_it(in_flight: int) -> None:
    """One batch in flight per lease: the next piece waits for the retried commit. Two: the next
    piece is written meanwhile (its pending checkpoint lists both), and one commit moves the
    checkpoint over both when the retry comes."""
    env = manual(max_records=3, commit_retry_delay=2.0, batches_in_flight=in_flight)
    env.take(SHARDS[0])
    original = env.table.update_checkpoint
    failures = [ThrottledError("slow down")]
    commits: list[ExtendedSequenceNumber] = []

    def flaky(lease: Lease, cp: ExtendedSequenceNumber, pending: Any = None) -> Lease | None:
        if failures:
            raise failures.pop()
        commits.append(cp)
        return original(lease, cp, pending)

    env.table.update_checkpoint = flaky  # type: ignore[method-assign]
    env.deliver(SHARDS[0], records(1, 6))
    assert env.batcher.step() == 1
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON  # written, commit failed
    assert env.batcher.step() == in_flight - 1
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON  # never past the unacknowledged one
    if in_flight == 2:
        state = PendingState.decode(env.lease(SHARDS[0]).pending_checkpoint_state)
        assert env.lease(SHARDS[0]).pending_checkpoint == esn(60)
        assert state is not None and [p.group[0].last for p in state.pieces] == [esn(30), esn(60)]
    env.clock.advance(2.0)
    env.batcher.run_until_idle()
    assert env.lease(SHARDS[0]).checkpoint == esn(60)
    assert env.lease(SHARDS[0]).pending_checkpoint is None
    assert commits == ([esn(30), esn(60)] if in_flight == 1 else [esn(60)])
    assert len(env.sink.written) == 2


class Unexpected(BaseException):
    """Something no handler expects (not an Exception) raised inside a commit."""


def test_a_commit_that_raises_unexpectedly_releases_its_claim_and_the_others() -> None:
    """Commits are claimed (one at a time a lane) before they run. A commit that raised
    something unexpected left its claim, and the claims taken with it for other lanes, standing:
    those lanes' checkpoints never moved again."""
    env = manual(max_records=6, commit_retry_delay=2.0)
    for shard in SHARDS[:2]:
        env.take(shard)
    raises = checkpoints_failing(
        env, Unexpected(), ThrottledError("slow down"), ThrottledError("slow down")
    )
    for shard in SHARDS[:2]:
        env.deliver(shard, records(1, 3))
    assert env.batcher.step() == 1  # one batch of both; both commits throttled: retried in 2 s
    assert len(raises) == 1
    env.clock.advance(2.0)
    with pytest.raises(Unexpected):
        env.batcher.step()  # both claimed at once; the first raises, the other is not tried
    assert [env.lease(s).checkpoint for s in SHARDS[:2]] == [TRIM_HORIZON] * 2
    env.clock.advance(2.0)
    env.batcher.run_until_idle()
    assert [env.lease(s).checkpoint for s in SHARDS[:2]] == [esn(30)] * 2


def test_lease_lost_during_the_write_commits_nothing_and_drops_the_buffer() -> None:
    env = manual(max_records=3)
    lane = env.take(SHARDS[0])
    env.sink.on_write = lambda batch: env.batcher.close_lane(lane)
    env.deliver(SHARDS[0], records(1, 5))
    env.batcher.run_until_idle()
    assert len(env.sink.written) == 1  # the write itself completed (idempotent sinks dedupe)
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    assert lane.rows == 0 and env.batcher.lane_state(lane) is LaneState.CLOSED


def test_a_lease_lost_during_a_retrys_backoff_gets_no_further_attempt() -> None:
    """Whether every lease was lost was asked before the backoff, not after it: a lease lost
    while it slept (up to 30 s) was written again by a worker that no longer owned it, while its
    new owner wrote the same batch_id (a function sink's writes collide)."""
    env = manual(max_records=3, max_attempts=3)
    lane: Lane | None = None

    class LostWhileSleeping(list[float]):
        def append(self, seconds: float) -> None:
            super().append(seconds)
            assert lane is not None
            env.batcher.close_lane(lane)

    env.sleeps = LostWhileSleeping()
    env.batcher = env.new_batcher()
    lane = env.take(SHARDS[0])
    env.sink.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.run_until_idle()
    assert len(env.sink.attempts) == 1 and len(env.sleeps) == 1
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


def test_a_piece_that_leaves_its_batch_has_the_other_pending_checkpoints_rewritten() -> None:
    """The pending checkpoint names the batch's composition; when a cut leaves the batch (its
    lease lost before its pending write), the others' are written again without it."""
    env = manual(max_records=100, max_attempts=1, max_wait=1.0)
    for shard in SHARDS:
        env.take(shard)
        env.deliver(shard, records(1, 3))
    assert env.table.take_lease(env.lease(SHARDS[1]), "worker-z") is not None
    env.sink.fail = lambda batch: True  # the pending checkpoint stays to be read
    env.clock.advance(1.0)
    env.batcher.step()
    state = PendingState.decode(env.lease(SHARDS[0]).pending_checkpoint_state)
    assert state is not None and [k.lease_key for k in state.pieces[-1].group] == [SHARDS[0]]
    assert [p.lease_key for p in env.sink.attempts_pieces] == [SHARDS[0]]
    assert env.batcher.lane_state(env.lanes[SHARDS[1]]) is LaneState.CLOSED


class RefusesPending(Checkpointer):
    """A lease whose pending checkpoint can never be written (the table refuses its state)."""

    def prepare_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        raise CheckpointError(INVALID_STATE, "the table refused the pending state")


def test_a_pending_checkpoint_no_retry_can_write_puts_the_cut_back_and_parks_the_lane() -> None:
    env = manual(max_records=3)
    env.take_lease_only(SHARDS[0])
    held = env.holder.get_if_held(SHARDS[0])
    assert held is not None
    env.cps[SHARDS[0]] = RefusesPending(env.holder, SHARDS[0], held.token, TRIM_HORIZON)
    lane = env.open(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.run_until_idle()
    assert env.sink.attempts == []  # nothing goes to the sink without its pending checkpoint
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    assert "cannot prepare the checkpoint" in lane.park_reason
    assert lane.rows == 3  # the cut is back in its lane, to be re-formed whole
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


class ThrottledPending(Checkpointer):
    """A lease whose pending checkpoint is throttled at every try (its item alone)."""

    def prepare_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        raise CheckpointError(THROTTLING, "throttled (this lease's item only)")


class PieceSink(FakeSink):
    idempotent_per_piece = True  # as the built-in sinks: each pending names its own piece


@pytest.mark.parametrize("sink", [PieceSink, FakeSink])
def test_one_lease_whose_pending_checkpoint_keeps_being_throttled_parks_alone(
    sink: type[FakeSink],
) -> None:
    """Its retriable failure gave up on the whole batch after the retries: in worker scope
    every lease of the worker parked with it. With a sink written once per piece it leaves
    the batch and parks, the others are written and checkpointed; with one whose pending
    checkpoints name the whole batch (a function keyed by batch_id), the batch still gives up
    whole, so the same batch is re-formed after a crash."""
    env = Env(BatcherSettings(max_records=100, max_wait=1.0, max_attempts=3), sink=sink())
    env.take(SHARDS[0])
    env.take_lease_only(SHARDS[1])
    held = env.holder.get_if_held(SHARDS[1])
    assert held is not None
    env.cps[SHARDS[1]] = ThrottledPending(env.holder, SHARDS[1], held.token, TRIM_HORIZON)
    env.open(SHARDS[1])
    for shard in SHARDS[:2]:
        env.deliver(shard, records(1, 3))
    env.clock.advance(1.0)
    env.batcher.run_until_idle()
    throttled = env.lanes[SHARDS[1]]
    if sink is FakeSink:
        assert env.sink.attempts == []
        assert env.batcher.lane_state(env.lanes[SHARDS[0]]) is LaneState.PARKED
        return
    assert [p.lease_key for p in env.sink.attempts_pieces] == [SHARDS[0]]
    assert env.batcher.lane_state(env.lanes[SHARDS[0]]) is LaneState.ACTIVE
    assert env.lease(SHARDS[0]).checkpoint == ExtendedSequenceNumber(str(3 * 10))
    assert env.batcher.lane_state(throttled) is LaneState.PARKED and throttled.rows == 3
    assert env.lease(SHARDS[1]).checkpoint == TRIM_HORIZON


class SlowThrottledPending(ThrottledPending):
    """Each try of its pending checkpoint takes a second of the writer's clock, then fails."""

    clock: ClassVar[list[float]] = [0.0]

    def prepare_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self.clock[0] += 1.0
        super().prepare_checkpoint(*args, **kwargs)


def test_prepare_seconds_counts_each_try_of_a_batch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two leases whose pending checkpoints fail each leave the batch after three tries of a
    second: six seconds of preparing (counted from the first try, the second lease's were
    counted as nine), the backoff between tries not counted."""
    import kclpy_spark.spark.writer as writer_module

    clock = SlowThrottledPending.clock
    clock[0] = 0.0
    # The writer's own clock only (patched on the time module, every thread of the process
    # read it).
    monkeypatch.setattr(writer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    env = Env(BatcherSettings(max_records=100, max_wait=1.0, max_attempts=3), sink=PieceSink())

    def sleep(seconds: float) -> None:  # the backoff passes on the writer's clock too
        clock[0] += seconds
        env.sleeps.append(seconds)

    env.batcher.close()
    # Not threaded, as every manual Env: its writer threads (the default) raced this thread
    # for the batch, and under the suite's load took it, unwritten when the test looked.
    env.batcher = MicroBatcher(env.sink, env.settings, clock=env.clock, sleep=sleep, threaded=False)
    shards = (*SHARDS, "shardId-000000000002")
    env.table.create_lease_if_absent(Lease(shards[2], TRIM_HORIZON))
    env.take(shards[0])
    for shard in shards[1:]:
        env.take_lease_only(shard)
        held = env.holder.get_if_held(shard)
        assert held is not None
        env.cps[shard] = SlowThrottledPending(env.holder, shard, held.token, TRIM_HORIZON)
        env.open(shard)
    for shard in shards:
        env.deliver(shard, records(1, 3))
    env.clock.advance(1.0)
    env.batcher.run_until_idle()
    assert [p.lease_key for p in env.sink.attempts_pieces] == [shards[0]]
    assert env.batcher.stats.prepare_seconds == pytest.approx(6.0)
    assert clock[0] > 6.0 and len(env.sleeps) == 4


def test_a_commit_that_raises_something_unexpected_is_retried_not_written_again() -> None:
    env = manual(max_records=3, commit_retry_delay=2.0)
    lane = env.take(SHARDS[0])
    checkpoints_failing(env, RuntimeError("a bug in the store"))
    env.deliver(SHARDS[0], records(1, 3))
    assert env.batcher.step() == 1
    assert env.batcher.lane_state(lane) is LaneState.ACTIVE  # not parked, not put back
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    env.clock.advance(2.0)
    env.batcher.run_until_idle()
    assert env.lease(SHARDS[0]).checkpoint == esn(30)
    assert len(env.sink.written) == 1  # written once, committed on the retry


def test_a_closed_batcher_ends_drains_and_refuses_records() -> None:
    with threaded_env(max_records=100, max_wait=3600.0) as env:
        lane = env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 2))
        env.batcher.close(timeout=5.0)
        result: list[DrainResult] = []
        waiter = threading.Thread(
            target=lambda: result.append(env.batcher.drain(lane, None, final=True)), daemon=True
        )
        waiter.start()
        waiter.join(10.0)
        assert result == [DrainResult.CLOSED]  # used to wait forever
        with pytest.raises(BatcherClosedError):
            env.deliver(SHARDS[0], records(3, 1))


# --- replay after a crash -----------------------------------------------------------------------


def crash_during_write(env: Env, shards: Sequence[str], count: int) -> list[SinkBatch]:
    """Worker A writes a batch whose write 'crashes' (it raises and A gives up), leaving the
    pending checkpoints; returns what A attempted."""
    attempted: list[SinkBatch] = []
    env.sink.fail = lambda batch: True
    env.sink.on_write = attempted.append
    for shard in shards:
        env.take(shard)
        env.deliver(shard, records(1, count))
    env.clock.advance(env.settings.max_wait)
    env.batcher.step()
    env.sink.fail = lambda batch: False
    env.sink.on_write = lambda batch: None
    return attempted


def test_a_new_owner_reforms_the_pending_piece_exactly_whatever_its_chunking() -> None:
    env = manual(max_records=4, max_attempts=1, max_wait=1.0)
    [before] = crash_during_write(env, SHARDS[:1], 4)
    # Worker B: different limits, records arrive in other chunk sizes and go past the piece.
    env.settings = BatcherSettings(max_records=100, max_wait=50.0)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    for first, count in ((1, 3), (4, 3), (7, 2)):
        env.deliver(SHARDS[0], records(first, count))
    env.batcher.step()  # the re-formed piece goes at once, alone
    [again] = env.sink.written
    assert again.batch_id == before.batch_id and again.pieces == before.pieces
    assert again.tokens == before.tokens == {SHARDS[0]: "token-40"}
    assert again.table.equals(before.table)
    assert env.lease(SHARDS[0]).checkpoint == esn(40)
    env.clock.advance(50.0)
    env.batcher.step()
    assert [r[1] for r in env.sink.rows()] == [str(i * 10) for i in range(1, 9)]


def test_a_cross_lease_batch_is_reformed_whole_when_its_leases_come_back_together() -> None:
    env = manual(max_records=100, max_attempts=1, max_wait=1.0)
    [before] = crash_during_write(env, SHARDS, 3)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")  # a restart takes both leases in one take round...
    env.take_lease_only(SHARDS[1])  # ...the second lane opens when its records arrive
    env.deliver(SHARDS[0], records(1, 5))
    assert env.batcher.step() == 0  # waits for the other piece of its batch
    env.open(SHARDS[1])
    env.deliver(SHARDS[1], records(1, 3))
    assert env.batcher.step() == 1
    [again] = env.sink.written
    assert again.batch_id == before.batch_id and again.table.equals(before.table)


def test_a_reformed_piece_waits_at_most_the_regroup_wait_for_a_partner_held_here() -> None:
    env = manual(max_records=100, max_attempts=1, max_wait=1.0, regroup_wait=30.0)
    crash_during_write(env, SHARDS, 3)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    env.take_lease_only(SHARDS[1])  # held here, but its records never come back
    env.deliver(SHARDS[0], records(1, 3))
    assert env.batcher.step() == 0
    env.clock.advance(30.0)
    assert env.batcher.step() == 1
    [alone] = env.sink.written
    assert alone.pieces[0].key == PieceKey(SHARDS[0], esn(10), esn(30)) and alone.rows == 3
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_a_reformed_piece_whose_partners_moved_elsewhere_goes_at_once() -> None:
    """Issue 14, finding 4: a lease moved alone used to wait regroup_wait (30 s) for partner
    pieces that never come: the other leases of its batch are held by other workers."""
    env = manual(max_records=100, max_attempts=1, max_wait=1.0, regroup_wait=30.0)
    crash_during_write(env, SHARDS, 3)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")  # worker-b holds only this one
    env.deliver(SHARDS[0], records(1, 3))
    assert env.batcher.step() == 1  # no wait: nobody here will bring the other piece
    [alone] = env.sink.written
    assert alone.pieces[0].key == PieceKey(SHARDS[0], esn(10), esn(30))


def test_a_reformed_piece_whose_partner_committed_before_the_crash_does_not_wait_for_it() -> None:
    """The batch had landed and one lease's commit too before the crash: that lease's lane
    opens with nothing of the batch to re-form, so its piece never comes back, and the other
    piece waited the whole regroup_wait for it (its records piling up meanwhile)."""
    env = manual(max_records=100, max_attempts=1, max_wait=1.0, regroup_wait=30.0)
    crash_during_write(env, SHARDS, 3)
    env.cps[SHARDS[1]].checkpoint(str(30))  # its commit had landed (pending cleared)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    env.take(SHARDS[1])  # open, nothing to re-form
    env.deliver(SHARDS[0], records(1, 3))
    assert env.batcher.step() == 1  # at once
    [alone] = env.sink.written
    assert alone.pieces[0].key == PieceKey(SHARDS[0], esn(10), esn(30)) and alone.rows == 3
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_a_lane_whose_reformed_piece_waits_for_its_partner_feels_the_buffers_pressure() -> None:
    """A lane that had every record of its re-formed piece skipped back-pressure while the piece
    waited (up to regroup_wait) for its batch's other piece: the consumer read on, its records
    grew past every limit, and at twice the buffer every other lease's delivery stopped."""
    env = manual(max_records=100, max_attempts=1, max_wait=1.0, regroup_wait=30.0,
                 buffer_bytes=2_000)  # fmt: skip
    crash_during_write(env, SHARDS, 3)
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    env.take_lease_only(SHARDS[1])  # held here: its piece may come back
    env.deliver(SHARDS[0], records(1, 3))  # the piece to re-form, whole
    lane = env.lanes[SHARDS[0]]
    assert lane.replay_ready and not env.batcher._must_wait(lane)
    n = 4
    while not env.batcher._must_wait(lane):
        env.deliver(SHARDS[0], records(n, 10))
        n += 10
        assert n < 1_000, "the re-forming lane never waited"
    assert env.batcher.step() == 0  # its piece still waits for its partner's


# --- threads: out-of-order completion, backpressure, timeouts -----------------------------------


@contextmanager
def threaded_env(**settings: Any) -> Iterator[Env]:
    env = Env(BatcherSettings(**settings), threaded=True)
    try:
        yield env
    finally:
        env.batcher.close(timeout=5.0)


def test_a_writer_thread_lives_through_an_unexpected_error_in_a_commit() -> None:
    """With one writer (the default), a commit raising something that is not an ``Exception``
    ended the thread: no write and no commit ran again."""
    with threaded_env(max_records=3, commit_retry_delay=0.0) as env:
        env.take(SHARDS[0])
        raises = checkpoints_failing(env, Unexpected())
        env.deliver(SHARDS[0], records(1, 3))
        # Waited for on the real clock: the batcher's own (drain's deadline) is a manual one.
        assert _settles(lambda: env.lease(SHARDS[0]).checkpoint == esn(30), 20.0)
        assert raises == []
        env.deliver(SHARDS[0], records(4, 3))  # and the thread goes on writing
        assert _settles(lambda: env.lease(SHARDS[0]).checkpoint == esn(60), 20.0)


def test_out_of_order_completion_moves_each_checkpoint_only_over_its_own_writes() -> None:
    release_a = threading.Event()
    b_done = threading.Event()
    with threaded_env(max_records=2, scope="lease", writers=2) as env:

        def on_write(batch: SinkBatch) -> None:
            if batch.pieces[0].lease_key == SHARDS[0]:
                assert release_a.wait(10.0)
            else:
                b_done.set()

        env.sink.on_write = on_write
        for shard in SHARDS:
            env.take(shard)
        env.deliver(SHARDS[0], records(1, 2))
        env.deliver(SHARDS[1], records(1, 2))
        assert b_done.wait(10.0)
        assert env.batcher.drain(env.lanes[SHARDS[1]], 10.0, final=False) is DrainResult.DONE
        assert env.lease(SHARDS[1]).checkpoint == esn(20)
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON  # still being written
        release_a.set()
        assert env.batcher.drain(env.lanes[SHARDS[0]], 10.0, final=False) is DrainResult.DONE
        assert env.lease(SHARDS[0]).checkpoint == esn(20)


def test_a_full_buffer_blocks_process_records_until_a_write_frees_it() -> None:
    release = threading.Event()
    with threaded_env(max_records=2, buffer_bytes=1) as env:
        env.sink.on_write = lambda batch: release.wait(10.0) and None
        env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 2))  # taken by the writer, which now blocks
        env.deliver(SHARDS[0], records(3, 2))  # buffered: the buffer is full now
        third = threading.Thread(target=env.deliver, args=(SHARDS[0], records(5, 2)))
        third.start()
        third.join(0.2)
        assert third.is_alive(), "process_records should block on a full buffer"
        release.set()
        third.join(10.0)
        assert not third.is_alive()
        assert env.batcher.drain(env.lanes[SHARDS[0]], 10.0, final=True) is DrainResult.DONE
        assert env.lease(SHARDS[0]).checkpoint == esn(60)


def test_a_full_buffer_holds_back_only_the_leases_holding_their_share_of_it() -> None:
    """A lease whose write was slow filled the shared buffer (its consumer kept reading), and
    every other lease's process_records then waited for that write to end."""
    release = threading.Event()
    with threaded_env(max_records=2, buffer_bytes=1500, batches_in_flight=1, writers=2) as env:
        env.sink.on_write = lambda batch: (
            (release.wait(10.0) if batch.pieces[0].lease_key == SHARDS[0] else None) and None
        )
        for shard in SHARDS:
            env.take(shard)
        env.deliver(SHARDS[0], records(1, 2))  # taken by the writer, which now blocks
        assert wait_for(lambda: bool(env.sink.attempts))  # its cut is out before the filling
        first = 3
        while env.batcher.status()["lanes"][SHARDS[0]]["buffered_bytes"] < 1500:  # reads on
            env.deliver(SHARDS[0], records(first, 2))
            first += 2
        slow = threading.Thread(target=env.deliver, args=(SHARDS[0], records(first, 2)))
        slow.start()
        healthy = threading.Thread(target=env.deliver, args=(SHARDS[1], records(1, 2)))
        healthy.start()
        healthy.join(10.0)
        assert not healthy.is_alive(), "the healthy lease waited for the slow one's write"
        assert slow.is_alive(), "the lease that fills the buffer still waits"
        release.set()
        slow.join(10.0)
        assert not slow.is_alive()
        assert env.batcher.drain(env.lanes[SHARDS[1]], 10.0, final=True) is DrainResult.DONE
        assert env.lease(SHARDS[1]).checkpoint == esn(20)


def test_with_every_write_slow_the_buffer_stays_under_twice_its_limit() -> None:
    """Past its limit a lane below its share could still add: with 40 leases and every write
    slow, the buffer grew to 15 times its limit."""
    release = threading.Event()
    settings = {"max_records": 2, "buffer_bytes": 2000, "batches_in_flight": 1, "writers": 1}
    with threaded_env(**settings) as env:
        env.sink.on_write = lambda batch: release.wait(20.0) and None
        shards = [f"shardId-{i:012d}" for i in range(40)]
        for shard in shards:
            env.table.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
            env.take(shard)
        try:
            for shard in shards:  # each lease delivers until it is held back
                for first in range(1, 51, 10):
                    delivery = threading.Thread(
                        target=deliver_until_closed, args=(env, shard, first), daemon=True
                    )
                    delivery.start()
                    delivery.join(0.3)
                    if delivery.is_alive():
                        break
            lanes = env.batcher.status()["lanes"].values()
            assert sum(x["buffered_bytes"] for x in lanes) < 2 * env.settings.buffer_limit + 1000
        finally:
            release.set()


def deliver_until_closed(env: Env, shard: str, first: int) -> None:
    """Ten records; a delivery held back until the batcher closes ends quietly."""
    with contextlib.suppress(LaneClosedError, BatcherClosedError):
        env.deliver(shard, records(first, 10))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_write_that_overruns_its_timeout_is_interrupted_and_retried() -> None:
    interrupted = threading.Event()

    class Interrupter:
        @contextmanager
        def tagged(self, tag: str) -> Iterator[None]:
            yield

        def interrupt(self, tag: str) -> None:
            interrupted.set()

    # A timeout of seconds: the write interrupted must answer within the grace after it (as
    # long), or it counts as hung and is never retried; 0.05 s failed under the suite's load.
    with threaded_env(max_records=2, write_timeout=2.0, max_attempts=2) as env:
        env.batcher.close()
        env.batcher = env.new_batcher(interrupter=Interrupter())
        first = [True]

        def on_write(batch: SinkBatch) -> None:
            if first[0]:
                first[0] = False
                assert interrupted.wait(10.0)
                raise RuntimeError("job cancelled")

        env.sink.on_write = on_write
        env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 2))
        assert env.batcher.drain(env.lanes[SHARDS[0]], 30.0, final=True) is DrainResult.DONE
        assert "WriteTimeoutError" in env.batcher.stats.last_error
        assert WriteTimeoutError.retriable
        assert env.lease(SHARDS[0]).checkpoint == esn(20)


# --- resources are bounded by what is alive (issue 14, finding 1) -------------------------------


def _own_threads_since(before: set[threading.Thread]) -> list[str]:
    """Threads alive now and not in ``before`` that the project started (named kclpy-spark...,
    or running one of its functions), but sink-write ones (started on demand, up to one per
    writer, counted apart). Other tests' leftovers in this process may start threads too."""
    own = ("kclpy_spark.", "checkpoint.", "shard_sync.")
    return [
        t.name
        for t in threading.enumerate()
        if t not in before
        and not t.name.startswith("kclpy-spark-sink-write")
        and (
            t.name.startswith("kclpy-spark")
            or getattr(getattr(t, "_target", None), "__module__", "").startswith(own)
        )
    ]


def _settles(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_n_batches_leave_resources_bounded_by_a_constant(tmp_path: Path) -> None:
    """Every batch used to run in a thread of its own, and the SQLite store kept a connection
    (two descriptors with WAL) per thread that ever used it: 200 batches left ~400 descriptors.
    Now: N batches, then N more, leave the same threads, and descriptors and connections within
    the store's pool."""
    store = SQLiteLeaseTable(tmp_path / "leases.db", namespace="app")
    store.ensure_table()
    clock = ManualClock()
    holder = LeaseHolder(store, "worker-a", clock, 1e9)
    sink = FakeSink()
    batcher = MicroBatcher(
        sink, BatcherSettings(max_records=2, max_wait=0.01, writers=2), clock=clock
    )
    lanes = {}
    for shard in SHARDS:
        store.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
        lease = store.get_lease(shard)
        assert lease is not None
        taken = store.take_lease(lease, "worker-a")
        assert taken is not None
        held = holder.add_taken(taken)
        cp = Checkpointer(holder, shard, held.token, TRIM_HORIZON, retry_policy=NO_RETRY)
        lanes[shard] = (cp, batcher.open_lane(shard, shard, cp, TRIM_HORIZON))
    sequence = iter(range(1, 1_000_000))

    def run_batches(count: int) -> None:
        for _ in range(count):
            for cp, lane in lanes.values():
                recs = records(next(sequence), 2)
                cp.set_largest_permitted(esn(int(recs[-1].sequence_number)))
                batcher.add(lane, records_to_chunk(recs, "stream", lane.shard_id))
        for _, lane in lanes.values():
            assert batcher.drain(lane, 30.0, final=False) is DrainResult.DONE

    try:
        run_batches(25)  # warm-up: pools and writer threads reach their size
        descriptors, threads = descriptors_under(tmp_path), set(threading.enumerate())
        run_batches(150)
        assert len(sink.written) >= 2 * 150
        # Each pooled connection holds the database and its log, all share the log's index,
        # and a writer may still be in the sync that ends its commits (one descriptor to the log
        # for the call). The pool may grow after the warm-up (how many threads met in the store
        # at once depends on the machine's load), never past its size (asserted below).
        assert descriptors >= 2  # the database and its log, at least
        assert _settles(lambda: descriptors_under(tmp_path) <= 2 * store.open_connections + 2)
        assert _own_threads_since(threads) == []
        assert batcher.writes.write_threads <= 2  # one per writer (a hung write would add one)
        assert store.open_connections <= POOL_SIZE
        assert batcher.threads == 2
        assert batcher.deadlines <= 2 * 2 + 17  # write timeouts: one watchdog, no timer each
        # Two batches of a lease in flight (writers 2, batches_in_flight 2 by default): the
        # lanes hold nothing once drained, whatever order the writes finished in.
        assert all(lane.outs == () and not lane.replaying for _, lane in lanes.values())
    finally:
        batcher.close(timeout=5.0)
        holder.close()
        store.close()


def test_the_batchers_statistics_do_not_grow_with_the_leases_written() -> None:
    """#49 item 13: a per-lease row count gained a key for every lease ever written (never
    pruned, never read). Every figure the statistics keep is now a single number or text, but
    the figures by sink: one entry a configured sink."""
    env = manual(max_records=2, max_wait=10.0)
    for i in range(40):
        shard = f"shardId-{i + 100:012d}"
        env.table.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
        env.take(shard)
        env.deliver(shard, records(1, 2))
        assert env.batcher.step() == 1
    assert env.batcher.stats.batches == 40
    figures = vars(env.batcher.stats)
    assert list(figures.pop("by_sink")) == list(env.batcher.writes.sink_names)
    assert all(isinstance(v, int | float | str) for v in figures.values())


@pytest.mark.parametrize("escape", [SystemExit(3), KeyboardInterrupt()])
@pytest.mark.parametrize("where", ["write", "prepare"])
def test_a_sink_that_calls_sys_exit_fails_its_attempts_and_parks(
    escape: BaseException, where: str
) -> None:
    """#49 item 7: SystemExit / KeyboardInterrupt from a sink function ended the writer thread
    after "attempt 1 of 2 failed": the lease was never parked and nothing was written again."""
    parked = threading.Event()
    with threaded_env(max_records=3, max_attempts=2, retry_base_delay=0.0, writers=1) as env:
        lane = env.take(SHARDS[0])
        broken = {"on": True}
        real_prepare = env.sink.prepare

        def prepare(pieces: Sequence[Piece]) -> Mapping[str, Any]:
            if where == "prepare" and broken["on"]:
                raise escape
            return real_prepare(pieces)

        def fail(batch: SinkBatch) -> bool:
            if where == "write" and broken["on"]:
                raise escape
            return False

        env.sink.prepare = prepare  # type: ignore[method-assign]
        env.sink.fail = fail
        env.deliver(SHARDS[0], records(1, 3))
        for _ in range(100):
            if env.batcher.lane_state(lane) is LaneState.PARKED:
                parked.set()
                break
            threading.Event().wait(0.05)
        assert parked.is_set(), "the lease was never parked"
        assert type(escape).__name__ in env.batcher.stats.last_error
        broken["on"] = False
        # The writer thread lives on: a second lease's batch is written.
        env.take(SHARDS[1])
        env.deliver(SHARDS[1], records(1, 3))
        for _ in range(100):
            if env.lease(SHARDS[1]).checkpoint == esn(30):
                break
            threading.Event().wait(0.05)
        assert env.lease(SHARDS[1]).checkpoint == esn(30)


class StuckDeadLetter:
    """A dead-letter write that gives no answer (collecting a batch from a stuck cluster)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def write(self, batch: SinkBatch, error: BaseException) -> None:
        self.release.wait(30.0)


@pytest.mark.parametrize("stuck", ["prepare", "dead-letter"])
def test_a_sink_prepare_or_dead_letter_write_that_hangs_is_timed_out_as_a_write(
    stuck: str,
) -> None:
    """Both ran on the batcher's writer thread with no deadline: two of them stuck (the default
    two writers) stopped every lease, and the readiness said ready."""
    release = threading.Event()
    dead = StuckDeadLetter()
    # 1 s (and as much grace): a call that should answer does so under the suite's load too.
    env = Env(BatcherSettings(max_records=3, max_attempts=1, write_timeout=1.0))
    env.batcher = env.new_batcher(dead_letter=dead)
    if stuck == "prepare":
        env.sink.prepare = lambda pieces: release.wait(30.0) and {}  # type: ignore[method-assign]
    else:
        env.sink.fail = lambda batch: True
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    stepping = threading.Thread(target=env.batcher.step)
    try:
        stepping.start()
        stepping.join(20.0)
        assert not stepping.is_alive(), f"the batch waited for the {stuck} with no deadline"
        assert env.batcher._writer._side.threads.hung == 1  # on the side threads, counted
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON  # parked, nothing acknowledged
        assert env.lanes[SHARDS[0]].state is LaneState.PARKED
    finally:
        release.set()
        dead.release.set()
        env.batcher.close(timeout=5.0)
