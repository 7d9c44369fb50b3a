"""The planner's two questions, on lanes built in memory: which batches are due now, and when
to look again."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.processor import Record
from kclpy_spark.spark.lane import Lane
from kclpy_spark.spark.pieces import Chunk, InFlight, PendingState, PieceKey, records_to_chunk
from kclpy_spark.spark.planner import Plan, next_wakeup, plan_due
from kclpy_spark.spark.settings import MAX_STATE_PIECES, BatcherSettings

A, B = "shardId-000000000000", "shardId-000000000001"
WORKER = BatcherSettings(scope="worker", max_records=1000, max_wait=5.0, regroup_wait=30.0)


def esn(seq: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), 0)


def chunk(key: str, first: int, count: int) -> Chunk:
    recs = [Record(b"x", "k", str(i * 10)) for i in range(first, first + count)]
    return records_to_chunk(recs, "s", key)


def lane(key: str, replay: Any = None, now: float = 0.0) -> Lane:
    replays = [] if replay is None else [replay]
    return Lane(key, key, None, replays=replays, now=now)  # type: ignore[arg-type]


def test_a_reformed_piece_that_differs_from_its_batch_goes_alone_at_once() -> None:
    """Records 10 were trimmed: the piece re-forms as 20..40, which is not the 10..40 of its old
    batch, so it can never complete that batch; it used to wait (and then go as an empty plan)."""
    group = (PieceKey(A, esn(10), esn(40)), PieceKey(B, esn(10), esn(20)))
    a = lane(A, replay=(esn(40), group, None))
    a.add(chunk(A, 2, 3), now=0.0)
    assert a.replay_ready and a.replay_key() == PieceKey(A, esn(20), esn(40))
    plans = plan_due([a], WORKER, now=0.0, limit=None, expected=lambda key: True)
    assert plans == [Plan((a,), budgeted=False)]


def test_a_reformed_piece_waits_for_a_partner_held_here_and_they_go_together() -> None:
    group = (PieceKey(A, esn(10), esn(20)), PieceKey(B, esn(10), esn(20)))
    a, b = lane(A, replay=(esn(20), group, None)), lane(B, replay=(esn(20), group, None))
    a.add(chunk(A, 1, 2), now=0.0)
    assert plan_due([a, b], WORKER, now=1.0, limit=None) == []  # b's lane is open: wait
    b.add(chunk(B, 1, 2), now=1.0)
    [plan] = plan_due([a, b], WORKER, now=1.0, limit=None)
    assert set(plan.lanes) == {a, b} and not plan.budgeted


def test_wakeup_ignores_lanes_that_cannot_cut() -> None:
    """A lane with a cut out (or parked) has nothing due however old its records: counting it
    made the writer threads spin every 10 ms while a slow write was out."""
    a = lane(A)
    a.add(chunk(A, 1, 2), now=0.0)
    a.cut(1000, 10**9)
    a.add(chunk(A, 3, 2), now=0.0)
    b = lane(B)
    b.add(chunk(B, 1, 2), now=0.0)
    b.park("sink down")
    assert next_wakeup([a, b], WORKER, now=100.0) == 1.0
    c = lane("shardId-000000000002")
    c.add(chunk("shardId-000000000002", 1, 1), now=99.0)
    assert abs(next_wakeup([a, b, c], WORKER, now=100.0) - 4.0) > 2.9  # capped at 1 s
    assert next_wakeup([a, b, c], WORKER, now=103.5) == 0.5


def test_a_claimed_commit_retry_does_not_wake_anyone() -> None:
    a = lane(A)
    a.add(chunk(A, 1, 2), now=0.0)
    cut = a.cut(1000, 10**9)
    a.acknowledged(cut)
    assert a.claim_commit(now=1.0) is cut  # the commit right after the write: it fails
    a.commit_later(cut, at=2.0)
    assert next_wakeup([a], WORKER, now=1.5) == 0.5
    assert a.claim_commit(now=2.0) is cut
    assert next_wakeup([a], WORKER, now=2.0) == 1.0


def test_a_full_buffer_held_by_a_lane_that_cannot_cut_does_not_cut_the_others_early() -> None:
    """A lease whose write is slow keeps its records (its lane cannot cut): counted in the
    pressure, it made every other lane's delivery a batch of its own for the whole write."""
    settings = BatcherSettings(scope="lease", max_records=1000, max_wait=60.0, buffer_bytes=1500)
    slow, healthy = lane(A), lane(B)
    slow.add(chunk(A, 1, 2), now=0.0)
    slow.cut(1000, 10**9)  # its write is out (one batch in flight)
    while slow.nbytes < 1500:
        slow.add(chunk(A, 3, 20), now=0.0)
    healthy.add(chunk(B, 1, 1), now=0.0)
    assert plan_due([slow, healthy], settings, now=1.0, limit=None) == []
    while healthy.nbytes < 1500:  # a lane that can cut and fills the buffer itself: cut now
        healthy.add(chunk(B, 2, 20), now=1.0)
    assert plan_due([slow, healthy], settings, now=1.0, limit=None) == [
        Plan((healthy,), budgeted=True)
    ]


