"""Reading on the executors: a range's time budget, the shard's lag on full pages and the
shard's read limits between rounds (a scripted Kinesis client and a manual clock; no Spark)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.base.clock import ManualClock
from checkpoint.sequence import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN
from kclpy_spark.retrieval.range_reader import RangeReader, RangeReadTimeoutError
from kclpy_spark.spark.cluster_read import RangeRead
from kclpy_spark.spark.executor_reads import (
    ExecutorReads,
    LeaseSource,
    NoAnswer,
    ReadSettings,
    ReadSlot,
)
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import Pinned, RangeEnd, ReadRange
from kclpy_spark.spark.read_timing import is_behind, round_leases
from tests.unit.spark.test_read_rounds import make_lane

KEY = "shardId-000000000000"
STREAM = {"StreamName": "s"}


def esn(n: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(n))


class Client:
    """GetShardIterator throttled for ever (``throttle``), else one scripted GetRecords page."""

    def __init__(self, page: dict[str, Any] | None = None, *, throttle: bool = False) -> None:
        self.page = page
        self.throttle = throttle
        self.iterator_calls = 0

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        self.iterator_calls += 1
        assert self.iterator_calls < 500, "asked for ever"
        if self.throttle:
            error = {"Code": "ProvisionedThroughputExceededException", "Message": "slow down"}
            raise ClientError({"Error": error}, "GetShardIterator")
        return {"ShardIterator": "it-0"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        assert self.page is not None
        return self.page


def read(client: Client, rng: ReadRange, clock: ManualClock) -> RangeEnd:
    async def nap(seconds: float) -> None:
        clock.advance(seconds)

    async def go() -> RangeEnd:
        reader = RangeReader(client, rng, sleep=nap, clock=clock.monotonic, wall=clock.wall)
        return await reader.read(lambda records: None)

    return asyncio.run(go())


def test_a_full_page_reports_the_shards_lag_and_still_counts_as_behind() -> None:
    """A full page's lag was dropped (None), so during a backlog (every page full) the lag
    metric and `status` kept their last value, often 0."""
    records = [{"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(s),
                "ApproximateArrivalTimestamp": None} for s in (20, 30)]  # fmt: skip
    page = {"Records": records, "NextShardIterator": "it-1", "MillisBehindLatest": 3_600_000}
    rng = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_records=2, max_pages=1)
    end = read(Client(page), rng, ManualClock())
    assert (end.rows, end.millis_behind_latest, end.left_behind) == (2, 3_600_000, True)
    assert RangeEnd.from_json(end.to_json()) == end
    at_tip = {**page, "MillisBehindLatest": 0}  # a full page at lag 0: maybe more all the same
    wide = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_records=100, max_pages=1)
    assert is_behind(wide, read(Client(at_tip), rng, ManualClock()), 1.0)


@pytest.mark.parametrize("pinned", [False, True])
def test_a_throttled_get_shard_iterator_ends_the_read_within_its_budget(pinned: bool) -> None:
    """It was asked again and again, its time uncounted: one throttled shard held its read job,
    and every lease read in it, far past the range's budget."""
    clock = ManualClock()
    pin = Pinned(esn(20), esn(30), 2, False) if pinned else None
    rng = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_seconds=1.0, max_pages=1, pinned=pin)
    client = Client(throttle=True)
    started = clock.monotonic()
    if pinned:
        with pytest.raises(RangeReadTimeoutError, match="no iterator"):
            read(client, rng, clock)
    else:
        end = read(client, rng, clock)
        assert (end.rows, end.next_iterator, end.throttled) == (0, None, client.iterator_calls)
    assert clock.monotonic() - started <= rng.max_seconds + 0.001
    assert client.iterator_calls >= 1


def reads(clock: ManualClock, **settings: Any) -> ExecutorReads:
    return ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings(**settings),
                         clock=clock)  # fmt: skip


def test_a_big_page_at_the_tip_waits_out_the_read_rate_before_the_next_call() -> None:
    """At the tip the next read came ``idle_seconds`` later whatever the page's size: 8 MiB
    read at lag 0 was followed by a call 1 s later, against Kinesis's 2 MiB a second."""
    clock = ManualClock()
    clock.advance(100.0)
    rng = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_records=100_000,
                    max_bytes=64 * 1024 * 1024)  # fmt: skip
    end = RangeEnd(KEY, esn(11), esn(500), 490, 8 * 1024 * 1024, millis_behind_latest=0)
    began = clock.monotonic()
    assert reads(clock, idle_seconds=1.0)._next_read(rng, end, began) >= began + 4.0
    small = RangeEnd(KEY, esn(11), esn(12), 2, 400, millis_behind_latest=0)
    assert reads(clock, idle_seconds=1.0)._next_read(rng, small, began) == began + 1.0


