"""Lane, the one owner of a lease's micro-batch state: every transition, without Spark or a
batcher (Arrow chunks made in memory, a checkpointer that is never called)."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.processor import Record
from kclpy_spark.spark.lane import DrainResult, Lane, LaneState
from kclpy_spark.spark.pieces import Chunk, PieceKey, records_to_chunk

KEY = "shardId-000000000000"


def esn(seq: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), sub)


def chunk(first: int, count: int) -> Chunk:
    """Records first*10 ... (first+count-1)*10."""
    recs = [Record(b"x" * 10, "k", str(i * 10)) for i in range(first, first + count)]
    return records_to_chunk(recs, "s", KEY)


class NoCheckpointer:
    lease_key = KEY
    pending_checkpoint = None

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a lane never calls its checkpointer ({name})")


def lane(
    replay: tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any] | None = None,
    *,
    replays: list[tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any]] | None = None,
    depth: int = 1,
) -> Lane:
    targets = replays if replays is not None else ([] if replay is None else [replay])
    return Lane(KEY, KEY, NoCheckpointer(), replays=targets, now=100.0, depth=depth)  # type: ignore[arg-type]


def test_add_buffers_in_order_and_remembers_the_oldest_arrival() -> None:
    a = lane()
    assert a.idle and not a.can_cut() and a.oldest is None
    a.add(chunk(1, 3), now=101.0)
    a.add(chunk(4, 2), now=102.0)
    assert (a.rows, a.oldest, a.idle, a.can_cut()) == (5, 101.0, False, True)


def test_cut_respects_the_row_and_byte_budgets_but_takes_at_least_one_record() -> None:
    a = lane()
    a.add(chunk(1, 5), now=101.0)
    cut = a.cut(max_rows=3, max_bytes=10**9)
    assert cut.key == PieceKey(KEY, esn(10), esn(30)) and cut.piece.rows == 3
    assert a.outs == (cut,) and not a.can_cut()  # depth 1: one cut out at a time
    assert a.rows == 2
    a.committed(cut)
    tiny = a.cut(max_rows=10, max_bytes=1)  # smaller than one record: still one record
    assert tiny.piece.rows == 1


def test_commit_retry_is_claimed_once_when_due() -> None:
    a = lane()
    a.add(chunk(1, 2), now=101.0)
    cut = a.cut(10, 10**9)
    a.acknowledged(cut)
    assert a.claim_commit(now=101.0) is cut
    a.commit_later(cut, at=105.0)
    assert a.claim_commit(now=104.0) is None
    assert a.claim_commit(now=105.0) is cut
    assert a.claim_commit(now=106.0) is None  # claimed: not due again until rescheduled
    a.committed(cut)
    assert a.outs == () and a.commit_due_at is None and a.idle


def test_put_back_reforms_the_same_cut_exactly_with_its_stored_token() -> None:
    a = lane()
    a.add(chunk(1, 4), now=101.0)
    cut = a.cut(3, 10**9)
    a.tokened(cut, {"v": 7})
    a.prepared(cut)  # its pending checkpoint is stored
    a.put_back(cut, (cut.key,), now=103.0)
    assert a.outs == () and a.replaying and a.replay_ready
    assert a.replay_key() == cut.key and a.replay_group == (cut.key,)
    again = a.cut(1, 1)  # limits do not apply to a replay
    assert again.key == cut.key and again.replayed and again.piece.rows == 3
    assert again.token == {"v": 7}


def test_a_cut_whose_stored_rows_are_gone_waits_for_a_pinned_read_and_drops_what_follows() -> None:
    """read_on = executors, an executor lost: the cut and the cut after it (pipelined) wait for
    reads pinned to their ends; the records buffered after them are dropped and read again after
    the last one; each re-formed cut keeps its key and token; the lane is not parked."""
    a = lane(depth=2)
    a.add(chunk(1, 3), now=101.0)
    first = a.cut(10, 10**9)
    a.tokened(first, {"v": 1})
    a.prepared(first)
    a.add(chunk(4, 2), now=102.0)
    second = a.cut(10, 10**9)
    a.tokened(second, {"v": 2})
    a.prepared(second)
    a.add(chunk(6, 4), now=103.0)  # buffered after both
    assert a.put_back_unread(first, (first.key,), now=104.0)
    assert a.state is LaneState.ACTIVE and a.outs == () and a.rows == 0
    assert not a.can_cut() and a.read_to == esn(50)  # the buffer goes: read again after 50
    assert a.unfilled() == (esn(30), esn(10))  # pinned: from its first to its last record
    a.add(chunk(1, 3), now=105.0)
    assert a.unfilled() == (esn(50), esn(40))
    a.add(chunk(4, 2), now=105.0)
    assert a.unfilled() is None and a.read_to == esn(50)
    again = a.cut(1, 1)
    assert (again.key, again.token, again.replayed) == (first.key, {"v": 1}, True)
    a.prepared(again)
    later = a.cut(1, 1)
    assert (later.key, later.token) == (second.key, {"v": 2})
    assert not a.put_back_unread(first, (first.key,), now=106.0)  # no longer out


def test_a_pending_state_written_again_names_a_piece_to_read_again_by_its_own_ends() -> None:
    """An earlier cut's pending checkpoint written again (its batch lost a lease meanwhile)
    lists the later piece waiting for its pinned read by the piece's first and last record: a
    next owner pins its read to both (named by its last record alone, the read would keep one
    record and the rest of the piece would be skipped)."""
    from kclpy_spark.spark.pieces import InFlight

    a = lane(depth=2)
    a.add(chunk(1, 3), now=101.0)
    first = a.cut(10, 10**9)
    group_first = (first.key, PieceKey("other", esn(1), esn(2)))
    a.pending_state(first, group_first)
    a.prepared(first)
    a.add(chunk(4, 2), now=102.0)
    second = a.cut(10, 10**9)
    a.pending_state(second, (second.key,))
    a.prepared(second)
    assert a.put_back_unread(second, (second.key,), now=103.0)
    pending = a.pending_state(first, (first.key,))  # written again: "other" left the batch
    assert pending is not None
    target, state = pending
    assert target == esn(50)
    assert state.pieces == (InFlight((first.key,), None), InFlight((second.key,), None))
    assert second.key == PieceKey(KEY, esn(40), esn(50))


@pytest.mark.parametrize("shard_end_first", [False, True])
def test_records_to_read_again_at_the_shards_end_wait_for_their_pinned_read(
    shard_end_first: bool,
) -> None:
    """A final drain (shard end) cuts each replay at what arrived and drops one that got
    nothing (its records trimmed). Records lost with an executor would be dropped so: they wait
    for their read pinned to their ends instead (the reads go on for a lease at its shard's end),
    then are cut and drained as before. (The lane parked, and the lease waited out a parking.)"""
    a = lane()
    a.add(chunk(1, 3), now=101.0)
    cut = a.cut(10, 10**9)
    a.prepared(cut)
    if shard_end_first:
        a.force(final=True)
    assert a.put_back_unread(cut, (cut.key,), now=102.0)
    if not shard_end_first:
        a.force(final=True)
    assert a.state is LaneState.ACTIVE and a.drained(final=True) is None
    assert a.replaying and a.replay_group == (cut.key,)  # kept: never dropped as trimmed
    assert a.unfilled() == (esn(30), esn(10))  # its pinned read
    a.add(chunk(1, 3), now=103.0)
    again = a.cut(10, 10**9)
    assert (again.key, again.replayed) == (cut.key, True)
    a.prepared(again)
    a.acknowledged(again)


def test_a_cut_put_back_before_its_pending_checkpoint_gets_a_fresh_token() -> None:
    a = lane()
    a.add(chunk(1, 4), now=101.0)
    cut = a.cut(3, 10**9)
    a.tokened(cut, {"v": 7})  # the sink gave a token, but no pending checkpoint names it
    a.put_back(cut, (cut.key,), now=103.0)
    again = a.cut(1, 1)
    assert again.key == cut.key  # still the same range
    assert not again.replayed and again.token is None  # sink.prepare is asked again


def test_a_token_for_a_cut_no_longer_out_is_ignored() -> None:
    a = lane()
    a.add(chunk(1, 2), now=101.0)
    cut = a.cut(10, 10**9)
    a.close()
    a.tokened(cut, {"v": 1})
    assert cut.token is None


def test_a_replay_cuts_exactly_at_its_target_whatever_the_chunking() -> None:
    group = (PieceKey(KEY, esn(10), esn(40)), PieceKey("other", esn(1), esn(2)))
    a = lane(replay=(esn(40), group, {"v": 3}))
    a.add(chunk(1, 2), now=101.0)  # 10, 20: not yet at the target
    assert a.replaying and not a.replay_ready and not a.can_cut()
    a.add(chunk(3, 3), now=102.0)  # 30, 40, 50: goes past it, split at 40
    assert a.replay_ready and a.replay_key() == group[0]
    cut = a.cut(1, 1)
    assert cut.key == group[0] and cut.token == {"v": 3} and a.rows == 1  # 50 stays buffered


@pytest.mark.parametrize("chunks", [[(1, 8)], [(1, 2), (3, 6)], [(1, 1), (2, 1), (3, 3), (6, 3)]])
def test_a_replay_read_from_before_its_piece_leaves_the_earlier_records_out(
    chunks: list[tuple[int, int]],
) -> None:
    """A lease that started at LATEST is read again from a margin before its first read: the
    re-formed piece took the earlier records too (another first record, so another piece id and
    batch id: an idempotent sink wrote its records twice)."""
    group = (PieceKey(KEY, esn(30), esn(60)),)
    a = lane(replay=(esn(60), group, {"v": 1}))
    for first, count in chunks:  # 10 ... 80
        a.add(chunk(first, count), now=101.0)
    assert a.replay_ready and a.replay_key() == group[0]
    cut = a.cut(1, 1)
    assert cut.key == group[0] and cut.piece.rows == 4 and a.rows == 2  # 70, 80 buffered


def test_force_final_cuts_a_replay_at_what_arrived() -> None:
    a = lane(replay=(esn(90), (), None))
    a.add(chunk(1, 2), now=101.0)
    a.force(final=True)
    assert a.forced and a.replay_ready and a.replay_key() == PieceKey(KEY, esn(10), esn(20))


def test_a_replay_whose_records_are_gone_is_dropped() -> None:
    a = lane(replay=(esn(5), (), None))  # everything after the target: the range was trimmed
    a.add(chunk(1, 2), now=101.0)
    assert not a.replaying and a.can_cut() and a.rows == 2


def test_park_rearm_and_close() -> None:
    a = lane()
    a.add(chunk(1, 2), now=101.0)
    cut = a.cut(10, 10**9)
    a.put_back(cut, (cut.key,), now=102.0)
    a.park("boom")
    assert a.state is LaneState.PARKED and a.park_reason == "boom" and not a.can_cut()
    assert a.drained(final=True) is DrainResult.PARKED
    a.rearm()
    assert a.state is LaneState.ACTIVE and a.can_cut()
    a.close()
    assert a.state is LaneState.CLOSED and a.rows == 0 and a.outs == ()
    assert a.drained(final=False) is DrainResult.CLOSED
    a.park("late")  # nothing revives a closed lane
    a.put_back(cut, (cut.key,), now=103.0)
    assert a.state is LaneState.CLOSED and a.rows == 0


@pytest.mark.parametrize(("final", "expected"), [(False, DrainResult.DONE), (True, None)])
def test_drained_leaves_an_incomplete_replay_to_the_next_owner_unless_final(
    final: bool, expected: DrainResult | None
) -> None:
    a = lane(replay=(esn(90), (), None))
    a.add(chunk(1, 2), now=101.0)
    assert a.drained(final) is expected


def test_records_dropped_behind_a_lost_piece_keep_a_final_drain_going_until_read_again() -> None:
    """Records read after a piece (here with the shard's end) were dropped when the piece's rows
    were lost; once the piece was read again and committed the lane looked idle, and the drain
    at the shard's end let SHARD_END be checkpointed past the dropped records."""
    a = lane(depth=2)
    a.add(chunk(1, 3), now=101.0)
    first = a.cut(10, 10**9)
    a.prepared(first)
    a.add(chunk(4, 3), now=102.0)  # 40..60, the shard's last records, behind the piece out
    a.force(final=True)
    assert a.put_back_unread(first, (first.key,), now=103.0)
    assert a.read_to == esn(30) and a.owed_to == esn(60)
    a.add(chunk(1, 3), now=104.0)  # the piece, read again
    again = a.cut(10, 10**9)
    a.prepared(again)
    a.acknowledged(again)
    assert a.claim_commit(now=105.0) is again
    a.committed(again)
    assert a.drained(final=True) is None  # not done: 40..60 are owed
    assert a.drained(final=False) is DrainResult.DONE  # a hand-over leaves them to the next owner
    a.add(chunk(4, 3), now=106.0)  # read again
    assert a.owed_to is None and a.read_to == esn(60)
    last = a.cut(10, 10**9)
    a.prepared(last)
    a.acknowledged(last)
    assert a.claim_commit(now=107.0) is last
    a.committed(last)
    assert a.drained(final=True) is DrainResult.DONE


def test_a_rewritten_pending_state_keeps_a_re_formed_cut_whose_own_is_not_written_yet() -> None:
    """Two stored pieces re-formed (two batches of a lease in flight): the second was cut, its
    pending write not started, when the first's batch lost another lease's cut and the first's
    pending was written again. That state listed the first piece only: the stored position fell
    back and the second piece and its token were gone, so after a crash its records were read
    again, cut elsewhere and written twice."""
    other = PieceKey("shardId-9", esn(1), esn(2))
    first, second = PieceKey(KEY, esn(10), esn(30)), PieceKey(KEY, esn(40), esn(60))
    a = lane(replays=[(esn(30), (first, other), "t1"), (esn(60), (second, other), "t2")], depth=2)
    a.add(chunk(1, 6), now=101.0)
    c1 = a.cut(10**9, 10**9)
    written = a.pending_state(c1, (c1.key, other))
    a.prepared(c1)
    c2 = a.cut(10**9, 10**9)
    assert c2.replayed and c2.key == second
    again = a.pending_state(c1, (c1.key,))  # the batch went on without the other lease's cut
    assert written is not None and again is not None
    position, state = again
    assert position == written[0] == esn(60)
    assert [(e.piece_of(KEY), e.token) for e in state.pieces] == [(first, "t1"), (second, "t2")]
    assert state.pieces[1].group == (second, other)  # as stored until its own write


def test_an_earlier_cut_put_back_keeps_a_later_re_formed_cuts_stored_batch() -> None:
    """The later cut went back named as a batch of its own: every later pending state said so,
    its partner no longer waited for it, and the batch was never formed again whole (a function
    keyed by batch_id in worker scope got a new id)."""
    other = "shardId-000000000009"
    g1 = (PieceKey(KEY, esn(10), esn(30)), PieceKey(other, esn(1), esn(2)))
    g2 = (PieceKey(KEY, esn(40), esn(60)), PieceKey(other, esn(3), esn(4)))
    a = lane(replays=[(esn(30), g1, "t1"), (esn(60), g2, "t2")], depth=2)
    a.add(chunk(1, 6), now=101.0)
    c1 = a.cut(1, 1)
    a.pending_state(c1, g1)
    a.prepared(c1)
    c2 = a.cut(1, 1)  # re-formed; its own pending write not started
    assert c2.replayed and c2.group is None
    assert a.put_back(c1, g1, now=150.0)
    assert [r.group for r in a._replays] == [g1, g2]
