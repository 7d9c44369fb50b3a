"""Pipelined batches: several batches of one lease in flight; checkpoints move only over the
contiguous acknowledged prefix, whatever order writes finish in; a failure puts back every later
batch; a crash re-forms every piece that was in flight, exactly.

Pure lane tables first (no I/O), then the batcher with real Checkpointers over a MemoryLeaseTable
(threaded where the order of completion matters, blocked on events, never on sleeps).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from test_lane import KEY, chunk, lane
from test_micro_batcher import SHARDS, Env, esn, records, threaded_env

from checkpoint.base.errors import ThrottledError
from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.spark.batch_life import Batch
from kclpy_spark.spark.lane import Cut, Lane, LaneState
from kclpy_spark.spark.micro_batcher import BatcherSettings, DrainResult
from kclpy_spark.spark.pieces import PendingState, PieceKey
from kclpy_spark.spark.sink_batch import SinkBatch

# --- the lane, pure ------------------------------------------------------------------------------


def three_out() -> tuple[Lane, list[Cut]]:
    a = lane(depth=3)
    a.add(chunk(1, 9), now=101.0)
    cuts = []
    for _ in range(3):
        cut = a.cut(3, 10**9)
        a.pending_state(cut, (cut.key,))
        a.prepared(cut)
        cuts.append(cut)
    return a, cuts


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_commits_cover_only_the_acknowledged_prefix_in_any_completion_order(
    order: tuple[int, ...],
) -> None:
    a, cuts = three_out()
    acked: set[int] = set()
    committed: list[ExtendedSequenceNumber] = []
    for i in order:
        a.acknowledged(cuts[i])
        acked.add(i)
        while (target := a.claim_commit(now=200.0)) is not None:
            end = cuts.index(target)
            assert set(range(end + 1)) <= acked, "a commit passed an unacknowledged cut"
            committed.append(target.key.last)
            a.committed(target)
        prefix = next((n for n in range(3) if n not in acked), 3)
        expected_end = cuts[prefix - 1].key.last if prefix else None
        assert (committed[-1] if committed else None) == expected_end
    assert committed[-1] == esn(90) and a.outs == () and a.idle
    assert committed == sorted(committed)  # one commit per new prefix, always forward


def test_depth_limits_the_cuts_out_and_a_cut_waits_for_the_previous_pending_write() -> None:
    a = lane(depth=2)
    a.add(chunk(1, 9), now=101.0)
    first = a.cut(3, 10**9)
    assert not a.can_cut()  # its pending checkpoint is not written yet
    a.pending_state(first, (first.key,))
    a.prepared(first)
    assert a.can_cut()
    second = a.cut(3, 10**9)
    a.pending_state(second, (second.key,))
    a.prepared(second)
    assert not a.can_cut() and a.outs == (first, second)  # depth 2 reached
    a.acknowledged(first)
    assert a.claim_commit(now=200.0) is first
    a.committed(first)
    assert a.can_cut()


def test_the_pending_state_lists_every_cut_out_in_order_with_its_batch_and_token() -> None:
    a = lane(depth=2)
    a.add(chunk(1, 6), now=101.0)
    first = a.cut(3, 10**9)
    other = PieceKey("shardId-000000000009", esn(5), esn(7))
    a.tokened(first, "t1")
    target, state = a.pending_state(first, (first.key, other)) or (None, None)
    assert target == esn(30) and state is not None and len(state.pieces) == 1
    a.prepared(first)
    second = a.cut(3, 10**9)
    a.tokened(second, "t2")
    target, state = a.pending_state(second, (second.key,)) or (None, None)
    assert target == esn(60) and state is not None
    assert [(p.group, p.token) for p in state.pieces] == [
        ((first.key, other), "t1"),
        ((second.key,), "t2"),
    ]
    assert [k.last for k, _ in state.after(KEY, esn(30))] == [esn(60)]  # after a commit


def test_a_failed_cut_goes_back_with_every_cut_after_it_and_each_is_reformed_exactly() -> None:
    a, cuts = three_out()
    a.tokened(cuts[2], "late")
    a.acknowledged(cuts[0])
    a.acknowledged(cuts[2])  # written before the failure: it must come again all the same
    a.put_back(cuts[1], (cuts[1].key,), now=150.0)
    assert a.outs == (cuts[0],)
    assert a.claim_commit(now=200.0) is cuts[0]  # the prefix before the failure still commits
    a.committed(cuts[0])
    a.acknowledged(cuts[2])  # a late answer for a cut put back: ignored
    assert a.claim_commit(now=200.0) is None
    a.put_back(cuts[2], (cuts[2].key,), now=151.0)  # and a late failure: not put back twice
    assert a.rows == 6
    again = [a.cut(1, 1) for _ in range(1)]
    a.pending_state(again[0], (again[0].key,))
    a.prepared(again[0])
    again.append(a.cut(1, 1))
    assert [c.key for c in again] == [cuts[1].key, cuts[2].key]  # limits do not apply
    assert again[1].token == "late" and again[1].replayed  # its pending write was stored


def test_a_commit_that_can_never_succeed_puts_back_every_cut_out() -> None:
    a, cuts = three_out()
    a.acknowledged(cuts[0])
    a.put_back_all(now=150.0)
    assert a.outs == () and a.rows == 9 and a.replay_key() == cuts[0].key


@pytest.mark.parametrize("sizes", [(9,), (1,) * 9, (2, 2, 5), (4, 5), (3, 3, 3), (8, 1)])
def test_several_replays_fill_in_order_whatever_the_chunking(sizes: tuple[int, ...]) -> None:
    """Two pieces were in flight (10..30 and 40..70); records come again in any chunks."""
    first = lane(replays=[(esn(30), (), "a"), (esn(70), (), "b")], depth=2)
    start = 1
    for size in sizes:
        first.add(chunk(start, size), now=101.0)
        start += size
    assert first.replay_key() == PieceKey(KEY, esn(10), esn(30))
    counted = (first.rows, first.nbytes)  # kept as records came, split or not
    first._recount()
    assert counted == (first.rows, first.nbytes) and first.rows == 9
    one = first.cut(100, 10**9)
    first.pending_state(one, (one.key,))
    first.prepared(one)
    two = first.cut(1, 1)
    assert (one.key.last, one.token, two.key, two.token) == (
        esn(30),
        "a",
        PieceKey(KEY, esn(40), esn(70)),
        "b",
    )
    assert first.rows == 2 and not first.replaying  # 80 and 90 buffered after them


# --- the batcher ---------------------------------------------------------------------------------


def test_a_later_batch_written_first_does_not_move_the_checkpoint_past_an_earlier_one() -> None:
    """Two writers, one lease: batch 1 (10..30) is held in its write while batch 2 (40..60) is
    cut, written and acknowledged. The checkpoint stays before batch 1 (the pending one lists
    both), then moves over both once batch 1 is written."""
    release_first = threading.Event()
    second_written = threading.Event()
    with threaded_env(max_records=3, max_wait=0.0, writers=2, batches_in_flight=2) as env:
        seen: list[ExtendedSequenceNumber] = []

        def on_write(batch: SinkBatch) -> None:
            if batch.pieces[0].key.first == esn(10):
                assert release_first.wait(10.0)
            else:
                second_written.set()

        env.sink.on_write = on_write
        env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 3))
        env.deliver(SHARDS[0], records(4, 3))
        assert second_written.wait(10.0), "the second batch was not written while the first was"
        wait_until(lambda: env.batcher.stats.batches == 1)
        lease = env.lease(SHARDS[0])
        seen.append(lease.checkpoint)
        assert lease.checkpoint == TRIM_HORIZON and lease.pending_checkpoint == esn(60)
        lane_status = env.batcher.status()["lanes"][SHARDS[0]]
        assert (lane_status["in_flight_batches"], lane_status["in_flight_rows"]) == (2, 6)
        state = PendingState.decode(lease.pending_checkpoint_state)
        assert state is not None
        assert [p.group[0].last for p in state.pieces] == [esn(30), esn(60)]
        release_first.set()
        assert env.batcher.drain(env.lanes[SHARDS[0]], 10.0, final=False) is DrainResult.DONE
        lease = env.lease(SHARDS[0])
        assert lease.checkpoint == esn(60) and lease.pending_checkpoint is None
        assert env.batcher.stats.commits == 1  # one commit over both batches


def test_two_writers_one_batch_in_flight_keep_a_lease_in_order_and_let_another_lease_pass() -> None:
    """The defaults with a function among the sinks (writers 2, batches_in_flight 1, scope
    lease): while lease A's first batch is held in its write, A's next batch is not cut (the
    function sees A's batches one after another), yet lease B's batch is written on the second
    writer; once A's first batch is checkpointed, A's next one is written."""
    release_first = threading.Event()
    b_written = threading.Event()
    written: list[tuple[str, ExtendedSequenceNumber]] = []
    settings = {"writers": 2, "batches_in_flight": 1, "scope": "lease"}
    with threaded_env(max_records=3, max_wait=0.0, **settings) as env:

        def on_write(batch: SinkBatch) -> None:
            [piece] = batch.pieces  # lease scope: one lease's piece per batch
            written.append((piece.lease_key, piece.key.first))
            if piece.lease_key == SHARDS[0] and piece.key.first == esn(10):
                assert release_first.wait(10.0)
            if piece.lease_key == SHARDS[1]:
                b_written.set()

        env.sink.on_write = on_write
        env.take(SHARDS[0])
        env.take(SHARDS[1])
        env.deliver(SHARDS[0], records(1, 3))
        env.deliver(SHARDS[0], records(4, 3))
        wait_until(lambda: (SHARDS[0], esn(10)) in written)
        env.deliver(SHARDS[1], records(1, 3))
        assert b_written.wait(10.0), "lease B waited for lease A's write"
        assert (SHARDS[0], esn(40)) not in written  # A's second batch waits for its first
        assert env.batcher.status()["lanes"][SHARDS[0]]["in_flight_batches"] == 1
        release_first.set()
        wait_until(lambda: (SHARDS[0], esn(40)) in written)
        assert env.batcher.drain(env.lanes[SHARDS[0]], 10.0, final=False) is DrainResult.DONE
        assert env.lease(SHARDS[0]).checkpoint == esn(60)
        a_writes = [first for key, first in written if key == SHARDS[0]]
        assert a_writes == [esn(10), esn(40)]


def test_a_failed_earlier_batch_keeps_the_checkpoint_and_a_new_owner_reforms_both() -> None:
    """Batch 2 succeeds while batch 1 fails for good: nothing is checkpointed, the lane parks
    with both pieces put back, and the next owner re-forms both exactly (same piece keys)."""
    second_written = threading.Event()
    with threaded_env(max_records=3, max_wait=0.0, writers=2, max_attempts=1) as env:

        def on_write(batch: SinkBatch) -> None:
            if batch.pieces[0].key.first == esn(10):
                assert second_written.wait(10.0)
                raise RuntimeError("sink down")
            second_written.set()

        env.sink.on_write = on_write
        lane_a = env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 3))
        env.deliver(SHARDS[0], records(4, 3))
        assert env.batcher.drain(lane_a, 10.0, final=False) is DrainResult.PARKED
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
        wait_until(lambda: len(env.sink.written) == 1)  # recorded just after on_write returns
        originals = sorted(p.key for b in env.sink.written for p in b.pieces)
        assert originals == [PieceKey(SHARDS[0], esn(40), esn(60))]
        assert lane_a.state is LaneState.PARKED and lane_a.replay_key() is not None
    # Another worker takes the lease (the first one parked it, or died).
    env.sink.on_write = lambda batch: None
    env.threaded = False
    env.batcher = env.new_batcher()
    lane_b = env.take(SHARDS[0], worker="worker-b")
    env.deliver(SHARDS[0], records(1, 7))
    env.batcher.run_until_idle()
    assert env.batcher.drain(lane_b, None, final=True) is DrainResult.DONE
    keys = [p.key for b in env.sink.written[1:] for p in b.pieces]
    assert keys[:2] == [
        PieceKey(SHARDS[0], esn(10), esn(30)),
        PieceKey(SHARDS[0], esn(40), esn(60)),
    ]
    assert env.lease(SHARDS[0]).checkpoint == esn(70)


def two_written_neither_committed() -> Env:
    """One worker wrote two pieces of a lease (10..30, 40..60) while the lease table throttled
    every commit: both are written, neither checkpointed, the pending checkpoint lists both."""
    env = Env(BatcherSettings(max_records=3, max_wait=0.0, commit_retry_delay=60.0))

    def throttled(lease: Lease, cp: ExtendedSequenceNumber, pending: Any = None) -> Lease | None:
        raise ThrottledError("slow down")

    env.table.update_checkpoint = throttled  # type: ignore[method-assign]
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 6))
    assert env.batcher.step() == 1 and env.batcher.step() == 1 and env.batcher.step() == 0
    return env


def test_a_crash_with_two_batches_in_flight_reforms_both_exactly() -> None:
    """Both batches written, neither committed (the lease table throttles), then the worker
    dies: the new owner re-forms the two pieces with their keys and tokens, then goes on."""
    env = two_written_neither_committed()
    first = [p for b in env.sink.written for p in b.pieces]
    tokens = [b.tokens[SHARDS[0]] for b in env.sink.written]
    assert env.lease(SHARDS[0]).pending_checkpoint == esn(60)
    del env.table.update_checkpoint  # the table answers again
    env.batcher = env.new_batcher()  # the worker died; another one takes the lease
    lane_b = env.take(SHARDS[0], worker="worker-b")
    env.deliver(SHARDS[0], records(1, 8))
    env.batcher.run_until_idle()
    assert env.batcher.drain(lane_b, None, final=True) is DrainResult.DONE
    again = env.sink.written[2:]
    assert [p.key for b in again[:2] for p in b.pieces] == [p.key for p in first]
    assert [b.tokens[SHARDS[0]] for b in again[:2]] == tokens  # stored tokens, not fresh ones
    assert env.lease(SHARDS[0]).checkpoint == esn(80)


def test_a_sink_that_needs_a_leases_batches_in_order_gets_one_at_a_time() -> None:
    release_first = threading.Event()
    with threaded_env(
        max_records=3, max_wait=0.0, writers=2, batches_in_flight=4, max_leases=100
    ) as env:
        env.sink.ordered_per_lease = True  # type: ignore[attr-defined]
        env.batcher.close(timeout=5.0)
        env.batcher = env.new_batcher()
        env.sink.on_write = lambda batch: release_first.wait(10.0) and None
        lane_a = env.take(SHARDS[0])
        assert lane_a.depth == 1
        env.deliver(SHARDS[0], records(1, 6))
        wait_until(lambda: len(env.sink.attempts) == 1)
        assert lane_a.outs and len(lane_a.outs) == 1 and not lane_a.can_cut()
        release_first.set()
        assert env.batcher.drain(lane_a, 10.0, final=False) is DrainResult.DONE
        assert env.lease(SHARDS[0]).checkpoint == esn(60)


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_a_new_owner_that_reformed_only_the_first_piece_still_lists_the_second() -> None:
    """Owner 1 wrote two pieces (10..30, 40..60) and committed neither. Owner 2 waits until
    both are whole (each pending write lists both), re-forms and commits the first, then dies
    before the second: the table must still name the second, so owner 3 re-forms it exactly (not
    as a fresh, differently cut range whose records the sink would then hold twice)."""
    env = two_written_neither_committed()
    first, second = [p.key for b in env.sink.written for p in b.pieces]
    del env.table.update_checkpoint  # the table answers again
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    stored = env.lease(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 4))  # 10..40: the second piece is not whole yet
    assert env.batcher.step() == 0 and env.lease(SHARDS[0]) == stored  # waits, writes nothing
    env.deliver(SHARDS[0], records(5, 2))
    assert env.batcher.step() == 1  # the first piece, written and committed
    lease = env.lease(SHARDS[0])
    assert lease.checkpoint == first.last
    state = PendingState.decode(lease.pending_checkpoint_state)
    assert lease.pending_checkpoint == second.last and state is not None
    assert [k for k, _ in state.after(SHARDS[0], lease.checkpoint)] == [second]
    env.batcher = env.new_batcher()  # owner 2 dies before writing the second
    lane_c = env.take(SHARDS[0], worker="worker-c")
    env.deliver(SHARDS[0], records(4, 5))
    env.batcher.run_until_idle()
    assert env.batcher.drain(lane_c, None, final=True) is DrainResult.DONE
    assert env.sink.written[-2].pieces[0].key == second  # exactly as owner 1 wrote it
    assert env.lease(SHARDS[0]).checkpoint == esn(80)


def test_a_late_failure_of_a_cut_already_put_back_does_not_park_the_lane_again() -> None:
    a, cuts = three_out()
    assert a.put_back(cuts[1], (cuts[1].key,), now=150.0)
    a.rearm()
    assert not a.put_back(cuts[2], (cuts[2].key,), now=151.0)  # its batch failed late
    env = Env(BatcherSettings())
    lane_a = env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 6))
    updates = env.batcher._updates
    with env.batcher._cond:
        one = lane_a.cut(3, 10**9)
        lane_a.pending_state(one, (one.key,))
        lane_a.prepared(one)
        two = lane_a.cut(3, 10**9)
        lane_a.pending_state(two, (two.key,))
    updates.gave_up(Batch([(lane_a, one)]), RuntimeError("first failed"))
    assert lane_a.state is LaneState.PARKED
    lane_a.rearm()
    updates.gave_up(Batch([(lane_a, two)]), RuntimeError("second failed late"))
    assert lane_a.state is LaneState.ACTIVE and lane_a.rows == 6


def test_a_cut_put_back_while_its_pending_write_may_land_keeps_its_token() -> None:
    a = lane(depth=2)
    a.add(chunk(1, 3), now=101.0)
    cut = a.cut(3, 10**9)
    a.tokened(cut, "t1")
    a.pending_state(cut, (cut.key,))  # the write started; it may land after the put-back
    a.put_back(cut, (cut.key,), now=102.0)
    again = a.cut(1, 1)
    assert again.replayed and again.token == "t1"