def test_a_failed_lease_keeps_its_pause_when_its_consumer_starts_it_again() -> None:
    """The relay ends with the failure and its consumer registers the lease again at once: the
    new entry was due at once with no failures counted, so the backoff never grew."""
    clock = ManualClock()
    executor_reads = reads(clock)
    source = LeaseSource(KEY, "s", STREAM, KEY, esn(10))
    first = executor_reads.register(source, lambda item: None)
    now = clock.monotonic()
    executor_reads._failed(first, "a read failed", now, make_lane())
    executor_reads.unregister(first)
    again = executor_reads.register(source, lambda item: None)
    assert (again.next_read_at, again.failures) == (first.next_read_at, 1)
    assert round_leases(executor_reads._entries, clock.monotonic(), 0.0) == {}
    clock.advance(first.next_read_at - now)  # once the pause is over, nothing is kept
    executor_reads.unregister(again)
    fresh = executor_reads.register(source, lambda item: None)
    assert (fresh.next_read_at, fresh.failures) == (0.0, 0)


def test_a_lease_at_latest_first_read_rounds_after_it_came_reads_from_when_it_came() -> None:
    """Its consumer pinned the lease when it registered; its first range, planned in a round
    that came 20 s later (read jobs queued behind a slow one), asked LATEST then and skipped
    what arrived in between, though the pin said the read covered it."""
    clock = ManualClock()
    executor_reads = reads(clock)
    came = clock.wall()
    entry = executor_reads.register(LeaseSource(KEY, "s", STREAM, KEY, LATEST), lambda _: None)
    clock.advance(20.0)
    slot = ReadSlot(make_lane(), None, None)
    first = executor_reads._range(entry, slot, leases=1, behind=0, now=clock.monotonic())
    assert (first.after, first.timestamp) == (AT_TIMESTAMP, came - LATEST_RESTART_MARGIN)


def test_a_lease_at_latest_reads_from_where_its_first_range_began_until_a_record_comes() -> None:
    """Its iterator, carried from round to round, expired before the first record (a lease not
    read for five minutes): the replacement was LATEST again and skipped what came in between."""
    clock = ManualClock()
    executor_reads = reads(clock)
    entry = executor_reads.register(LeaseSource(KEY, "s", STREAM, KEY, LATEST), lambda _: None)
    slot = ReadSlot(make_lane(), None, None)
    first = executor_reads._range(entry, slot, leases=1, behind=0, now=clock.monotonic())
    assert (first.after, first.iterator) == (LATEST, None)
    since = clock.wall() - LATEST_RESTART_MARGIN
    nothing = RangeEnd(KEY, None, None, 0, 0, millis_behind_latest=0, next_iterator="it-1", calls=1)
    executor_reads._found(entry, slot, first, RangeRead(None, {KEY: nothing}), clock.monotonic())
    clock.advance(400.0)
    second = executor_reads._range(entry, slot, leases=1, behind=0, now=clock.monotonic())
    assert (second.after, second.timestamp, second.iterator) == (AT_TIMESTAMP, since, "it-1")

    class Expired(Client):
        async def get_records(self, **_: Any) -> dict[str, Any]:
            if not self.asked:  # the carried iterator, five minutes old
                error = {"Code": "ExpiredIteratorException", "Message": "expired"}
                raise ClientError({"Error": error}, "GetRecords")
            return {"Records": [], "NextShardIterator": "it-2", "MillisBehindLatest": 0}

    client = Expired()
    client.asked: list[dict[str, Any]] = []  # type: ignore[misc]
    original = client.get_shard_iterator

    async def asking(**kwargs: Any) -> dict[str, Any]:
        client.asked.append(kwargs)
        return await original(**kwargs)

    client.get_shard_iterator = asking  # type: ignore[method-assign]
    read(client, second, clock)
    assert [a["ShardIteratorType"] for a in client.asked] == ["AT_TIMESTAMP"]
    assert client.asked[0]["Timestamp"].timestamp() == pytest.approx(since)


def one_lease(clock: ManualClock) -> tuple[ExecutorReads, list[Any], Any, ReadSlot, ReadRange]:
    """Reads of one lease from sequence 10, what they post, its entry, slot and first range."""
    executor_reads = reads(clock)
    posted: list[Any] = []
    entry = executor_reads.register(LeaseSource(KEY, "s", STREAM, KEY, esn(10)), posted.append)
    slot = ReadSlot(make_lane(), None, None)
    rng = executor_reads._range(entry, slot, leases=1, behind=0, now=clock.monotonic())
    return executor_reads, posted, entry, slot, rng


