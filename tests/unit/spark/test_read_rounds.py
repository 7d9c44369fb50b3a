"""Reading on the executors, the pure parts: which lanes may take records (LanesFeed), the range
each gets (ExecutorReads._range), when a lease is read again at once, and the relay's inbox.
Lanes are real, their checkpointer a recorder; no Spark."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from test_lane import KEY, esn

from checkpoint.base.clock import ManualClock
from checkpoint.sequence import SHARD_END, ExtendedSequenceNumber
from kclpy_spark.retrieval.polling import MAX_READ_PAUSE, MIN_INTERVAL_WHILE_BEHIND
from kclpy_spark.retrieval.source import FetchedBatch, FetchProgress, ReadElsewhere
from kclpy_spark.spark.cluster_read import RangeRead
from kclpy_spark.spark.executor_reads import (
    ExecutorReads,
    LeaseSource,
    RangeReadError,
    ReadJobFailedError,
    ReadSettings,
    ReadSlot,
    _Entry,
)
from kclpy_spark.spark.frames import RangeChunk
from kclpy_spark.spark.lane import DrainResult, Lane
from kclpy_spark.spark.lane_feed import LanesFeed
from kclpy_spark.spark.pieces import PieceKey
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import Pinned, RangeEnd, ReadRange
from kclpy_spark.spark.read_timing import is_behind, read_job_limit, round_leases, round_start
from kclpy_spark.spark.relay import LeaseRelay, _Inbox

TRIM = ExtendedSequenceNumber("TRIM_HORIZON")


class Recorder:
    lease_key = KEY
    pending_checkpoint = None

    def __init__(self) -> None:
        self.largest: list[ExtendedSequenceNumber] = []

    def set_largest_permitted(self, position: ExtendedSequenceNumber) -> None:
        self.largest.append(position)

    @property
    def largest_permitted(self) -> ExtendedSequenceNumber:
        return self.largest[-1] if self.largest else TRIM


def feed_with(*lanes: Lane) -> tuple[LanesFeed, dict[str, Lane]]:
    by_key = {x.lease_key: x for x in lanes}
    return LanesFeed(threading.Condition(), by_key, ManualClock(), lambda: False), by_key


def make_lane(key: str = KEY, depth: int = 2, replays: Any = ()) -> Lane:
    return Lane(key, key, Recorder(), replays=list(replays), depth=depth)  # type: ignore[arg-type]


def range_chunk(first: int, last: int, rows: int) -> RangeChunk:
    return RangeChunk(None, esn(first), esn(last), read=object(), lease_key=KEY,
                      row_count=rows, byte_count=rows * 10)  # fmt: skip


def test_an_empty_lane_takes_a_read_from_its_start_and_remembers_where_records_end() -> None:
    lane = make_lane()
    feed, _ = feed_with(lane)
    slots, parked = feed.readable([KEY, "other"])
    assert set(slots) == {KEY} and not parked
    assert slots[KEY] == ReadSlot(lane, None, None)
    assert feed.fill(lane, range_chunk(10, 50, 5))
    assert lane.read_to == esn(50) and lane.checkpointer.largest == [esn(50)]  # type: ignore[attr-defined]
    assert feed.readable([KEY])[0] == {}  # its records wait to be cut


def test_a_lane_takes_no_read_until_its_batch_out_is_prepared_and_only_depth_batches() -> None:
    lane = make_lane(depth=2)
    feed, _ = feed_with(lane)
    feed.fill(lane, range_chunk(10, 50, 5))
    first = lane.cut(10**9, 10**9)
    assert feed.readable([KEY])[0] == {}  # its pending checkpoint is not written yet
    lane.prepared(first)
    assert feed.readable([KEY])[0][KEY].read_to == esn(50)  # pipelined: a second batch
    feed.fill(lane, range_chunk(60, 90, 4))
    lane.prepared(lane.cut(10**9, 10**9))
    assert feed.readable([KEY])[0] == {}  # two batches out: the depth


def test_parked_and_closed_lanes_take_nothing_and_parked_ones_are_named() -> None:
    parked, closed = make_lane("a"), make_lane("b")
    parked.park("the sink gave up")
    closed.close()
    feed, _ = feed_with(parked, closed)
    assert feed.readable(["a", "b"]) == ({}, {"a"})
    assert not feed.fill(closed, range_chunk(1, 2, 2))
    assert not feed.fill(make_lane("a"), range_chunk(1, 2, 2))  # not the lane the batcher has


def test_a_read_planned_before_the_lanes_records_were_put_back_to_be_read_is_refused() -> None:
    """Its records continue from ones the lane no longer has: taken, they would come before the
    piece to re-form, which would then look trimmed and be dropped."""
    lane = make_lane(depth=2)
    feed, _ = feed_with(lane)
    feed.fill(lane, range_chunk(10, 50, 5))
    out = lane.cut(10**9, 10**9)
    lane.prepared(out)
    slot = feed.readable([KEY])[0][KEY]  # a read after 50, planned
    assert lane.put_back_unread(out, (out.key,), now=1.0)  # its stored rows were lost
    assert not feed.fill(lane, range_chunk(60, 90, 4), slot.epoch)
    assert lane.unfilled() == (esn(50), esn(10)) and lane.rows == 0
    again = feed.readable([KEY])[0][KEY]
    assert again.unfilled == (esn(50), esn(10)) and again.epoch == slot.epoch + 1
    assert feed.fill(lane, range_chunk(10, 50, 5), again.epoch)
    assert lane.replay_key() == out.key


def test_a_lane_re_forming_pieces_asks_for_each_one_pinned_in_turn() -> None:
    a_piece = PieceKey(KEY, esn(10), esn(30))
    lane = make_lane(replays=[(esn(30), (a_piece,), None), (esn(70), (), None)])
    feed, _ = feed_with(lane)
    assert feed.readable([KEY])[0][KEY].unfilled == (esn(30), esn(10))
    feed.fill(lane, range_chunk(10, 30, 3))
    slot = feed.readable([KEY])[0][KEY]  # the first is whole; the second waits, first named
    assert (slot.read_to, slot.unfilled) == (esn(30), (esn(70), None))


SOURCE = LeaseSource(KEY, "s", {"StreamName": "s"}, KEY, TRIM, hash_range=(0, 5))


def reads(**settings: Any) -> ExecutorReads:
    return ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(**settings))


def started(
    feed: Any, reader: ExecutorReads | None = None
) -> tuple[ExecutorReads, _Entry, list[Any]]:
    """A reader on ``feed`` (no thread) with SOURCE registered: its entry and what it posts."""
    reader = reader or reads()
    posted: list[Any] = []
    reader.start(feed, threaded=False)
    return reader, reader.register(SOURCE, posted.append), posted


@pytest.mark.parametrize(
    ("slot_read_to", "unfilled", "entry_iterator", "want_after", "want_iterator", "want_pin"),
    [
        (None, None, None, TRIM, None, None),  # a first read: from the lease's start
        (esn(50), None, ("it", esn(50)), esn(50), "it", None),  # continues its last read
        (esn(50), None, ("it", esn(40)), esn(50), None, None),  # an iterator from elsewhere
        (esn(5), (esn(30), esn(10)), ("it", esn(5)), esn(5), None, Pinned(esn(10), esn(30), None)),
    ],
)
def test_the_range_a_slot_gets(
    slot_read_to: ExtendedSequenceNumber | None,
    unfilled: tuple[ExtendedSequenceNumber, ExtendedSequenceNumber | None] | None,
    entry_iterator: tuple[str, ExtendedSequenceNumber] | None,
    want_after: ExtendedSequenceNumber,
    want_iterator: str | None,
    want_pin: Pinned | None,
) -> None:
    entry = _Entry(SOURCE, lambda item: None)
    if entry_iterator is not None:
        entry.iterator, entry.iterator_at = entry_iterator
    rng = reads(max_records=1000, max_bytes=4000)._range(
        entry, ReadSlot(make_lane(), slot_read_to, unfilled), leases=4, behind=0, now=0.0
    )
    assert (rng.after, rng.iterator, rng.pinned) == (want_after, want_iterator, want_pin)
    assert (rng.max_records, rng.max_bytes, rng.hash_range) == (250, 1000, (0, 5))


@pytest.mark.parametrize(
    ("read_rate", "seconds"),
    [(2 * 1024 * 1024, 100.0), (512 * 1024, 256.0), (0, 100.0)],
)
def test_a_pinned_read_gets_the_time_a_whole_batch_takes_at_the_read_rate(
    read_rate: float, seconds: float
) -> None:
    """A fixed 100 s: a 64 MiB piece at 0.5 MiB a second (128 s) failed its read every time."""
    rng = reads(max_bytes=64 * 1024 * 1024, max_seconds=10.0, read_rate=read_rate)._range(
        _Entry(SOURCE, lambda item: None),
        ReadSlot(make_lane(), esn(5), (esn(9), esn(6))), leases=1, behind=0, now=0.0,
    )  # fmt: skip
    assert rng.pinned is not None and rng.max_seconds == seconds


@pytest.mark.parametrize(
    ("leases", "behind", "is_behind", "records"),
    [
        (1000, 1, True, 50_000),  # the one busy shard among idle ones: half the budget
        (1000, 1, False, 100),  # an idle one: its equal share
        (4, 4, True, 25_000),  # all behind: the equal share is the larger
        (10, 2, True, 25_000),
    ],
)
def test_a_lease_behind_gets_a_share_of_the_budget_of_those_behind(
    leases: int, behind: int, is_behind: bool, records: int
) -> None:
    """Every range got the round's budget over its leases: a busy shard among 1,000 leases at
    their tip was read 100 records a round, below what Kinesis takes in, and never caught up."""
    entry = _Entry(SOURCE, lambda item: None)
    entry.behind = is_behind
    rng = reads(max_records=100_000, max_bytes=40_000_000)._range(
        entry, ReadSlot(make_lane(), None, None), leases=leases, behind=behind, now=0.0
    )
    assert rng.max_records == records
    assert rng.max_bytes == records * 400


@pytest.mark.parametrize(
    ("leases", "behind", "record_bytes", "records"),
    [
        (24, 24, 200, 10_000),  # 100,000 over 24 leases: 4,166 each, a page cut short each read
        (24, 24, 0, 4_166),  # no page read yet: its size unknown, the records share
        (24, 24, 20_000, 4_166),  # big records: the bytes share (2.8 MB) holds fewer
        (250, 250, 1_000, 400),  # 1 KB records: 268 in a share of the bytes, 400 of the records
        (4, 4, 200, 25_000),  # max_records gives more: it stands
        (1000, 1, 200, 50_000),  # the busy shard: half the round's records (a page caps it)
    ],
)
def test_a_lease_may_read_a_page_a_round_past_its_records_share_within_its_bytes(
    leases: int, behind: int, record_bytes: int, records: int
) -> None:
    """With ``page_per_lease`` (a config file's default) a lease reads up to a page a round,
    within its share of ``max_bytes`` as its last page measured its records: a range is one
    page, asked for in records, so the bytes share alone bounded nothing."""
    entry = _Entry(SOURCE, lambda item: None)
    entry.behind, entry.record_bytes = True, record_bytes
    reader = reads(max_records=100_000, max_bytes=64 * 1024 * 1024, page_per_lease=True)
    rng = reader._range(entry, ReadSlot(make_lane(), None, None), leases=leases, behind=behind,
                        now=0.0)  # fmt: skip
    assert rng.max_records == records


def ended(rows: int, nbytes: int, lag: int | None) -> RangeEnd:
    return RangeEnd(KEY, esn(1) if rows else None, esn(rows) if rows else None, rows, nbytes,
                    millis_behind_latest=lag)  # fmt: skip


@pytest.mark.parametrize(
    ("end", "pinned", "behind"),
    [
        (ended(100, 10, None), False, True),  # the record budget spent
        (ended(3, 500, None), False, True),  # the byte budget spent
        (ended(3, 10, 2_000), False, True),  # the shard is behind
        (ended(3, 10, 0), False, False),  # at the tip: wait before the next read
        # A few milliseconds under steady traffic is at the tip (read at once, it took the
        # shard's GetRecords allowance from every other application on it).
        (ended(3, 10, 5), False, False),
        (ended(3, 10, 1_000), False, False),  # within the idle time
        (ended(3, 10, None), False, True),  # a full page, its lag unknown: maybe more
        (ended(0, 0, None), False, False),
        (ended(3, 10, None), True, True),  # a re-formed piece: what follows is read next
    ],
)
def test_a_lease_is_read_again_at_once_only_while_records_wait(
    end: RangeEnd, pinned: bool, behind: bool
) -> None:
    pin = Pinned(None, esn(3), None) if pinned else None
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, TRIM, max_records=100, max_bytes=500,
                    pinned=pin)  # fmt: skip
    assert is_behind(rng, end, 1.0) is behind


def test_the_relay_inbox_keeps_order_and_only_the_newest_lag() -> None:
    async def scenario() -> list[Any]:
        inbox = _Inbox()
        boom = RuntimeError("read failed")
        for item in (
            FetchedBatch([], None, announce=True),
            FetchedBatch([], 100),
            FetchedBatch([], 50),
            boom,
            FetchedBatch([], 20),
            FetchedBatch([], 0, shard_ended=True),
            FetchedBatch([], 5),
        ):
            inbox.put(item)
        return [await inbox.get() for _ in range(6)]

    got = asyncio.run(scenario())
    lags = [g.millis_behind_latest if isinstance(g, FetchedBatch) else "error" for g in got]
    assert lags == [None, 50, "error", 20, 0, 5]
    assert got[0].announce and got[4].shard_ended


@pytest.mark.parametrize(
    ("end", "wait"),
    [
        (ended(100, 4 * 1024 * 1024, 5_000), 2.0),  # 4 MiB read: the shard's 2 MiB/s
        (ended(100, 1_000, 5_000), 0.2),  # a small page: 5 calls a second
        (ended(100, 64 * 1024 * 1024, 5_000), 10.0),  # never longer than MAX_READ_PAUSE
        (ended(3, 1_000, 0), 1.5),  # at the tip: idle_seconds
    ],
)
def test_a_shard_is_read_again_only_as_kinesis_allows(end: RangeEnd, wait: float) -> None:
    clock = ManualClock()
    clock.advance(100.0)
    paced = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(idle_seconds=1.5),
                          clock=clock)  # fmt: skip
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, TRIM, max_records=100)
    began = clock.monotonic()
    assert paced._next_read(rng, end, began) == pytest.approx(clock.monotonic() + wait)


@pytest.mark.parametrize(
    ("skew", "due_after_begin"),
    [
        (0.0, 2.1),  # the task's own pacing: 2 s from its answer, 0.1 s into the job
        (-1.0, 2.0),  # an executor clock 1 s behind: never before 2 s from the job's start
        (+1.0, 3.1),  # 1 s ahead: later (the shard is read less often, never too often)
        (+600.0, 10.5),  # far ahead: no longer than a reader's longest pause, from now
        (None, 2.5),  # no figure from the task: 2 s from the job's end
    ],
)
def test_a_shards_pause_counts_from_the_tasks_last_call_not_the_jobs_end(
    skew: float | None, due_after_begin: float
) -> None:
    clock = ManualClock()
    paced = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(), clock=clock)
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, TRIM, max_records=100)
    began = clock.monotonic()
    answered = clock.wall() + 0.1  # the task's GetRecords answer: 4 MiB, 2 s at 2 MiB/s
    clock.advance(0.5)  # the job ends
    at = None if skew is None else answered + 2.0 + skew
    end = replace(ended(100, 4 * 1024 * 1024, 5_000), next_call_at=at)
    assert paced._next_read(rng, end, began) == pytest.approx(began + due_after_begin)


# --- what the review of the first version found ------------------------------------------------

CHILD = {"ShardId": "shardId-000000000001", "ParentShardIds": [KEY]}


def _answer(seqs: list[int], next_iterator: str | None, **extra: Any) -> dict[str, Any]:
    records = [{"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(s),
                "ApproximateArrivalTimestamp": None} for s in seqs]  # fmt: skip
    return {"Records": records, "NextShardIterator": next_iterator, "MillisBehindLatest": 0,
            **extra}  # fmt: skip


class Scripted:
    """GetShardIterator and GetRecords answers in order (what a case needs Kinesis to say)."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = answers

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        return {"ShardIterator": "it-0"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        return self.answers.pop(0)


def _read_range(answers: list[dict[str, Any]], rng: ReadRange) -> tuple[RangeEnd, list[int]]:
    from kclpy_spark.retrieval.range_reader import RangeReader

    kept: list[int] = []

    async def nap(seconds: float) -> None:
        return None

    async def run() -> RangeEnd:
        reader = RangeReader(Scripted(answers), rng, sleep=nap)
        return await reader.read(
            lambda records: kept.extend(int(r.sequence_number) for r in records)
        )

    return asyncio.run(run()), kept


def test_a_failed_read_is_tried_again_no_sooner_than_one_calls_interval_after_it() -> None:
    clock = ManualClock()
    reads = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(), clock=clock)
    entry = _Entry(SOURCE, lambda item: None)
    began = clock.monotonic()
    clock.advance(5.0)  # the job failed late: its backoff from the round's start has passed
    reads._failed(entry, "a read failed", began, make_lane())
    assert entry.next_read_at >= clock.monotonic() + ReadSettings().min_interval


def test_a_failed_read_is_tried_again_no_sooner_than_its_own_pacing_allows() -> None:
    """A pinned read that failed after reading a big page (its records did not match the pin):
    it was read again after the backoff only, a throttled call into a shard still blocked."""
    clock = ManualClock()
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(), clock=clock)
    reader_, entry, _ = started(RefusingFeed(), reader)
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(5))
    failed = RangeEnd(KEY, None, None, 0, 0, error="RangeMismatchError: ...",
                      next_call_at=clock.wall() + 4.0)  # fmt: skip
    reader_._found(entry, ReadSlot(make_lane(), esn(5), None), rng, RangeRead(None, {KEY: failed}),
                   clock.monotonic())  # fmt: skip
    assert entry.next_read_at >= clock.monotonic() + 4.0 and entry.failures == 1


