"""Polling within a shard's read limits: the pause rule, the byte count of a page, and a fetcher
reading a shard that enforces Kinesis's limits on a virtual clock (tier 1: no network, no
sleeping)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.sequence import TRIM_HORIZON, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.fastdecode import page_bytes
from kclpy_spark.retrieval.page_decode import decode_page
from kclpy_spark.retrieval.polling import (
    MIN_INTERVAL_WHILE_BEHIND,
    READ_BYTES_PER_SECOND,
    FetchedBatch,
    PollingFetcher,
    pause_before_next_call,
)
from kclpy_spark.retrieval.source import FetchProgress

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("interval", "since_call", "page", "since_response", "rate", "pause"),
    [
        (0.2, 0.05, 0, 0.0, MIB * 2, 0.15),  # an empty page: only the call interval
        (0.2, 0.05, 100_000, 0.0, MIB * 2, 0.15),  # a small page: 0.048 s < the interval
        (0.2, 0.05, 2 * MIB, 0.0, MIB * 2, 1.0),  # a 2 MiB page: one second from the response
        (0.2, 0.3, 2 * MIB, 0.25, MIB * 2, 0.75),  # time spent since counts for both
        (0.2, 0.05, 10 * MIB, 0.0, MIB * 2, 5.0),  # the documented case: 10 MiB, 5 s
        (0.2, 0.05, 10 * MIB, 0.0, MIB * 1, 10.0),  # half the rate (two applications)
        (0.2, 0.05, 10 * MIB, 0.0, MIB / 4, 10.0),  # at most MAX_READ_PAUSE (40 s otherwise)
        (0.2, 0.05, 10 * MIB, 0.0, 0, 0.15),  # pacing off
        (1.0, 2.0, 2 * MIB, 1.5, MIB * 2, 0.0),  # both already over: at once
    ],
)
def test_pause_before_next_call(
    interval: float, since_call: float, page: int, since_response: float, rate: float,
    pause: float,
) -> None:  # fmt: skip
    assert pause_before_next_call(interval, since_call, page, since_response, rate) == (
        pytest.approx(pause)
    )


def _entry(i: int, size: int) -> dict[str, Any]:
    return {
        "Data": base64.b64encode(bytes([i % 251]) * size).decode(),
        "PartitionKey": f"pk-{i:04d}",
        "SequenceNumber": f"{1000 + i}",
        "ApproximateArrivalTimestamp": 1_700_000_000.5,
    }


@pytest.mark.parametrize("size", [0, 1, 2, 3, 200, 1000])
def test_page_bytes_counts_decoded_data_and_partition_keys(size: int) -> None:
    entries = [_entry(i, size) for i in range(7)]
    expected = 7 * (size + len("pk-0000"))
    parsed = [Record(bytes([i % 251]) * size, f"pk-{i:04d}", str(i)) for i in range(7)]
    assert page_bytes(parsed) == expected
    # msgspec decodes the data as it parses: the count is exact.
    page = decode_page(json.dumps({"Records": entries, "NextShardIterator": "it"}).encode())
    assert page is not None and page_bytes(page[0]) == expected


def test_page_bytes_counts_partition_keys_in_utf8() -> None:
    entries = [{**_entry(0, 9), "PartitionKey": "schlüssel-€"}]  # 11 characters, 14 bytes
    page = decode_page(json.dumps({"Records": entries}).encode())
    assert page is not None and page_bytes(page[0]) == 9 + 14
    assert page_bytes([Record(b"x" * 9, "schlüssel-€", "1")]) == 9 + 14


class LimitedShard:
    """One shard with Kinesis's read limits on a virtual clock: 5 calls a second (a bucket of 5)
    and, after a page of B bytes, reads refused for B / 2 MiB seconds, counted from the end of
    the page's ``transfer`` (the latest moment a service could start counting). Pages of
    ``per_page`` records of ``size`` bytes; the shard ends after ``pages`` pages."""

    def __init__(
        self, clock: list[float], pages: int, per_page: int, size: int, transfer: float = 0.05
    ) -> None:
        self.clock = clock
        self.transfer = transfer
        self.pages_left = pages
        self.page = [
            {**e, "Data": base64.b64decode(e["Data"]), "ApproximateArrivalTimestamp": None}
            for e in (_entry(i, size) for i in range(per_page))
        ]
        self.page_bytes = sum(len(e["Data"]) + len(e["PartitionKey"]) for e in self.page)
        self.blocked_until = 0.0
        self.tokens, self.tokens_at = 5.0, 0.0
        self.served = self.throttled = 0

    async def get_shard_iterator(self, **_: object) -> dict[str, object]:
        return {"ShardIterator": "it"}

    async def get_records(self, **_: object) -> dict[str, object]:
        now = self.clock[0]
        self.tokens = min(5.0, self.tokens + 5 * (now - self.tokens_at))
        self.tokens_at = now
        if now < self.blocked_until or self.tokens < 1:
            self.throttled += 1
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"}}
            raise ClientError(error, "GetRecords")  # type: ignore[arg-type]
        self.tokens -= 1
        self.served += 1
        self.pages_left -= 1
        self.clock[0] += self.transfer  # the response arrives this much later
        self.blocked_until = self.clock[0] + self.page_bytes / READ_BYTES_PER_SECOND
        ended = self.pages_left == 0
        return {
            "Records": self.page,
            "NextShardIterator": None if ended else "it",
            "MillisBehindLatest": 0 if ended else 60_000,
            # Kinesis names a closed shard's children in its last page.
            "ChildShards": [{"ShardId": "shardId-000000000001"}] if ended else None,
        }


def _read(
    shard: LimitedShard, clock: list[float], read_rate: float,
    progress: FetchProgress | None = None,
) -> None:  # fmt: skip
    async def virtual_sleep(seconds: float) -> None:
        clock[0] += seconds

    fetcher = PollingFetcher(
        shard, {"StreamName": "s"}, "shardId-000000000000", TRIM_HORIZON,
        InitialPosition.trim_horizon(), asyncio.Queue[FetchedBatch](), read_rate=read_rate,
        sleep=virtual_sleep, clock=lambda: clock[0], rng=random.Random(7), progress=progress,
    )  # fmt: skip
    asyncio.run(fetcher.run())


@pytest.mark.parametrize(
    ("per_page", "size"),
    [(10_000, 200), (2_000, 1_000), (10, 1_000_000), (10_000, 20)],
)
def test_a_paced_fetcher_reads_at_the_shard_limit_without_being_refused(
    per_page: int, size: int
) -> None:
    clock = [0.0]
    shard = LimitedShard(clock, pages=20, per_page=per_page, size=size)
    _read(shard, clock, READ_BYTES_PER_SECOND)
    assert shard.served == 20
    assert shard.throttled == 0
    # ... and not slower than the limits allow: the byte budget (or 5 calls a second) and the
    # transfer of the 19 pages before the last.
    budget = shard.page_bytes / READ_BYTES_PER_SECOND
    ideal = 19 * max(budget + shard.transfer, 0.2) + shard.transfer
    assert clock[0] == pytest.approx(ideal)


def test_an_unpaced_fetcher_of_large_pages_is_refused_and_reads_slower() -> None:
    """What the pacing replaces (``max_read_bytes_per_second = 0``): calls every 0.2 s while
    behind, most of them refused, then backing off with jitter."""
    clock = [0.0]
    shard = LimitedShard(clock, pages=20, per_page=10_000, size=200)
    _read(shard, clock, 0)
    assert shard.served == 20
    assert shard.throttled >= 20
    paced = 19 * shard.page_bytes / READ_BYTES_PER_SECOND
    assert clock[0] > paced


@pytest.mark.parametrize(("rate", "refused"), [(0, True), (READ_BYTES_PER_SECOND, False)])
def test_refused_calls_are_counted_for_the_metric(rate: float, refused: bool) -> None:
    """Every call the shard refused reaches FetchProgress (and so
    ``kclpy_spark_read_throttled_total``); a paced read counts none."""
    clock = [0.0]
    shard = LimitedShard(clock, pages=5, per_page=10_000, size=200)
    told: list[int] = []
    progress = FetchProgress(lambda: clock[0], on_throttled=lambda: told.append(1))
    _read(shard, clock, rate, progress)
    assert progress.throttled == len(told) == shard.throttled
    assert (shard.throttled > 0) is refused


class SteadyShard:
    """Short pages under steady traffic: a small lag each time, then a backlog's lag."""

    def __init__(self, lags: list[int]) -> None:
        self.lags = lags

    async def get_shard_iterator(self, **_: object) -> dict[str, object]:
        return {"ShardIterator": "it"}

    async def get_records(self, **_: object) -> dict[str, object]:
        if not self.lags:
            raise asyncio.CancelledError()
        lag = self.lags.pop(0)
        return {"Records": [], "NextShardIterator": "it", "MillisBehindLatest": lag}


