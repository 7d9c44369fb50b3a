"""Reading on the executors: a range's time budget, the shard's lag on full pages and the
shard's read limits between rounds (a scripted Kinesis client and a manual clock; no Spark)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.base.clock import ManualClock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.retrieval.range_reader import RangeReader, RangeReadTimeoutError
from kclpy_spark.spark.executor_reads import ExecutorReads, LeaseSource, ReadSettings
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import Pinned, RangeEnd, ReadRange
from kclpy_spark.spark.read_timing import is_behind, round_leases

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
    assert is_behind(wide, read(Client(at_tip), rng, ManualClock()))


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
    executor_reads._failed(first, "a read failed", now)
    executor_reads.unregister(first)
    again = executor_reads.register(source, lambda item: None)
    assert (again.next_read_at, again.failures) == (first.next_read_at, 1)
    assert round_leases(executor_reads._entries, clock.monotonic(), 0.0) == {}
    clock.advance(first.next_read_at - now)  # once the pause is over, nothing is kept
    executor_reads.unregister(again)
    fresh = executor_reads.register(source, lambda item: None)
    assert (fresh.next_read_at, fresh.failures) == (0.0, 0)