def test_a_failed_range_read_tells_when_its_shard_may_be_called_again() -> None:
    from kclpy_spark.retrieval.range_reader import RangeReader

    class Mismatch(Exception):
        pass

    async def nap(seconds: float) -> None:
        return None

    async def run() -> BaseException:
        reader = RangeReader(Scripted([_answer([6, 7], "it-1")]), ReadRange(KEY, "s",
                             {"StreamName": "s"}, KEY, esn(5)), sleep=nap)  # fmt: skip

        def broken(records: Any) -> None:
            raise Mismatch("the records differ")

        with pytest.raises(Mismatch) as caught:
            await reader.read(broken)
        return caught.value

    failure = asyncio.run(run())
    assert isinstance(getattr(failure, "next_call_at", None), float)


def test_a_throttled_first_call_is_paced_from_that_call() -> None:
    from kclpy_spark.retrieval.range_reader import RangeReader

    clock = ManualClock()
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10))
    reader = RangeReader(Scripted([]), rng, clock=clock.monotonic, wall=clock.wall)
    reader._called = clock.monotonic()  # its call was refused: no answer
    clock.advance(0.05)
    assert reader._pause(clock.monotonic()) == pytest.approx(MIN_INTERVAL_WHILE_BEHIND - 0.05)
    assert reader._next_call_at() == pytest.approx(clock.wall() + MIN_INTERVAL_WHILE_BEHIND - 0.05)


