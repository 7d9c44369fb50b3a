"""A read that starts at LATEST and must take another iterator (or subscription) before its
first record: from where its first one began, never LATEST again (no network)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from checkpoint.sequence import LATEST, TRIM_HORIZON, InitialPosition
from kclpy_spark.retrieval.fanout import FanOutFetcher
from kclpy_spark.retrieval.polling import PollingFetcher
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN, StartArgs
from kclpy_spark.retrieval.source import FetchedBatch

WALL = 1_700_000_000.0
SINCE = datetime.fromtimestamp(WALL - LATEST_RESTART_MARGIN, tz=UTC)


def test_start_args_ask_latest_once_then_from_where_it_began() -> None:
    walls = iter([WALL - 1.0, WALL, WALL + 400.0, WALL + 800.0])  # made, then asked three times
    start = StartArgs(LATEST, InitialPosition.latest(), lambda: next(walls))
    assert start() == {"ShardIteratorType": "LATEST"}
    assert start() == start() == {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": SINCE}
    trim = StartArgs(TRIM_HORIZON, InitialPosition.latest(), lambda: WALL)
    assert trim() == trim() == {"ShardIteratorType": "TRIM_HORIZON"}


def test_a_first_latest_ask_long_after_the_read_began_starts_where_it_began() -> None:
    """An enhanced fan-out consumer registered for tens of seconds before its first subscription
    at LATEST: the lease was pinned where the read began, and what arrived meanwhile was read only
    if the read happened to start again before its first checkpoint."""
    walls = iter([WALL, WALL + 30.0, WALL + 60.0])
    start = StartArgs(LATEST, InitialPosition.latest(), lambda: next(walls))
    assert start() == start() == {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": SINCE}


class ExpiresUnused:
    """The first iterator sat unused past its five minutes (a full queue, a slow processor)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.calls = 0

    async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        self.asked.append({k: v for k, v in kw.items() if k not in {"StreamName", "ShardId"}})
        return {"ShardIterator": f"it{len(self.asked)}"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 2:
            error = {"Code": "ExpiredIteratorException", "Message": "expired"}
            raise ClientError({"Error": error}, "GetRecords")
        if self.calls >= 3:
            raise asyncio.CancelledError()
        return {"Records": [], "NextShardIterator": "next", "MillisBehindLatest": 0}


def test_polling_replaces_an_expired_latest_iterator_from_where_it_began() -> None:
    """A second LATEST iterator skipped every record written while the first sat unused."""
    shard = ExpiresUnused()

    async def nap(_: float) -> None:
        pass

    fetcher = PollingFetcher(
        shard, {"StreamName": "s"}, "shardId-0", LATEST, InitialPosition.latest(),
        asyncio.Queue[FetchedBatch](), sleep=nap, clock=lambda: 0.0, rng=random.Random(1),
        wall=lambda: WALL,
    )  # fmt: skip
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(fetcher.run())
    assert shard.asked == [
        {"ShardIteratorType": "LATEST"},
        {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": SINCE},
    ]


class RefusedAWhile(ExpiresUnused):
    """GetShardIterator refused three times (throttled: other consumers of the shard), each
    backoff ten seconds on the wall clock."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        if len(self.asked) < 3:
            self.asked.append({k: v for k, v in kw.items() if k not in {"StreamName", "ShardId"}})
            self.clock[0] += 10.0
            error = {"Code": "LimitExceededException", "Message": "rate exceeded"}
            raise ClientError({"Error": error}, "GetShardIterator")
        return await super().get_shard_iterator(**kw)

    async def get_records(self, **_: Any) -> dict[str, Any]:
        raise asyncio.CancelledError()


def test_a_latest_ask_refused_and_retried_starts_where_the_first_ask_was_made() -> None:
    """Each retry asked LATEST again: the iterator was the tip of the try that worked, 30 s
    after the read began and was pinned, and what arrived between was never read."""
    wall = [WALL]
    shard = RefusedAWhile(wall)

    async def nap(_: float) -> None:
        pass

    fetcher = PollingFetcher(
        shard, {"StreamName": "s"}, "shardId-0", LATEST, InitialPosition.latest(),
        asyncio.Queue[FetchedBatch](), sleep=nap, clock=lambda: 0.0, rng=random.Random(1),
        wall=lambda: wall[0],
    )  # fmt: skip
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(fetcher.run())
    since = {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": SINCE}
    assert shard.asked == [{"ShardIteratorType": "LATEST"}, since, since, since]


def test_fan_out_resubscribes_before_the_first_event_from_where_it_began() -> None:
    fetcher = FanOutFetcher(
        object(), {"StreamName": "s"}, "shardId-0", LATEST, InitialPosition.latest(),
        asyncio.Queue[FetchedBatch](), consumer_name="app", wall=lambda: WALL,
    )  # fmt: skip
    assert fetcher._position() == {"Type": "LATEST"}
    assert fetcher._position() == {"Type": "AT_TIMESTAMP", "Timestamp": SINCE}