def _pauses(shard: Any, idle: float, seed: int = 7) -> list[float]:
    """The pauses a fetcher with ``idle_time`` makes between its calls on ``shard`` (until the
    shard raises CancelledError); ``seed``: its backoff's."""
    pauses: list[float] = []

    async def record_pause(seconds: float) -> None:
        pauses.append(seconds)

    fetcher = PollingFetcher(
        shard, {"StreamName": "s"}, "shardId-000000000000", TRIM_HORIZON,
        InitialPosition.trim_horizon(), asyncio.Queue[FetchedBatch](), idle_time=idle,
        sleep=record_pause, clock=lambda: 0.0, rng=random.Random(seed),
    )  # fmt: skip
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(fetcher.run())
    return pauses


def test_a_few_milliseconds_of_lag_waits_the_idle_time_and_a_backlog_does_not() -> None:
    """Any lag above 0 read 5 times a second: under steady traffic (a few milliseconds behind)
    that took the shard's whole GetRecords allowance from every other application on it."""
    pauses = _pauses(SteadyShard([4, 0, 60_000, 900]), idle=1.0)
    assert pauses == [1.0, 1.0, MIN_INTERVAL_WHILE_BEHIND, 1.0]


def test_an_idle_time_under_a_fifth_of_a_second_still_reads_at_most_5_times_a_second() -> None:
    """``idle_time_between_reads = 0.05`` read 20 times a second at the tip: the shard refused
    this reader and every other polling application on it."""
    assert _pauses(SteadyShard([0, 3, 0]), idle=0.05) == [MIN_INTERVAL_WHILE_BEHIND] * 3