@pytest.mark.parametrize(
    ("read_rate", "pause"),
    [(0.0, MIN_INTERVAL_WHILE_BEHIND), (1.0, MAX_READ_PAUSE)],  # 5 calls a second; the bytes
)
def test_a_read_says_when_its_shard_may_be_called_again(read_rate: float, pause: float) -> None:
    from kclpy_spark.retrieval.range_reader import RangeReader

    clock = ManualClock()
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), read_rate=read_rate)

    async def run() -> RangeEnd:
        reader = RangeReader(Scripted([_answer([20, 30], "it-1")]), rng, sleep=clock.sleep,
                             clock=clock.monotonic, wall=clock.wall)  # fmt: skip
        return await reader.read(lambda records: None)

    end = asyncio.run(run())
    assert end.rows == 2 and end.next_call_at == pytest.approx(clock.wall() + pause)
    assert RangeEnd.from_json(end.to_json()) == end


def test_a_re_formed_piece_whose_page_ends_the_shard_does_not_end_it() -> None:
    """The page holds the piece, records after it, and the shard's end: the piece is read, the
    shard is not reported ended (the records after the piece are the next range's)."""
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), pinned=Pinned(None, esn(30), None))
    end, kept = _read_range([_answer([20, 30, 40, 50], None, ChildShards=[CHILD])], rng)
    assert kept == [20, 30] and not end.shard_ended and end.child_shards == ()


def test_an_unpinned_read_that_reaches_the_end_reports_it_with_its_children() -> None:
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10))
    end, kept = _read_range([_answer([20, 30], None, ChildShards=[CHILD])], rng)
    assert kept == [20, 30] and end.shard_ended and end.child_shards == (CHILD,)


def test_kpl_sub_records_skipped_on_an_executor_reach_the_lease_s_count() -> None:
    """An aggregate holding a sub-record outside the child's hash range is skipped whole (as
    the driver path and the KCL skip it); on the executors it was told only in the executor's
    own log, and the daemon's metric said 0. Its two sub-records now come back in the range's
    end, through its JSON, to what the lease is told."""
    from kclpy_spark.retrieval.kpl_aggregate import UserRecord, aggregate

    straddling = aggregate([UserRecord("a", b"x", explicit_hash_key="10"),
                            UserRecord("b", b"y", explicit_hash_key="99999")])  # fmt: skip
    answer = _answer([20, 30], "it-1")
    answer["Records"][1]["Data"] = straddling
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), hash_range=(0, 1000))
    end, kept = _read_range([answer], rng)
    assert kept == [20] and end.out_of_range == 2
    end = RangeEnd.from_json(end.to_json())
    reads_, entry, posted = started(TakingFeed())
    reads_._found(entry, ReadSlot(make_lane(), esn(10), None), rng, RangeRead(None, {KEY: end}), 0)
    [batch] = posted
    assert batch.elsewhere is not None and batch.elsewhere.out_of_range == 2


class RefusingFeed:
    def readable(self, lease_keys: Any) -> tuple[dict[str, ReadSlot], set[str]]:
        return {}, set()

    def together(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def fill(self, lane: Lane, chunk: RangeChunk, epoch: int | None = None) -> bool:
        return False  # parked or closed while the read ran


def test_records_a_lane_did_not_take_are_read_again_and_no_end_is_passed_on() -> None:
    reads_, entry, posted = started(RefusingFeed())
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(5))
    ended_here = RangeEnd(KEY, esn(6), esn(9), 3, 30, shard_ended=True, child_shards=(CHILD,),
                          next_iterator=None)  # fmt: skip
    read = RangeRead(stored=None, ends={KEY: ended_here})
    reads_._found(entry, ReadSlot(make_lane(), esn(5), None), rng, read, now=0.0)
    assert not entry.ended and posted == [] and entry.iterator is None


def test_a_parked_lane_is_told_to_its_processor_whatever_its_last_lag() -> None:
    """A parked lane's notice was a lag report with the last lag, None after a full page: the
    consumer ignored it, and the lease stayed held and unread."""

    class ParkedFeed(RefusingFeed):
        def readable(self, lease_keys: Any) -> tuple[dict[str, ReadSlot], set[str]]:
            return {}, {KEY}

    reads_, entry, posted = started(ParkedFeed())
    entry.lag = None
    assert reads_.read_round() == 0
    assert len(posted) == 1 and posted[0].announce and not posted[0].records


def test_collapsed_lag_reports_add_up_the_records_they_counted() -> None:
    async def scenario() -> list[Any]:
        inbox = _Inbox()
        inbox.put(FetchedBatch([], 90, elsewhere=ReadElsewhere(10, 100, "7", 1)))
        inbox.put(FetchedBatch([], 40))  # an empty read at the tip: nothing counted
        inbox.put(FetchedBatch([], 0, elsewhere=ReadElsewhere(5, 50, "9", 2)))
        return [await inbox.get()]

    [only] = asyncio.run(scenario())
    assert only.millis_behind_latest == 0
    assert only.elsewhere == ReadElsewhere(15, 150, "9", 3)


class TakingFeed(RefusingFeed):
    def fill(self, lane: Lane, chunk: RangeChunk, epoch: int | None = None) -> bool:
        return True


def test_a_read_its_lane_took_is_counted_for_the_lease() -> None:
    reads_, entry, posted = started(TakingFeed())
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(5))
    end = RangeEnd(KEY, esn(6), esn(9), 3, 30, millis_behind_latest=70, throttled=2)
    reads_._found(entry, ReadSlot(make_lane(), esn(5), None), rng, RangeRead(None, {KEY: end}), 0)
    [batch] = posted
    assert batch.records == [] and batch.millis_behind_latest == 70
    assert batch.elsewhere == ReadElsewhere(3, 30, esn(9).sequence_number, 2)


def test_the_relay_counts_a_reads_throttled_calls_for_the_shard() -> None:
    throttled: list[int] = []

    async def scenario() -> tuple[FetchedBatch, FetchedBatch, FetchProgress]:
        reads_ = reads()
        progress = FetchProgress(lambda: 0.0, on_throttled=lambda: throttled.append(1))
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        task = asyncio.create_task(LeaseRelay(reads_, SOURCE, queue, progress).run())
        first = await queue.get()
        reads_._entries[KEY].post(FetchedBatch([], 0, elsewhere=ReadElsewhere(1, 10, "5", 3)))
        second = await queue.get()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return first, second, progress

    first, second, progress = asyncio.run(scenario())
    assert first.announce and second.elsewhere is not None and second.elsewhere.rows == 1
    assert len(throttled) == 3 and progress.throttled == 3


class Jobs:
    """An Interrupter that records tags and releases the hung read it interrupts."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.interrupted: list[str] = []
        self.release = threading.Event()

    @contextlib.contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        self.tags.append(tag)
        yield

    def interrupt(self, tag: str) -> None:
        self.interrupted.append(tag)
        self.release.set()


class OneSlotFeed(RefusingFeed):
    def readable(self, lease_keys: Any) -> tuple[dict[str, ReadSlot], set[str]]:
        return {KEY: ReadSlot(make_lane(), None, None)}, set()


def test_a_read_job_that_hangs_is_cancelled_and_fails_its_ranges() -> None:
    jobs = Jobs()

    def hung_read(session: Any, ranges: Any, aws: Any, **kw: Any) -> Any:
        assert jobs.release.wait(10), "never interrupted"
        raise RuntimeError("Job cancelled")  # what Spark raises in the interrupted thread

    reads_, _, posted = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(max_seconds=0.05, job_grace=0.05),
        jobs=jobs, read=hung_read, tasks=lambda session: 1,
    ))  # fmt: skip
    try:
        assert reads_.read_round() == 1
    finally:
        reads_.close()
    assert jobs.interrupted == jobs.tags and len(jobs.tags) == 1
    assert jobs.tags[0].startswith("kclpy-spark-read-") and jobs.tags[0].endswith("-1")
    [failure] = posted
    # a job that failed whole: every lease reads again after a backoff, none counting a failure
    assert isinstance(failure, ReadJobFailedError) and failure.retriable
    assert "ran over 0 s and was cancelled" in str(failure)


def test_a_read_job_that_does_not_return_after_its_cancel_is_told_to_readiness() -> None:
    """A JVM that answers no more: the cancelled job never returned, every lease waited on the
    one read thread, and nothing said so (no records, so no write to hang)."""
    clock = ManualClock()
    jobs = Jobs()
    gone = threading.Event()

    def stuck_read(session: Any, ranges: Any, aws: Any, **kw: Any) -> Any:
        gone.wait(10)  # the interrupt reaches nothing
        raise RuntimeError("Job cancelled")

    reads_, _, _ = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(max_seconds=0.05, job_grace=0.05),
        jobs=jobs, read=stuck_read, tasks=lambda session: 1, clock=clock,
    ))  # fmt: skip
    with _round_on_a_thread(reads_, gone) as factory:
        _wait_until(lambda: bool(jobs.interrupted))
        _told_to_readiness_past_the_grace(factory, clock)


@contextlib.contextmanager
def _round_on_a_thread(reads_: ExecutorReads, gone: threading.Event) -> Iterator[Any]:
    """A read round on a thread of its own, stuck until ``gone`` is set (at the end); yields
    the Spark sink's factory whose readiness tells of it. Ready again once the round returned."""
    from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory

    batcher = SimpleNamespace(hung_writes=0, writes=SimpleNamespace(max_hung_writes=2))
    factory = SparkSinkProcessorFactory(batcher, "s", reads=reads_)  # type: ignore[arg-type]
    job = threading.Thread(target=reads_.read_round)
    job.start()
    try:
        yield factory
    finally:
        gone.set()
        job.join(10)
        reads_.close()
    assert factory.readiness() == (True, "ready") and reads_.hung_for() is None