def test_a_full_page_at_lag_0_is_not_taken_for_the_tip() -> None:
    """A full page's lag now shows (a backlog's lag), but lag 0 on a full page is no tip: the
    consumer's --until-caught-up took it for one and stopped with records unread."""
    clock = ManualClock()
    executor_reads, posted, entry, slot, rng = one_lease(clock)
    for lag, told in ((0, None), (5_000, 5_000)):
        full = RangeEnd(KEY, None, None, 0, 0, millis_behind_latest=lag, left_behind=True, calls=1)
        executor_reads._found(entry, slot, rng, RangeRead(None, {KEY: full}), clock.monotonic())
        assert posted[-1].millis_behind_latest == told and entry.lag == told


def test_a_range_that_got_no_iterator_for_throttling_backs_off_without_a_failure() -> None:
    """It counted as a read at the tip: due a second later with its failures reset, it joined
    every round and spent its whole budget in each (every lease of the job waited)."""
    clock = ManualClock()
    executor_reads, posted, entry, slot, rng = one_lease(clock)
    # No GetRecords call: no iterator came.
    none = RangeEnd(KEY, None, None, 0, 0, throttled=7, unanswered=True)
    waits = []
    for _ in range(3):
        now = clock.monotonic()
        executor_reads._found(entry, slot, rng, RangeRead(None, {KEY: none}), now)
        waits.append(entry.next_read_at - now)
    # Its consumer counts the throttled calls, nothing that parks a lease, and no read at the tip.
    assert posted == [NoAnswer(7)] * 3
    assert entry.failures == 3 and waits[0] >= ReadSettings().min_interval


class ExpiresThenThrottled(Client):
    """GetRecords: ``pages`` answers (a record each), then the iterator has expired; each
    GetShardIterator throttled."""

    def __init__(self, pages: int) -> None:
        super().__init__(throttle=True)
        self.answers, self.calls = pages, 0

    async def get_records(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.answers:
            record = {"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(10 + self.calls),
                      "ApproximateArrivalTimestamp": None}  # fmt: skip
            return {"Records": [record], "NextShardIterator": "it-2", "MillisBehindLatest": 9}
        error = {"Code": "ExpiredIteratorException", "Message": "expired"}
        raise ClientError({"Error": error}, "GetRecords")


def test_an_expired_iterator_whose_replacement_is_throttled_gives_way() -> None:
    """The iterator carried from the last round had expired and the shard throttled the new
    GetShardIterator: the read went on with the expired iterator, two calls to a throttled
    shard each pause until its budget was spent (its read job waited that long), and handed it
    to the next round, which did the same. It ends at once and hands on no iterator."""
    clock = ManualClock()
    executor_reads, _, entry, slot, _ = one_lease(clock)
    entry.iterator, entry.iterator_at = "it-1", esn(10)  # carried from the last round
    rng = executor_reads._range(entry, slot, leases=1, behind=0, now=clock.monotonic())
    assert rng.iterator == "it-1"
    client = ExpiresThenThrottled(pages=0)
    end = read(client, rng, clock)
    assert (client.calls, client.iterator_calls) == (1, 1)
    assert (end.rows, end.next_iterator, end.throttled, end.unanswered) == (0, None, 1, True)


def test_a_range_whose_iterator_expires_after_records_ends_with_them() -> None:
    clock = ManualClock()
    rng = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_seconds=10.0, max_pages=0,
                    iterator="it-1")  # fmt: skip
    client = ExpiresThenThrottled(pages=2)
    started = clock.monotonic()
    end = read(client, rng, clock)
    assert clock.monotonic() - started < 1.0
    assert (end.rows, end.last, end.next_iterator, end.throttled) == (2, esn(12), None, 1)


def test_a_range_reports_the_kinesis_records_and_bytes_its_pages_held_beside_its_rows() -> None:
    """GetRecords' ``Limit`` counts Kinesis records: a KPL aggregate is one, its sub-records
    rows. The next range of the lease is sized by bytes a Kinesis record."""
    from kclpy_spark.retrieval.kpl_aggregate import UserRecord, aggregate

    blob = aggregate([UserRecord("k", bytes(200)) for _ in range(5)])
    records = [{"Data": blob, "PartitionKey": "k", "SequenceNumber": str(s),
                "ApproximateArrivalTimestamp": None} for s in (20, 30)]  # fmt: skip
    page = {"Records": records, "NextShardIterator": "it-1", "MillisBehindLatest": 0}
    rng = ReadRange(KEY, "s", STREAM, KEY, esn(10), max_records=100, max_pages=1)
    end = read(Client(page), rng, ManualClock())
    assert (end.rows, end.read_records) == (10, 2)
    assert end.read_bytes == 2 * (len(blob) + 1)  # each page record's data and partition key
    assert RangeEnd.from_json(end.to_json()) == end