class ExpiringShard(SteadyShard):
    """Every iterator it hands out has expired by the time it is used, ``times`` times."""

    def __init__(self, times: int) -> None:
        super().__init__([0])
        self.times = times
        self.iterators = 0

    async def get_shard_iterator(self, **_: object) -> dict[str, object]:
        self.iterators += 1
        return {"ShardIterator": "it"}

    async def get_records(self, **kw: object) -> dict[str, object]:
        if self.times:
            self.times -= 1
            error = {"Error": {"Code": "ExpiredIteratorException", "Message": "expired"}}
            raise ClientError(error, "GetRecords")  # type: ignore[arg-type]
        return await super().get_records(**kw)


def test_an_iterator_that_keeps_expiring_is_asked_for_again_no_more_than_5_times_a_second() -> None:
    """Asked for again back to back, it took the shard's 5 GetShardIterator a second (shared
    with every other reader) until that call was refused too."""
    shard = ExpiringShard(times=4)
    pauses = _pauses(shard, idle=1.0)
    assert shard.iterators == 5
    assert pauses[:4] == [MIN_INTERVAL_WHILE_BEHIND] * 4


class RefusingShard(SteadyShard):
    """Its first ``times`` GetRecords calls are refused for the shard's limits."""

    def __init__(self, times: int) -> None:
        super().__init__([0])
        self.times = times

    async def get_records(self, **kw: object) -> dict[str, object]:
        if self.times:
            self.times -= 1
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"}}
            raise ClientError(error, "GetRecords")  # type: ignore[arg-type]
        return await super().get_records(**kw)


@pytest.mark.parametrize("seed", range(5))
def test_a_refused_call_is_tried_again_no_sooner_than_5_calls_a_second_allow(seed: int) -> None:
    """The backoff's first delays are random in [0, 0.5 s): a retry after a refused call came as
    soon as 0.1 s later, itself over the shard's 5 calls a second."""
    pauses = _pauses(RefusingShard(times=3), idle=1.0, seed=seed)
    assert len(pauses) >= 3 and min(pauses[:3]) >= MIN_INTERVAL_WHILE_BEHIND, pauses


def test_empty_answers_behind_the_tip_go_to_the_consumer_with_their_lag() -> None:
    """Only an empty answer at the tip went out: catching up over a quiet stretch, the lag
    shown stayed where the last records left it, and a processor that asked to be called after
    every empty read (the KCL's callProcessRecordsEvenForEmptyRecordList) was not."""
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()

    async def no_pause(seconds: float) -> None:
        return None

    fetcher = PollingFetcher(
        SteadyShard([3_000, 900, 0]), {"StreamName": "s"}, "shardId-000000000000",
        TRIM_HORIZON, InitialPosition.trim_horizon(), queue, idle_time=1.0, sleep=no_pause,
        clock=lambda: 0.0, rng=random.Random(7),
    )  # fmt: skip
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(fetcher.run())
    got = [queue.get_nowait() for _ in range(queue.qsize())]
    assert [(b.records, b.millis_behind_latest) for b in got] == [([], 3_000), ([], 900), ([], 0)]