def _wait_until(condition: Any) -> None:
    deadline = time.monotonic() + 10
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _told_to_readiness_past_the_grace(factory: Any, clock: ManualClock) -> None:
    from kclpy_spark.spark.sink_processor import READ_CANCEL_GRACE

    assert factory.readiness() == (True, "ready")  # it ran over a moment ago
    clock.advance(READ_CANCEL_GRACE + 1)
    ready, why = factory.readiness()
    assert not ready and "has not returned" in why


class _StuckJvm:
    """A py4j object whose calls never answer until ``gone`` is set."""

    def __init__(self, gone: threading.Event) -> None:
        self._gone = gone

    def context(self) -> _StuckJvm:
        return self

    def id(self) -> int:
        return 1

    def unpersistRDD(self, *args: Any) -> None:
        self._gone.wait(10)

    def defaultParallelism(self) -> int:
        self._gone.wait(10)
        return 1


@pytest.mark.parametrize("stuck", ["the cluster's cores", "unpersisting a read"])
def test_a_driver_jvm_call_around_a_read_job_that_never_answers_is_told_to_readiness(
    stuck: str,
) -> None:
    """The calls a round makes to the driver's JVM outside its read job (freeing the stored
    reads, asking the cluster's cores) had no deadline: a JVM that stopped answering there held
    every lease's reads and readiness said "ready"."""
    clock = ManualClock()
    gone = threading.Event()
    jvm = _StuckJvm(gone)

    def cores(session: Any) -> int:
        return jvm.defaultParallelism() if stuck == "the cluster's cores" else 1

    def read(session: Any, ranges: Any, aws: Any, **kw: Any) -> Any:
        raise RuntimeError("not reached while stuck")

    reads_, _, _ = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(max_seconds=0.05, job_grace=0.05),
        jobs=Jobs(), read=read, tasks=cores, clock=clock,
    ))  # fmt: skip
    if stuck == "unpersisting a read":
        reads_.stored._gone.append(jvm)
    with _round_on_a_thread(reads_, gone) as factory:
        _wait_until(lambda: reads_.hung_for() is not None)
        assert reads_.hung_for() == 0.0  # noted at its deadline, by the reader's clock
        _told_to_readiness_past_the_grace(factory, clock)


@pytest.mark.parametrize(
    ("leases", "tasks", "limit"),
    [
        (1, 2, 2.0 + 10.0 + 90.0),
        (8, 1, 2.0 + 10.0 + 90.0),  # one task reads eight side by side: one wave
        (9, 1, 2.0 + 2 * 100.0),
        (16, 2, 2.0 + 100.0),
        (1000, 2, 2.0 + 63 * 100.0),  # 500 ranges a task, 8 at a time
    ],
)  # fmt: skip
def test_a_read_jobs_deadline_counts_the_waves_of_ranges_its_busiest_task_reads(
    leases: int, tasks: int, limit: float
) -> None:
    """Counting one wave only, a job of many leases a core that Kinesis slowed (each range
    taking its budget) was cancelled every round, and every lease's read failed with it."""
    ranges = [
        ReadRange(f"shard-{i}", "s", {"StreamName": "s"}, f"shard-{i}", TRIM,
                  max_seconds=10.0 if i == 0 else 1.0, delay=2.0 if i == leases - 1 else 0.0)
        for i in range(leases)
    ]  # fmt: skip
    assert read_job_limit(ranges, tasks, grace=90.0) == pytest.approx(limit)


@pytest.mark.parametrize(("cores", "given"), [(3, 3), (None, None)])
def test_the_read_is_given_the_clusters_cores_as_asked_once_for_the_deadline(
    cores: int | None, given: int | None
) -> None:
    """Cores not known (Spark Connect without ``spark.default.parallelism``): the read keeps its
    own default, a task a range, and the deadline counts one wave."""
    asked: list[Any] = []
    end = RangeEnd(KEY, None, None, 0, 0, millis_behind_latest=0)

    def job(session: Any, ranges: Any, aws: Any, **kw: Any) -> RangeRead:
        asked.append(kw["partitions"])
        return RangeRead(None, {KEY: end})

    reads_, _, _ = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(), jobs=Jobs(), read=job,
        tasks=lambda session: cores,
    ))  # fmt: skip
    try:
        assert reads_.read_round() == 1
    finally:
        reads_.close()
    assert asked == [given]


def test_a_read_job_in_time_is_not_cancelled() -> None:
    jobs = Jobs()
    end = RangeEnd(KEY, None, None, 0, 0, millis_behind_latest=0)
    reads_, _, posted = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(job_grace=0.05), jobs=jobs,
        read=lambda *a, **kw: RangeRead(None, {KEY: end}), tasks=lambda session: 1,
    ))  # fmt: skip
    try:
        assert reads_.read_round() == 1
        time.sleep(0.2)  # past the deadline it would have had
    finally:
        reads_.close()
    assert len(jobs.tags) == 1 and jobs.interrupted == []
    assert [p.millis_behind_latest for p in posted] == [0]


def test_a_range_with_an_arrival_bound_stops_before_the_first_later_record() -> None:
    """#44's Trigger.AvailableNow: records that arrived after ``until_millis`` are not read, and
    the read says it met the bound; a pinned re-read ignores the bound (its pin decides)."""
    from datetime import UTC, datetime

    def page(arrivals: dict[int, int]) -> dict[str, Any]:
        records = [{"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(s),
                    "ApproximateArrivalTimestamp": datetime.fromtimestamp(ms / 1000, tz=UTC)}
                   for s, ms in arrivals.items()]  # fmt: skip
        return {"Records": records, "NextShardIterator": "it-1", "MillisBehindLatest": 5000}

    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), until_millis=2_000)
    end, kept = _read_range([page({20: 1_000, 30: 2_000, 40: 2_001, 50: 1_500})], rng)
    assert kept == [20, 30] and end.bounded and end.last == esn(30)
    end, kept = _read_range([page({20: 1_000}), page({30: 3_000})], rng)
    assert kept == [20] and end.bounded
    unbounded = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), max_pages=1)
    end, kept = _read_range([page({20: 1_000, 30: 9_000})], unbounded)
    assert kept == [20, 30] and not end.bounded


def test_a_bounded_read_of_the_shards_last_page_does_not_end_the_shard() -> None:
    """AvailableNow's bound met on the page that also ends the shard (a reshard after the
    bound): the read said the shard ended, so the records after the bound were never read, in
    this run or any later one (the children started instead)."""
    from datetime import UTC, datetime

    child = {"ShardId": "shardId-000000000001", "ParentShards": [KEY],
             "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}  # fmt: skip
    records = [{"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(s),
                "ApproximateArrivalTimestamp": datetime.fromtimestamp(ms / 1000, tz=UTC)}
               for s, ms in ((20, 1_000), (30, 3_000))]  # fmt: skip
    last_page = {"Records": records, "MillisBehindLatest": 0, "ChildShards": [child]}
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), until_millis=2_000)
    end, kept = _read_range([last_page], rng)
    assert kept == [20] and end.bounded and not end.shard_ended and not end.child_shards
    end, kept = _read_range([last_page], ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10)))
    assert kept == [20, 30] and end.shard_ended  # unbounded: the end is read with its records


# --- leases gathered into fewer read jobs ---------------------------------------------------------


def _entry_due(at: float, ended: bool = False, behind: bool = True, pace: float = 1.0) -> _Entry:
    entry = _Entry(SOURCE, lambda item: None)
    entry.next_read_at, entry.ended, entry.behind, entry.pace = at, ended, behind, pace
    return entry


@pytest.mark.parametrize(
    ("due_at", "ahead", "want"),
    [
        ({"a": 10.0, "b": 10.2, "c": 11.0}, 0.3, {"a", "b"}),  # b comes due within the job
        ({"a": 10.0, "b": 10.2}, 0.0, {"a"}),  # no look-ahead: only what is due
        ({"a": 10.1, "b": 10.2}, 0.5, set()),  # nothing due now: no round, however close
        ({"a": 9.0, "b": 10.0, "c": 10.5}, 0.5, {"a", "b", "c"}),  # the horizon included
        ({"a": 10.0, "ended": 10.0}, 0.5, {"a"}),  # an ended lease is never read
        ({"a": 10.0, "tip": 10.2}, 0.5, {"a"}),  # one at its tip is not taken early
        ({"tip": 10.0, "b": 10.2}, 0.5, {"tip", "b"}),  # but read when due, with those behind
    ],
)
def test_a_round_takes_the_leases_due_now_and_those_behind_due_before_its_job_would_end(
    due_at: dict[str, float], ahead: float, want: set[str]
) -> None:
    entries = {k: _entry_due(at, ended=k == "ended", behind=k != "tip")
               for k, at in due_at.items()}  # fmt: skip
    assert set(round_leases(entries, 10.0, ahead)) == want