def test_a_worker_scope_batch_holds_at_most_max_leases_leases_oldest_first() -> None:
    """Each lease's pending checkpoint names every piece of its batch: without a cap, a batch of
    1,400 leases passed DynamoDB's 400 KB an item and every pending write failed."""
    settings = BatcherSettings(scope="worker", max_records=10**6, max_wait=5.0, max_leases=2)
    keys = [f"shardId-{i:012d}" for i in range(5)]
    lanes = [lane(k) for k in keys]
    for age, (k, x) in enumerate(zip(keys, lanes, strict=True)):
        x.add(chunk(k, 1, 1), now=float(4 - age))  # the last lane is the oldest
    assert plan_due(lanes, settings, now=4.0, limit=None) == []  # the oldest waited 4 s
    oldest_first = lanes[::-1]
    plans = plan_due(lanes, settings, now=5.0, limit=None)  # the oldest is due: its batch only
    assert plans == [Plan(tuple(oldest_first[:2]), budgeted=True)]
    plans = plan_due(lanes, settings, now=20.0, limit=2)  # all due: two batches, as room allows
    assert plans == [
        Plan(tuple(oldest_first[:2]), budgeted=True),
        Plan(tuple(oldest_first[2:4]), budgeted=True),
    ]
    assert plan_due(lanes, settings, now=20.0, limit=None)[2] == Plan(
        (oldest_first[4],), budgeted=True
    )


def test_a_pending_state_of_the_most_pieces_allowed_fits_in_a_dynamodb_item() -> None:
    """``max_leases`` x ``batches_in_flight`` <= MAX_STATE_PIECES, twice over (a lease re-forming
    a former owner's pieces lists those too), with the longest lease keys and positions: under
    DynamoDB's 400 KB an item; 1,400 leases of one stream in each of two batches are past it.
    With the longest stream names and sub-sequence numbers."""
    longest = "9" * 56  # Kinesis's sequence numbers have 56 digits
    stream_key = f"123456789012:{'s' * 128}:1700000000"  # a multi-stream lease key's prefix

    def state(leases: int, batches: int, prefix: str) -> bytes:
        group = tuple(
            PieceKey(f"{prefix}shardId-{i:012d}", ExtendedSequenceNumber(longest, 2**63 - 1),
                     ExtendedSequenceNumber(longest, 2**63 - 1))
            for i in range(leases)
        )  # fmt: skip
        return PendingState(tuple(InFlight(group, None) for _ in range(batches))).encode()

    with pytest.raises(ConfigError, match="max_leases"):
        BatcherSettings(max_leases=MAX_STATE_PIECES).check_groups(2)
    BatcherSettings(scope="lease", max_leases=MAX_STATE_PIECES).check_groups(2)
    most = BatcherSettings(max_leases=MAX_STATE_PIECES // 2, batches_in_flight=2)
    most.check_groups(most.batches_in_flight)
    worst = state(most.max_leases, 2 * most.batches_in_flight, f"{stream_key}:")
    assert len(worst) < 400 * 1024 - 10 * 1024  # room for the lease's other attributes
    plain = "49590338271490256608559692538361571095921575989136588898"
    group = tuple(
        PieceKey(f"shardId-{i:012d}", ExtendedSequenceNumber(plain), ExtendedSequenceNumber(plain))
        for i in range(1_400)
    )
    assert len(PendingState((InFlight(group, None),) * 2).encode()) > 400 * 1024
