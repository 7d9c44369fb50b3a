"""Polling retrieval on aiobotocore: GetShardIterator + GetRecords into a bounded prefetch queue.

One ``PollingFetcher`` per shard runs as an asyncio task. The queue it fills is bounded, so a slow
processor stops the fetcher (``await queue.put`` blocks) instead of letting memory grow.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from checkpoint.base.errors import (
    error_code,
    map_aws_error,
)
from checkpoint.base.retry import Backoff
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.backoff import wait_or_raise
from kclpy_spark.retrieval.fastdecode import (
    install_fast_getrecords,
    record_from_parsed,
    records_from_response,
)
from kclpy_spark.retrieval.kpl import Deaggregator, skip_through
from kclpy_spark.retrieval.positions import iterator_args

log = logging.getLogger(__name__)

# Kinesis allows 5 GetRecords calls per second per shard, shared by every polling consumer: while
# behind (a full response or MillisBehindLatest > 0) we read again after this short pause instead
# of the configured idle time, which stays the pause after an empty or caught-up response.
MIN_INTERVAL_WHILE_BEHIND = 0.2


@dataclass(frozen=True)
class FetchedBatch:
    """What one GetRecords call gave: the records, the lag, and whether the shard ended."""

    records: list[Record]
    millis_behind_latest: int | None
    shard_ended: bool = False
    child_shards: list[dict[str, Any]] = field(default_factory=list)


# A Record from botocore's parsed GetRecords entry (used when the fast decode is off).
record_from_api = record_from_parsed


class PollingFetcher:
    """Reads one shard from ``checkpoint`` onward and puts FetchedBatch items on ``queue``.

    Ends after putting the batch with ``shard_ended=True``. Expired iterators are replaced from the
    last record delivered; throttling backs off with full jitter; a stream or shard that vanished
    raises ResourceNotFoundError; other failures are retried with backoff until cancelled.
    """

    def __init__(
        self,
        client: Any,
        stream: dict[str, str],
        shard_id: str,
        checkpoint: ExtendedSequenceNumber,
        initial_position: InitialPosition,
        queue: asyncio.Queue[FetchedBatch],
        *,
        max_records: int = 10_000,
        idle_time: float = 1.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
        deaggregator: Deaggregator | None = None,
    ) -> None:
        self._client = client
        self._stream = stream
        self._shard_id = shard_id
        self._start = checkpoint
        self._initial = initial_position
        self._queue = queue
        self._max_records = max_records
        self._idle = idle_time
        self._sleep = sleep
        self._backoff = Backoff(rng)
        self._last_delivered: str | None = None
        self.calls = 0
        # None: KPL aggregates are delivered as they are (records at or before a sub-sequence
        # checkpoint are still skipped).
        self.deaggregator = deaggregator
        # Decode GetRecords bodies ourselves (self-checked, falls back to botocore's parse).
        self.fast_decode = install_fast_getrecords(client)

    async def _iterator(self) -> str:
        if self._last_delivered is not None:
            args: dict[str, Any] = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": self._last_delivered,
            }
        else:
            args = iterator_args(self._start, self._initial)
        while True:
            try:
                resp = await self._client.get_shard_iterator(
                    **self._stream, ShardId=self._shard_id, **args
                )
                self._backoff.reset()
                return str(resp["ShardIterator"])
            except Exception as exc:
                await self._handle(exc, "GetShardIterator")

    async def _handle(self, exc: Exception, operation: str) -> None:
        """Back off after a retriable failure; raise the mapped error otherwise."""
        await wait_or_raise(
            exc, f"{operation} on shard {self._shard_id}", self._backoff, self._sleep
        )

    def _user_records(self, raw: list[Record]) -> list[Record]:
        # Until the first record arrives the reading may have started AT the checkpoint's
        # sequence number (a checkpoint inside a KPL aggregate): skip what it already covered.
        after = self._start if self._last_delivered is None else None
        if self.deaggregator is not None:
            return self.deaggregator(raw, after)
        return skip_through(raw, after)

    async def run(self) -> None:
        iterator = await self._iterator()
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                self.calls += 1
                resp = await self._client.get_records(
                    ShardIterator=iterator, Limit=self._max_records
                )
            except Exception as exc:
                if error_code(exc) == "ExpiredIteratorException":
                    log.info("shard %s: iterator expired; getting a new one", self._shard_id)
                    iterator = await self._iterator()
                    continue
                await self._handle(exc, "GetRecords")
                continue
            self._backoff.reset()
            raw = records_from_response(resp, self.fast_decode)
            records = self._user_records(raw)
            lag = resp.get("MillisBehindLatest")
            next_iterator = resp.get("NextShardIterator")
            ended = next_iterator is None
            if raw:
                self._last_delivered = raw[-1].sequence_number
            if records or ended:
                await self._queue.put(
                    FetchedBatch(
                        records=records,
                        millis_behind_latest=lag,
                        shard_ended=ended,
                        child_shards=list(resp.get("ChildShards") or ()),
                    )
                )
            if ended:
                return
            iterator = str(next_iterator)
            behind = len(raw) >= self._max_records or bool(lag)
            # Calls are spaced from the start of the previous one (as the KCL's idle time is),
            # so a slow response does not add its own duration to the pause.
            interval = MIN_INTERVAL_WHILE_BEHIND if behind else self._idle
            await self._sleep(max(0.0, interval - (loop.time() - started)))


async def earliest_sequence_number(
    client: Any, stream: dict[str, str], shard_id: str, *, max_calls: int = 5
) -> str | None:
    """The sequence number of the oldest record the shard still holds, or None if it holds none.

    GetRecords at TRIM_HORIZON may answer empty pages before reaching data on a real stream, so a
    few calls are made while the shard is not caught up.
    """
    try:
        resp = await client.get_shard_iterator(
            **stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )
        iterator = resp.get("ShardIterator")
        for _ in range(max_calls):
            if not iterator:
                return None
            page = await client.get_records(ShardIterator=iterator, Limit=1)
            records = records_from_response(page)
            if records:
                return records[0].sequence_number
            if not page.get("MillisBehindLatest"):
                return None
            iterator = page.get("NextShardIterator")
    except Exception as exc:
        raise map_aws_error(exc, f"reading the oldest record of shard {shard_id}") from exc
    return None