@pytest.mark.parametrize(
    ("due_at", "align", "ahead", "want"),
    [
        ({"a": 10.0, "b": 10.3}, 0.5, 0.0, 10.3),  # waits for b, behind, coming due
        ({"a": 10.0, "b": 10.3}, 0.5, 0.2, 10.1),  # until b is within the look-ahead
        ({"a": 10.0, "b": 10.3}, 0.5, 0.4, 10.0),  # already within it: no wait
        ({"a": 10.0, "b": 10.3, "c": 10.4}, 0.5, 0.0, 10.4),  # for the last of those coming
        ({"a": 10.0, "b": 10.7}, 0.5, 0.0, 10.0),  # b comes past the wait: no wait
        ({"a": 9.8, "b": 10.2, "c": 10.4}, 0.5, 0.0, 10.2),  # c comes past align after a
        ({"a": 9.4, "b": 10.3}, 0.5, 0.0, 10.0),  # waited enough already
        ({"a": 10.0, "tip": 10.3}, 0.5, 0.0, 10.0),  # one at its tip is not waited for
        ({"a": 10.0, "ended": 10.3}, 0.5, 0.0, 10.0),  # nor an ended one
        ({"a": 10.0, "b": 10.3}, 0.0, 0.0, 10.0),  # no alignment
        ({"a": 10.1, "b": 10.3}, 0.5, 0.0, 10.0),  # nothing due: the round (none) is not deferred
        ({"a": 10.0, "half": 10.3}, 0.5, 0.0, 10.0),  # another pace: never in step
        ({"half": 10.0, "b": 10.3}, 0.5, 0.0, 10.0),  # nor the other way round
        ({"a": 10.0, "near": 10.3}, 0.5, 0.0, 10.3),  # within SAME_PACE: waited for
        ({"a": 10.0, "slower": 10.3}, 0.5, 0.0, 10.0),  # 5% slower: not waited for
        ({"a": 10.0, "half": 10.0, "b": 10.3}, 0.5, 0.0, 10.0),  # every lease due must match
        ({"a": 10.0, "new": 10.3}, 0.5, 0.0, 10.0),  # none read yet: no pace known
    ],
)
def test_a_round_due_waits_a_little_for_leases_behind_coming_due(
    due_at: dict[str, float], align: float, ahead: float, want: float
) -> None:
    paces = {"half": 0.5, "near": 1.015, "slower": 1.05, "new": 0.0}
    entries = {k: _entry_due(at, ended=k == "ended", behind=k != "tip", pace=paces.get(k, 1.0))
               for k, at in due_at.items()}  # fmt: skip
    assert round_start(entries, 10.0, align, ahead) == pytest.approx(want)


@pytest.mark.parametrize(("max_records", "aligned"), [(40_000, True), (39_999, False)])
def test_leases_in_two_phases_merge_into_one_round_when_each_reads_a_full_page(
    max_records: int, aligned: bool
) -> None:
    """Four leases behind, two due now and two 0.4 s later: with a full page each (40,000
    records over four) the round waits for the later two and reads all four; with less, each
    lease's read is cut by its share, and the two due read at once."""
    clock = ManualClock()
    planned: list[set[str]] = []

    def job(session: Any, ranges: list[ReadRange], aws: Any, **kw: Any) -> RangeRead:
        planned.append({r.lease_key for r in ranges})
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, None, None, 0, 0,
                                                       millis_behind_latest=0)
                                for r in ranges})  # fmt: skip

    settings = ReadSettings(max_records=max_records, max_gather=0.0, align=0.5)
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), settings,
                           clock=clock, read=job, tasks=lambda session: 1)  # fmt: skip
    reader.start(AllSlotsFeed(), threaded=False)
    now = clock.monotonic()
    for key, at in (("a", now), ("b", now), ("c", now + 0.4), ("d", now + 0.4)):
        entry = reader.register(replace(SOURCE, lease_key=key), lambda item: None)
        entry.next_read_at, entry.behind, entry.pace = at, True, 1.0
    if not aligned:
        assert reader.read_round() == 2 and planned == [{"a", "b"}]
        return
    assert reader.read_round() == 0 and planned == []
    assert reader._wait() == pytest.approx(0.4)
    clock.advance(0.4)
    assert reader.read_round() == 4 and planned == [{"a", "b", "c", "d"}]


def test_a_leases_record_size_is_measured_in_the_kinesis_records_the_limit_counts() -> None:
    """KPL aggregates of five 200-byte records: a page of 2,000 aggregates is 10,000 rows. By
    rows a record looked 200 bytes, and the next range asked a page of aggregates five times
    its share of the bytes (a 2.8 MB share, a 10 MB read)."""

    def job(session: Any, ranges: list[ReadRange], aws: Any, **kw: Any) -> RangeRead:
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, None, None, 10_000, 2_000_000,
                                                       millis_behind_latest=60_000,
                                                       read_records=2_000, read_bytes=2_000_000)
                                for r in ranges})  # fmt: skip

    settings = ReadSettings(max_records=100_000, page_per_lease=True)
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), settings, read=job,
                           tasks=lambda session: 1)  # fmt: skip
    reader.start(AllSlotsFeed(), threaded=False)
    entry = reader.register(SOURCE, lambda item: None)
    assert reader.read_round() == 1
    assert entry.record_bytes == 1_000
    share = 64 * 1024 * 1024 // 24
    rng = reader._range(entry, ReadSlot(make_lane(), None, None), leases=24, behind=24, now=0.0)
    assert rng.max_records == max(100_000 // 24, share // 1_000)


@pytest.mark.parametrize("cut", [True, False])
def test_a_round_never_waits_for_leases_whose_reads_their_share_cut_short(cut: bool) -> None:
    """A page a lease allowed (``page_per_lease``), but the round's ``max_bytes`` share holds
    fewer of the leases' records than a page, so each read stops at its share: the pace of such
    a read says nothing of its shard's, and a lease read less often reads less. Two leases due,
    two 0.4 s later: the round reads the two due at once; with whole pages it waits for the
    other two."""
    clock = ManualClock()
    planned: list[set[str]] = []

    def job(session: Any, ranges: list[ReadRange], aws: Any, **kw: Any) -> RangeRead:
        planned.append({r.lease_key for r in ranges})
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, None, None, r.max_records,
                                                       r.max_records * 100,
                                                       millis_behind_latest=60_000,
                                                       read_records=r.max_records,
                                                       read_bytes=r.max_records * 100)
                                for r in ranges})  # fmt: skip

    share = 5_000 if cut else 10_000  # records of 100 bytes in a lease's share of the bytes
    settings = ReadSettings(max_records=4_000, max_bytes=4 * share * 100, page_per_lease=True,
                            max_gather=0.0, align=0.5)  # fmt: skip
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), settings,
                           clock=clock, read=job, tasks=lambda session: 1)  # fmt: skip
    reader.start(AllSlotsFeed(), threaded=False)
    now = clock.monotonic()
    for key in "abcd":
        entry = reader.register(replace(SOURCE, lease_key=key), lambda item: None)
        entry.next_read_at, entry.behind = now, True
    for _ in range(2):  # the first read measures the records, the second reads its share
        clock.advance(max(0.0, min(e.next_read_at for e in reader._entries.values())
                          - clock.monotonic()))  # fmt: skip
        assert reader.read_round() == 4
    entries = reader._entries
    for key in "cd":
        entries[key].next_read_at = entries["a"].next_read_at + 0.4
    clock.advance(entries["a"].next_read_at - clock.monotonic())
    planned.clear()
    if not cut:
        assert reader.read_round() == 0
        clock.advance(0.4)
        assert reader.read_round() == 4 and planned == [set("abcd")]
    else:
        assert reader.read_round() == 2 and planned == [{"a", "b"}]


class AllSlotsFeed(RefusingFeed):
    def readable(self, lease_keys: Any) -> tuple[dict[str, ReadSlot], set[str]]:
        return {k: ReadSlot(make_lane(k), None, None) for k in lease_keys}, set()


def _simulate(
    align: float, page_bytes: dict[str, int], seconds: float = 30.0
) -> tuple[Counter[str], int]:
    """Leases always behind, each page of ``page_bytes[lease]`` (paced at 2 MiB/s), half of them
    first read 0.45 s after the others (two phases), each read job 0.1 s: reads per lease and
    read jobs in ``seconds``."""
    clock = ManualClock()
    reads: Counter[str] = Counter()
    jobs = [0]

    def job(session: Any, ranges: list[ReadRange], aws: Any, **kw: Any) -> RangeRead:
        jobs[0] += 1
        clock.advance(max(r.delay for r in ranges) + 0.1)
        reads.update(r.lease_key for r in ranges)
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, None, None, 10_000,
                                                       page_bytes[r.lease_key],
                                                       millis_behind_latest=60_000)
                                for r in ranges})  # fmt: skip

    settings = ReadSettings(max_records=10_000 * len(page_bytes), align=align)
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), settings,
                           clock=clock, read=job, tasks=lambda session: 1)  # fmt: skip
    reader.start(AllSlotsFeed(), threaded=False)
    began = clock.monotonic()
    for i, key in enumerate(page_bytes):
        entry = reader.register(replace(SOURCE, lease_key=key), lambda item: None)
        entry.next_read_at, entry.behind = began + 0.45 * (i % 2), True
    while clock.monotonic() - began < seconds:
        if reader.read_round() == 0:
            with reader._lock:
                clock.advance(reader._wait())
    return reads, jobs[0]


