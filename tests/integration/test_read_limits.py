"""The polling fetcher against a real HTTP endpoint that enforces Kinesis's read limits per shard
(``bench/standin_server.py``: 5 GetRecords a second, and after a page of B bytes no read for
B / 2 MiB seconds, refused with ProvisionedThroughputExceededException): with the default pacing
no call is refused; without it (``max_read_bytes_per_second = 0``) calls are. Real aiobotocore
client, real fast GetRecords decode, real sockets. No LocalStack: neither it nor kinesalite
enforces the limits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint.sequence import TRIM_HORIZON, InitialPosition
from kclpy_spark.retrieval.polling import READ_BYTES_PER_SECOND, FetchedBatch, PollingFetcher

STANDIN = Path(__file__).resolve().parents[2] / "bench" / "standin_server.py"
PAGES = 4
PER_PAGE = 10_000  # 200-byte records: ~2 MiB a page, so a page buys a second of the limit


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = subprocess.Popen(
        [sys.executable, str(STANDIN), "--synthetic", str(PER_PAGE), "--size", "200",
         "--shards", "1", "--pages", str(PAGES)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip()
    finally:
        server.terminate()
        server.wait(timeout=10)


def _stats(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{endpoint}/_standin/stats", timeout=5) as answer:
        stats: dict[str, int] = json.loads(answer.read())
    return stats


async def _read_all(endpoint: str, read_rate: float) -> tuple[int, bool]:
    """Every record of the stand-in's one shard (its tip answers empty pages with lag 0); the
    count and whether the fast decode was on."""
    from aiobotocore.session import get_session

    session = get_session()
    async with session.create_client(
        "kinesis", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    ) as client:  # fmt: skip
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
        fetcher = PollingFetcher(
            client, {"StreamName": "standin"}, "shardId-000000000000", TRIM_HORIZON,
            InitialPosition.trim_horizon(), queue, read_rate=read_rate, idle_time=0.2,
        )  # fmt: skip
        task = asyncio.create_task(fetcher.run())
        records = 0
        try:
            while records < PAGES * PER_PAGE:
                get = asyncio.ensure_future(queue.get())
                await asyncio.wait({get, task}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    raise AssertionError(f"no batch in 60 s; the fetcher: {task}")
                records += len(get.result().records)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return records, fetcher.fast_decode.active


def test_paced_reads_are_never_refused(endpoint: str) -> None:
    records, fast = asyncio.run(_read_all(endpoint, READ_BYTES_PER_SECOND))
    assert records == PAGES * PER_PAGE
    assert fast  # the page's bytes came from the fast decode's count
    stats = _stats(endpoint)
    assert stats["calls"] == PAGES
    assert stats["throttled"] == 0


def test_unpaced_reads_of_large_pages_are_refused(endpoint: str) -> None:
    """What the pacing replaces: a call every 0.2 s while behind, refused for about a second
    after each 2 MiB page (so this test can tell the two apart)."""
    records, _ = asyncio.run(_read_all(endpoint, 0))
    assert records == PAGES * PER_PAGE
    # Each of the 3 calls 0.2 s after a page falls in its ~1 s block; one is enough to tell.
    assert _stats(endpoint)["throttled"] >= 1