def test_aligned_rounds_cost_no_lease_a_read_and_take_fewer_jobs() -> None:
    """Leases of one page size merge into fewer read jobs, each read as often; a lease of pages
    half or five sixths the size of the others' is never held to their pace (waited for every
    round, it lost up to half its reads, or a sixth)."""
    mib = 1024 * 1024
    same = {f"s{i}": 2 * mib for i in range(6)}
    for smaller in (mib, 2 * mib * 5 // 6):
        mixed = {**{f"h{i}": smaller for i in range(3)}, **{f"f{i}": 2 * mib for i in range(3)}}
        free, _ = _simulate(0.0, mixed)
        aligned, _ = _simulate(0.5, mixed)
        for key in mixed:
            assert aligned[key] >= 0.95 * free[key], (smaller, key, aligned[key], free[key])
    free, free_jobs = _simulate(0.0, same)
    aligned, aligned_jobs = _simulate(0.5, same)
    for key in same:
        assert aligned[key] >= 0.95 * free[key], (key, aligned[key], free[key])
    assert aligned_jobs < 0.8 * free_jobs


def test_a_lease_taken_early_waits_on_its_task_and_its_pause_counts_from_then() -> None:
    """A lease due 0.2 s after the round starts is read in it, its task told to wait 0.2 s; the
    look-ahead is the last job's length less that wait, at most ``max_gather``; and the lease's
    next read is never before a call's interval from its own call (an executor clock behind)."""
    clock = ManualClock()
    planned: list[list[ReadRange]] = []
    job_seconds = [0.05]

    def job(session: Any, ranges: list[ReadRange], aws: Any, **kw: Any) -> RangeRead:
        planned.append(ranges)
        clock.advance(max(r.delay for r in ranges) + job_seconds[0])  # the wait, then the job
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, None, None, 0, 0,
                                                       millis_behind_latest=0)
                                for r in ranges})  # fmt: skip

    settings = ReadSettings(max_gather=0.4, align=0.0)  # the look-ahead alone
    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), settings,
                           clock=clock, read=job, tasks=lambda session: 1)  # fmt: skip
    reader.start(AllSlotsFeed(), threaded=False)
    now = clock.monotonic()
    for key, at in (("a", now), ("b", now + 0.2), ("c", now + 5.0)):
        entry = reader.register(replace(SOURCE, lease_key=key), lambda item: None)
        entry.next_read_at, entry.behind = at, True
    reader._gather = 0.3  # as if the last job took 0.3 s
    assert reader.read_round() == 2
    assert {r.lease_key: r.delay for r in planned[0]} == pytest.approx({"a": 0.0, "b": 0.2})
    assert reader._gather == pytest.approx(0.05)  # 0.25 s in all, 0.2 of them waiting
    assert not reader._entries["b"].behind  # read to its tip: not taken early next time
    job_seconds[0] = 2.0
    reader._gather = 0.0
    reader._entries["a"].next_read_at = clock.monotonic()
    assert reader.read_round() == 1
    assert reader._gather == pytest.approx(0.4)  # a long job: the look-ahead is capped
    rng = replace(planned[0][1], max_records=100)
    behind = RangeEnd(rng.lease_key, esn(1), esn(100), 100, 1_000, millis_behind_latest=5_000,
                      next_call_at=clock.wall() - 1.0)  # fmt: skip
    began = clock.monotonic() - 0.25
    assert reader._next_read(rng, behind, began) == pytest.approx(began + 0.2 + 0.2)


def test_a_delayed_range_is_not_called_before_its_delay_on_the_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the executor the task waits the range's delay before its first call, outside the gate
    that bounds how many ranges a task reads at once: with room for one read at a time, a range
    without delay is read while the other one waits."""
    from kclpy_spark.spark import range_tasks

    monkeypatch.setattr(range_tasks, "READS_AT_ONCE", 1)
    calls: dict[str, float] = {}

    class Client(Scripted):
        async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
            calls[kw["ShardId"]] = time.monotonic()
            return {"ShardIterator": "it-0"}

        async def get_records(self, **_: Any) -> dict[str, Any]:
            return _answer([1], "it-1")

    reads_ = range_tasks.TaskReads()
    reads_._frozen = True  # not this test process's heap

    async def client(aws: Any) -> Any:
        return Client([])

    reads_._client = client  # type: ignore[method-assign]
    waits = ReadRange("w", "s", {"StreamName": "s"}, "shard-w", TRIM, max_pages=1, delay=0.3)
    now = ReadRange("n", "s", {"StreamName": "s"}, "shard-n", TRIM, max_pages=1)
    began = time.monotonic()
    try:
        done = [(got.lease_key, outcome) for got, outcome in
                reads_.reads([waits, now], AwsTarget("us-east-1"))]  # fmt: skip
    finally:
        reads_._loop.call_soon_threadsafe(reads_._loop.stop)
        reads_._thread.join(5)
    assert [key for key, _ in done] == ["n", "w"]  # the one without delay came back first
    assert not any(isinstance(outcome, BaseException) for _, outcome in done)
    assert calls["shard-w"] - began >= 0.3 and calls["shard-n"] < calls["shard-w"]


def test_a_task_lets_go_of_each_ranges_records_once_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every range's records stayed held (its future, in the task's own maps) until the task's
    last range ended: a task's memory was the sum of its ranges', not ``READS_AT_ONCE`` of them."""
    import threading

    import pyarrow as pa

    from kclpy_spark.processor import Record
    from kclpy_spark.retrieval import range_reader
    from kclpy_spark.spark import range_tasks

    last_may_end = threading.Event()

    class MegabyteReader:
        def __init__(self, client: Any, rng: ReadRange, **_: Any) -> None:
            self.rng = rng

        async def read(self, on_records: Any) -> RangeEnd:
            if self.rng.lease_key == "last":
                while not last_may_end.is_set():
                    await asyncio.sleep(0.01)
            on_records([Record(b"x" * 100_000, "k", str(100 + i)) for i in range(10)])
            return RangeEnd(self.rng.lease_key, esn(100), esn(109), 10, 1_000_000)

    monkeypatch.setattr(range_reader, "RangeReader", MegabyteReader)
    reads_ = range_tasks.TaskReads()
    reads_._frozen = True  # not this test process's heap

    async def client(aws: Any) -> Any:
        return object()

    reads_._client = client  # type: ignore[method-assign]
    keys = [f"r{i}" for i in range(6)] + ["last"]
    ranges = [ReadRange(k, "s", {"StreamName": "s"}, k, TRIM, max_pages=1) for k in keys]
    before = pa.total_allocated_bytes()
    held: list[int] = []
    try:
        for n, (rng, outcome) in enumerate(reads_.reads(ranges, AwsTarget("us-east-1")), 1):
            assert not isinstance(outcome, BaseException) and rng.lease_key == keys[n - 1]
            del outcome  # the caller is done with these records
            held.append(pa.total_allocated_bytes() - before)
            if n == 6:
                last_may_end.set()
    finally:
        reads_._loop.call_soon_threadsafe(reads_._loop.stop)
        reads_._thread.join(5)
    assert held[5] < 2_500_000, held  # six ranges given back, one running: at most two held


def test_an_executors_client_makes_one_request_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's own retries ran inside each call: a throttled shard got four GetRecords 20 ms
    apart, unseen by the reader's pacing and counts. A local HTTP stub throttles every call."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kclpy_spark.spark import range_tasks

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    targets: list[str] = []

    class Throttling(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            targets.append(self.headers.get("X-Amz-Target", ""))
            if targets[-1].endswith("GetShardIterator"):
                code, body = 200, {"ShardIterator": "it-0"}
            else:
                code, body = 400, {"__type": "ProvisionedThroughputExceededException"}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/x-amz-json-1.1")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Throttling)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reads_ = range_tasks.TaskReads()
    reads_._frozen = True  # not this test process's heap
    target = AwsTarget("us-east-1", f"http://127.0.0.1:{server.server_port}")
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(10), max_pages=1)
    try:
        [(_, outcome)] = list(reads_.reads([rng], target))
    finally:
        reads_._loop.call_soon_threadsafe(reads_._loop.stop)
        reads_._thread.join(5)
        server.shutdown()
    assert not isinstance(outcome, BaseException)
    end = outcome[1]
    assert end.throttled == end.calls == 1  # it gave way at once, as the reader means to
    assert sum(t.endswith("GetRecords") for t in targets) == 1


# --- reads nobody answers (from a review) -----------------------------------------------------


class _Refusing:
    """Kinesis as the executors see it: every GetShardIterator fails with a 500
    (``iterators_fail``), or every GetRecords is throttled (another reader takes the shard)."""

    def __init__(self, *, iterators_fail: bool) -> None:
        self._iterators_fail = iterators_fail
        self.calls = 0

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        self.calls += 1
        assert self.calls < 1000
        if self._iterators_fail:
            failure: Any = {"Error": {"Code": "InternalFailure", "Message": "x"},
                            "ResponseMetadata": {"HTTPStatusCode": 500}}  # fmt: skip
            raise ClientError(failure, "GetShardIterator")
        return {"ShardIterator": "it-0"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        self.calls += 1
        assert self.calls < 1000
        throttled: Any = {"Error": {"Code": "ProvisionedThroughputExceededException"},
                          "ResponseMetadata": {"HTTPStatusCode": 400}}  # fmt: skip
        raise ClientError(throttled, "GetRecords")


def _rounds_nobody_answers(
    kinesis: Any, rounds: int
) -> tuple[FetchProgress, list[Any], list[float], int]:
    """``rounds`` read rounds of one lease through a real RangeReader, ExecutorReads and
    LeaseRelay: the progress, what reached the queue, how long each range held its job and
    the failures its planner counted (its backoff)."""
    from kclpy_spark.retrieval.range_reader import RangeReader

    clock = ManualClock()
    reads = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(), clock=clock)
    source = LeaseSource(KEY, "s", {"StreamName": "s"}, KEY, ExtendedSequenceNumber("5"))
    held: list[float] = []

    async def nap(seconds: float) -> None:
        clock.advance(seconds)

    async def scenario() -> tuple[FetchProgress, list[Any], int]:
        progress = FetchProgress(clock.monotonic)
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        task = asyncio.create_task(LeaseRelay(reads, source, queue, progress).run())
        got: list[Any] = [await queue.get()]  # the announcement
        entry, slot = reads._entries[KEY], ReadSlot(make_lane(), None, None)
        for _ in range(rounds):
            clock.advance(max(0.0, entry.next_read_at - clock.monotonic()))
            began = clock.monotonic()
            rng = replace(reads._range(entry, slot, 1, 0, began), delay=0.0)
            end = await RangeReader(kinesis, rng, sleep=nap, clock=clock.monotonic,
                                    wall=clock.wall).read(lambda r: None)  # fmt: skip
            held.append(clock.monotonic() - began)
            reads._found(entry, slot, rng, RangeRead(None, {KEY: end}), began)
            for _ in range(3):
                await asyncio.sleep(0)
            while not queue.empty():
                got.append(queue.get_nowait())
        failures = entry.failures
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return progress, got, failures

    progress, got, failures = asyncio.run(scenario())
    return progress, got, held, failures


def test_executor_reads_nobody_answers_are_a_silent_shard_not_reads_at_the_tip() -> None:
    """Each range spent its time on failing calls and came back as an empty success: the lag
    stayed frozen, the stall check never fired (every post refreshed the progress), and the
    failures were never counted."""
    progress, got, _, failures = _rounds_nobody_answers(_Refusing(iterators_fail=True), 6)
    assert len(got) == 1 and got[0].announce  # nothing posted as a read
    assert progress.stalled(30.0) and progress.failures == 6 and progress.last_ok is not None
    assert failures == 6  # backed off, growing


def test_a_shard_throttled_on_get_records_gives_way_instead_of_holding_every_round() -> None:
    """A throttled GetRecords was retried until the range's time (10 s) ran out, and the lease
    was due again a second later: every read job it joined (every lease of the worker) lasted
    10 s, round after round."""
    progress, got, held, failures = _rounds_nobody_answers(_Refusing(iterators_fail=False), 4)
    assert max(held) < 1.0 and failures == 4, held  # ended at the refusal, backed off
    assert progress.throttled == 4 and len(got) == 1  # each counted in read_throttled


_THROTTLED: Any = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"},
                  "ResponseMetadata": {"HTTPStatusCode": 400}}  # fmt: skip


class _GetRecordsThrottled:
    """GetShardIterator answers; every GetRecords is throttled (the shard's other readers)."""

    def __init__(self) -> None:
        self.iterators = 0
        self.calls = 0

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        self.iterators += 1
        return {"ShardIterator": f"it-{self.iterators}"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        raise ClientError(_THROTTLED, "GetRecords")


class _IteratorsThrottled(_GetRecordsThrottled):
    """GetShardIterator is throttled too (5 calls a second per shard, shared)."""

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        self.iterators += 1
        raise ClientError(_THROTTLED, "GetShardIterator")


def test_a_throttled_get_records_keeps_its_iterator_for_the_next_round() -> None:
    """Backing the lease off dropped the iterator the range kept: every throttled round cost a
    GetShardIterator too (5 a second per shard, shared with the shard's other readers)."""
    kinesis = _GetRecordsThrottled()
    _rounds_nobody_answers(kinesis, 4)
    assert kinesis.iterators == 1, f"{kinesis.iterators} GetShardIterator calls in 4 rounds"


def test_a_throttled_get_shard_iterator_gives_way_too() -> None:
    """A throttled GetShardIterator was retried until the range's 10 s ran out, holding its
    read job (every lease in it)."""
    _, _, held, _ = _rounds_nobody_answers(_IteratorsThrottled(), 3)
    assert max(held) < 1.0, held


def test_each_read_job_counts_toward_collecting_the_py4j_cycles_its_dataframes_pin() -> None:
    """Reading on the executors, the driver made no DataFrame of Arrow bytes, so the collector
    that frees the JVM objects dead DataFrames pin (``jvm_garbage.py``) was never told of one:
    a read job's plans and RDDs stayed in the driver's JVM until Python's own full collection."""
    from kclpy_spark.spark.jvm_garbage import JvmGarbage

    collected: list[int] = []
    garbage = JvmGarbage(max_frames=3, collect=lambda: collected.append(1))
    end = RangeEnd(KEY, None, None, 0, 0, millis_behind_latest=0)
    clock = ManualClock()
    reads_, _, _ = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(), jobs=Jobs(),
        read=lambda *a, **kw: RangeRead(None, {KEY: end}), tasks=lambda session: 1,
        garbage=garbage, clock=clock,
    ))  # fmt: skip
    try:
        for _ in range(7):
            assert reads_.read_round() == 1
            clock.advance(5.0)  # past the lease's pause
    finally:
        reads_.close()
    assert reads_.rounds == 7 and len(collected) == 2  # before the 4th and the 7th job


@pytest.mark.parametrize(("checkpointed_at", "kept"), [(5, [100, 101]), (9, [101])])
def test_a_range_not_deaggregated_gives_an_aggregate_checkpointed_part_way_whole(
    checkpointed_at: int, kept: list[int]
) -> None:
    """kpl = false after a checkpoint at sub-record 5 of aggregate 100 (of 10): dropped as
    (100, 0), its sub-records 6 to 9 were never given. Checkpointed at its last, it is done."""
    from tests.unit.test_kpl import UserRecord, agg_record

    blob = agg_record([UserRecord(f"k{i}", b"v") for i in range(10)], "100").binary_data
    page = _answer([100, 101], None, ChildShards=[CHILD])
    page["Records"][0]["Data"] = blob
    after = ExtendedSequenceNumber("100", checkpointed_at)
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, after, kpl=False)
    _, got = _read_range([page], rng)
    assert got == kept


class Py4JJavaError(Exception):
    """Stands in for what py4j raises when a Spark job fails (its module says so)."""


Py4JJavaError.__module__ = "py4j.protocol"


@pytest.mark.parametrize(
    ("error", "outage"),
    [(Py4JJavaError("Job aborted: executors lost"), True),
     (RuntimeError("the read job returned ends for [], not ['k']"), False)],
)  # fmt: skip
def test_only_the_clusters_failures_of_a_read_job_are_an_uncounted_outage(
    error: Exception, outage: bool
) -> None:
    """Every failure of a read job became an outage, never counted: one of this code's own
    (ends that do not match) read again for ever instead of parking the lease."""

    def failing_read(session: Any, ranges: Any, aws: Any, **kw: Any) -> Any:
        raise error

    reads_, _, posted = started(OneSlotFeed(), ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(), jobs=Jobs(), read=failing_read,
        tasks=lambda session: 1,
    ))  # fmt: skip
    try:
        assert reads_.read_round() == 1
    finally:
        reads_.close()
    [failure] = posted
    assert isinstance(failure, ReadJobFailedError) is outage
    assert isinstance(failure, RangeReadError) is not outage


# --- a lease read to its shard's end, while its consumer's shard-end step writes its records ----


def _put_back_unread_at_the_end() -> Lane:
    """A lane whose last piece was read with the shard's end, then lost with an executor."""
    lane = make_lane()
    lane.add(range_chunk(10, 30, 3), now=0.0)
    out = lane.cut(10, 10**9)
    lane.prepared(out)
    lane.force(final=True)  # the consumer's shard-end step began its drain
    assert lane.put_back_unread(out, (out.key,), now=1.0)
    return lane


def read_to_its_end(lane: Lane, read: Any) -> tuple[ExecutorReads, _Entry]:
    """A reader (its read job ``read``, one task) of ``lane``'s lease, read to its shard's end."""
    feed, _ = feed_with(lane)
    reads_, entry, _ = started(feed, ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(), read=read, tasks=lambda s: 1,
    ))  # fmt: skip
    entry.ended = True
    return reads_, entry


@pytest.mark.parametrize("lost", [False, True])
def test_a_lease_read_to_its_end_is_read_again_only_to_re_form_a_lost_piece(lost: bool) -> None:
    """Its relay had ended with the shard's end, so a piece lost with an executor then had no
    read: the lane parked, and the lease waited out its failures and a parking. Now the lease
    is read again, pinned to the piece, and only for that (its shard's end is not read again)."""
    planned: list[ReadRange] = []

    def read(session: Any, ranges: Any, aws: Any, **kw: Any) -> RangeRead:
        planned.extend(ranges)
        end = RangeEnd(KEY, esn(10), esn(30), 3, 30, millis_behind_latest=0)
        return RangeRead(None, {KEY: end})

    if lost:
        lane = _put_back_unread_at_the_end()
    else:
        lane = make_lane()
        lane.force(final=True)
    reads_, entry = read_to_its_end(lane, read)
    lane.checkpointer.set_largest_permitted(SHARD_END)  # the consumer marked the shard's end
    assert reads_.read_round() == (1 if lost else 0)
    if not lost:
        assert planned == []
        return
    [rng] = planned
    assert rng.pinned == Pinned(esn(10), esn(30), None)
    assert lane.unfilled() is None and lane.can_cut()  # the piece is re-formed
    assert entry.ended  # a pinned read never ends a lease's end
    # not lowered to the piece's end: the SHARD_END checkpoint after it was refused so
    assert lane.checkpointer.largest_permitted == SHARD_END
    assert lane.drained(final=True) is None  # it still has to be written


def test_a_failed_read_again_at_the_end_parks_the_lane_its_consumer_no_longer_hears() -> None:
    """The relay no longer passes on a failure after the shard's end: the lane is parked, which
    the consumer's shard-end drain hears (and counts) instead."""
    lane = _put_back_unread_at_the_end()
    feed, _ = feed_with(lane)
    reads_, entry, posted = started(feed)
    entry.ended = True
    reads_._failed(entry, "GetRecords failed", 0.0, lane)
    assert posted == [] and lane.drained(final=True) is DrainResult.PARKED
    assert "reading again at the shard's end failed: GetRecords failed" in (lane.park_reason or "")
    assert entry.failures == 1  # and backed off


def test_the_relay_keeps_its_lease_registered_after_the_shard_end_until_cancelled() -> None:
    async def scenario() -> tuple[list[FetchedBatch], int, bool, int]:
        reads_ = reads()
        progress = FetchProgress(lambda: 0.0)
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        task = asyncio.create_task(LeaseRelay(reads_, SOURCE, queue, progress).run())
        got = [await queue.get()]
        post = reads_._entries[KEY].post
        post(FetchedBatch([], 0, shard_ended=True, child_shards=[dict(CHILD)]))
        got.append(await queue.get())
        post(RangeReadError("a read again at the end failed"))  # not the consumer's
        post(FetchedBatch([], 0))
        for _ in range(5):
            await asyncio.sleep(0)
        registered, running = reads_.registered, not task.done()
        task.cancel()  # the consumer's shard-end step is done
        await asyncio.gather(task, return_exceptions=True)
        return (
            got + [queue.get_nowait() for _ in range(queue.qsize())],
            registered,
            running,
            (reads_.registered),
        )

    got, registered, running, after = asyncio.run(scenario())
    assert [(b.announce, b.shard_ended) for b in got] == [(True, False), (False, True)]
    assert registered == 1 and running and after == 0


@pytest.mark.parametrize(
    ("answers", "kept"),
    [
        ([_answer([200, 300, 400], "it-1")], [200, 300]),  # 100 aged out
        ([_answer([400, 500], "it-1")], []),  # all of it aged out
        ([_answer([100, 300, 400], "it-1")], None),  # 200 missing in the middle: refused
        ([_answer([100, 200, 300, 400], "it-1")], [100, 200, 300]),  # all there
    ],
)
def test_a_pin_that_allows_it_reads_again_what_retention_left_of_its_records(
    answers: list[dict[str, Any]], kept: list[int] | None
) -> None:
    """A readStream replay of a batch whose oldest records aged out failed every attempt (not
    retriable), the query with it, and every restart replayed the same batch: for good."""
    from kclpy_spark.spark.ranges import RangeMismatchError

    pin = Pinned(esn(100), esn(300), 3, aged_out_ok=True)
    rng = ReadRange(KEY, "s", {"StreamName": "s"}, KEY, esn(99), pinned=pin)
    assert ReadRange.from_json(rng.to_json()) == rng
    if kept is None:
        with pytest.raises(RangeMismatchError):
            _read_range(list(answers), rng)
    else:
        assert _read_range(list(answers), rng)[1] == kept
    strict = replace(rng, pinned=replace(pin, aged_out_ok=False))
    if kept not in (None, [100, 200, 300]):
        with pytest.raises(RangeMismatchError):  # the daemon's pins: a mismatch still fails
            _read_range(list(answers), strict)
    from kclpy_spark.readstream.data_source import _pinned
    from kclpy_spark.readstream.offsets import Pin

    replay = _pinned(replace(rng, pinned=None), Pin(esn(100), esn(300), 3))
    assert replay.pinned is not None and replay.pinned.aged_out_ok  # readStream's replays


def _piece_lost_behind_the_shards_end(read: Any) -> tuple[Lane, ExecutorReads, _Entry]:
    """A lease read to its shard's end (its last read 40..60 buffered) whose piece before it
    (10..30, out) had its stored rows lost with an executor: put back, 40..60 dropped."""
    lane = make_lane(depth=2)
    lane.add(range_chunk(10, 30, 3), now=0.0)
    out = lane.cut(10, 10**9)
    lane.prepared(out)
    lane.add(range_chunk(40, 60, 3), now=0.0)  # the last read, with the shard's end
    lane.force(final=True)
    reads_, entry = read_to_its_end(lane, read)
    assert lane.put_back_unread(out, (out.key,), now=1.0)  # its rows lost with an executor
    return lane, reads_, entry


def test_records_a_lane_dropped_behind_a_lost_piece_at_the_shards_end_are_read_again() -> None:
    """The last read (40..60) found the shard's end while the piece before it (10..30) was out;
    that piece's stored rows were lost, and putting it back dropped 40..60 to read again after
    it. Only the piece was read again (the lease had ended): 40..60 were never read, and the
    SHARD_END checkpoint went past them."""
    reads_planned: list[ReadRange] = []
    answers = {None: RangeEnd(KEY, esn(10), esn(30), 3, 30, millis_behind_latest=0)}

    def read(session: Any, ranges: Any, aws: Any, **kw: Any) -> RangeRead:
        [rng] = ranges
        reads_planned.append(rng)
        if rng.pinned is not None:
            return RangeRead(None, {KEY: answers[None]})
        end = RangeEnd(KEY, esn(40), esn(60), 3, 30, shard_ended=True, millis_behind_latest=0)
        return RangeRead(None, {KEY: end})

    lane, reads_, entry = _piece_lost_behind_the_shards_end(read)
    assert lane.owed_to == esn(60)
    assert reads_.read_round() == 1  # the piece, pinned
    again = lane.cut(10, 10**9)
    lane.prepared(again)
    entry.next_read_at = 0.0
    assert reads_.read_round() == 1  # then what follows it, to the shard's end
    assert [r.pinned is not None for r in reads_planned] == [True, False]
    assert reads_planned[1].after == esn(30)
    assert lane.read_to == esn(60) and lane.drained(final=True) is None
    entry.next_read_at = 0.0
    lane.cut(10, 10**9)
    assert reads_.read_round() == 0  # read to its end: nothing more


@pytest.mark.parametrize("left", [0, 1])
def test_records_owed_at_the_shards_end_that_aged_out_do_not_hold_its_drain(
    left: int, caplog: pytest.LogCaptureFixture
) -> None:
    """As above, but retention took 40..60 (or 40..50) before they were read again: the read
    after the piece found the shard's end short of 60, and the lane waited for 60 for good,
    holding the shard-end step and the lease's children."""

    def read(session: Any, ranges: Any, aws: Any, **kw: Any) -> RangeRead:
        [rng] = ranges
        if rng.pinned is not None:
            return RangeRead(None, {KEY: RangeEnd(KEY, esn(10), esn(30), 3, 30)})
        first = last = esn(55) if left else None
        end = RangeEnd(KEY, first, last, left, 10 * left, shard_ended=True)
        return RangeRead(None, {KEY: end})

    lane, reads_, entry = _piece_lost_behind_the_shards_end(read)
    assert reads_.read_round() == 1  # the piece, pinned
    lane.prepared(lane.cut(10, 10**9))
    entry.next_read_at = 0.0
    with caplog.at_level(logging.WARNING):
        assert reads_.read_round() == 1  # what follows it: the shard's end, short of 60
    assert lane.owed_to is None
    assert "aged out of the stream's retention" in caplog.text
    if left:  # what retention left is written too
        lane.prepared(lane.cut(10, 10**9))
    lane.committed(lane.outs[-1])
    assert lane.drained(final=True) is DrainResult.DONE


class LockSeeingFeed(LanesFeed):
    """Notes, for each fill, whether the batcher's lock was already held by the read thread."""

    def __init__(self, *lanes: Lane) -> None:
        super().__init__(threading.Condition(), {x.lease_key: x for x in lanes}, ManualClock(),
                         lambda: False)  # fmt: skip
        self.held_at_fill: list[bool] = []

    def fill(self, lane: Lane, chunk: RangeChunk, epoch: int | None = None) -> bool:
        self.held_at_fill.append(self._cond._is_owned())  # type: ignore[attr-defined]
        return super().fill(lane, chunk, epoch)


def test_a_rounds_lanes_are_filled_under_one_hold_of_the_batchers_lock() -> None:
    """A writer that woke at the first lane filled cut a batch of it alone and the round's
    other lanes went in more batches, each a write job, a sync and commits of its own (4.2
    batches a second from 1.6 read rounds at 24 shards): the round fills them all at once."""
    other = "shardId-000000000077"
    feed = LockSeeingFeed(make_lane(KEY), make_lane(other))

    def read(session: Any, ranges: Any, aws: Any, **kw: Any) -> RangeRead:
        return RangeRead(None, {r.lease_key: RangeEnd(r.lease_key, esn(6), esn(9), 3, 30)
                                for r in ranges})  # fmt: skip

    reader = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(), read=read,
                           tasks=lambda session: 1)  # fmt: skip
    reader.start(feed, threaded=False)
    posted: list[Any] = []
    reader.register(SOURCE, posted.append)
    reader.register(replace(SOURCE, lease_key=other, shard_id=other), posted.append)
    try:
        assert reader.read_round() == 2
    finally:
        reader.close()
    assert feed.held_at_fill == [True, True]
    assert all(lane.rows == 3 for lane in feed._lanes.values())
