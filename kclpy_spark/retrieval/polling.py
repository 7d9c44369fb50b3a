"""Polling retrieval on aiobotocore: GetShardIterator + GetRecords into a bounded prefetch queue.

One ``PollingFetcher`` per shard runs as an asyncio task (a ``RecordSource``). The queue it fills
is bounded, so a slow processor stops the fetcher (``await queue.put`` blocks) instead of letting
memory grow.

Calls are paced by the shard's two read limits: at most 5 GetRecords a second, and 2 MiB of
records a second (shared by every polling consumer of the shard). Kinesis enforces the second
after the fact: a call that returned B bytes makes the shard refuse reads
(ProvisionedThroughputExceededException) for about B / 2 MiB seconds ("if a call returns 10 MiB,
calls made within the next 5 seconds throw"). So after a page of B bytes the next call waits
that long from the response's arrival (``max_read_bytes_per_second``; lower it when several
applications poll the same shard), instead of being refused and backing off.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from checkpoint.base.errors import MalformedAnswerError, error_code, is_throttling
from checkpoint.base.retry import Backoff
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.retrieval.fastdecode import (
    install_fast_getrecords,
    page_bytes,
    record_from_parsed,
    records_from_response,
)
from kclpy_spark.retrieval.kpl import Deaggregator
from kclpy_spark.retrieval.positions import StartArgs
from kclpy_spark.retrieval.source import (
    CALL_INTERVAL,
    FetchedBatch,
    FetchProgress,
    KinesisShardProbe,
    RecordFilter,
    ShardEndWitness,
    end_children,
    shard_iterator_of,
    wait_or_raise,
)

log = logging.getLogger(__name__)

# Kinesis allows 5 GetRecords calls per second per shard, shared by every polling consumer: while
# behind (a full response, or MillisBehindLatest beyond the idle time) we read again after this
# short pause instead of the configured idle time, which stays the pause after an answer at or
# near the tip (under steady traffic the lag is a few milliseconds: reading 5 times a second then
# took the whole shard's allowance from every other application reading it).
MIN_INTERVAL_WHILE_BEHIND = CALL_INTERVAL
# Kinesis's read limit per shard (GetRecords: 2 MiB of records a second, all polling consumers).
READ_BYTES_PER_SECOND = 2 * 1024 * 1024
MAX_READ_PAUSE = 10.0
_NEXT = "NextShardIterator"  # where a GetRecords answer names its next position

# A Record from botocore's parsed GetRecords entry (used when the fast decode is off).
record_from_api = record_from_parsed

__all__ = ["FetchedBatch", "PollingFetcher", "pause_before_next_call", "record_from_api"]


def pause_before_next_call(
    interval: float, since_call: float, page: int, since_response: float, read_rate: float
) -> float:
    """Seconds to wait before the next GetRecords: ``interval`` from the previous call's start
    (``since_call`` ago), and at least ``page`` bytes / ``read_rate`` (bytes a second; 0: no
    limit) from its response's arrival (``since_response`` ago), when the shard reads again; that
    part at most MAX_READ_PAUSE (Kinesis itself blocks a shard at most 5 s, after a 10 MiB page:
    a longer wait only shares the shard with other readers, and must stay well inside the
    consumer's stall limit, 30 s, and a shard iterator's 5 minutes)."""
    pause = interval - since_call
    if read_rate > 0 and page > 0:
        pause = max(pause, min(page / read_rate, MAX_READ_PAUSE) - since_response)
    return max(0.0, pause)


class PollingFetcher:
    """Reads one shard from ``checkpoint`` onward and puts FetchedBatch items on ``queue``.

    Ends after putting the batch with ``shard_ended=True``, when an answer ends the shard
    unmistakably (``page_end``; ``end_witness``, ListShards by default, confirms an end without
    child shards); any other answer without a next iterator is malformed and asked again with
    the same iterator. Expired iterators are replaced from the last record delivered; throttling
    backs off with full jitter; a stream or shard that vanished raises ResourceNotFoundError, a
    refused iterator request RequestError; other failures are retried with backoff until
    cancelled. ``progress`` hears of every answered call.
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
        read_rate: float = READ_BYTES_PER_SECOND,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
        deaggregator: Deaggregator | None = None,
        progress: FetchProgress | None = None,
        end_witness: ShardEndWitness | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._witness = end_witness or KinesisShardProbe(client, stream)
        self._start_args = StartArgs(checkpoint, initial_position, wall)
        self._stream = stream
        self._shard_id = shard_id
        self._start = checkpoint
        self._initial = initial_position
        self._queue = queue
        self._max_records = max_records
        self._idle = idle_time
        self._read_rate = read_rate
        self._sleep = sleep
        self._clock = clock  # monotonic seconds; None: the event loop's
        self._backoff = Backoff(rng)
        self._last_delivered: str | None = None
        self._filter = RecordFilter(checkpoint, deaggregator)
        self._progress = progress
        self.calls = 0
        # Decode GetRecords bodies ourselves (self-checked, falls back to botocore's parse).
        self.fast_decode = install_fast_getrecords(client)

    @property
    def deaggregator(self) -> Deaggregator | None:
        return self._filter.deaggregator

    async def _iterator(self) -> str:
        while True:
            if self._last_delivered is not None:
                args: dict[str, Any] = {
                    "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                    "StartingSequenceNumber": self._last_delivered,
                }
            else:  # asked again each try: a LATEST retried is AT_TIMESTAMP from the first ask
                args = self._start_args()
            try:
                resp = await self._client.get_shard_iterator(
                    **self._stream, ShardId=self._shard_id, **args
                )
                iterator = shard_iterator_of(resp)
                self._backoff.reset()
                return iterator
            except Exception as exc:
                await self._handle(exc, "GetShardIterator")

    async def _put(self, batch: FetchedBatch) -> None:
        if self._progress is not None:
            await self._progress.put(self._queue, batch)
        else:
            await self._queue.put(batch)

    async def _handle(self, exc: Exception, operation: str) -> None:
        """Back off after a retriable failure; raise the mapped error otherwise."""
        if self._progress is not None:
            self._progress.failed(is_throttling(exc))
        await wait_or_raise(  # a retry is a call too: Kinesis's 5 a second per shard hold
            exc, f"{operation} on shard {self._shard_id}", self._backoff, self._sleep,
            at_least=MIN_INTERVAL_WHILE_BEHIND,
        )  # fmt: skip

    async def _after_expiry(self, since_call: float) -> str:
        """A new iterator for one that expired, asked no sooner than a call's interval after the
        last call (expired again and again, it was asked back to back: the shard's 5
        GetShardIterator a second, shared with every other reader)."""
        log.info("shard %s: iterator expired; getting a new one", self._shard_id)
        await self._sleep(max(0.0, MIN_INTERVAL_WHILE_BEHIND - since_call))
        return await self._iterator()

    def _pause(self, behind: bool, since_call: float, size: int, since_answer: float) -> float:
        """Before the next call. Calls are spaced from the start of the previous one (as the
        KCL's idle time is), so a slow response does not add its own duration; the read limit
        counts from the response. Never below Kinesis's 5 calls a second: an
        idle_time_between_reads under 0.2 s made 20 a second at the tip (every other reader of
        the shard refused)."""
        interval = (
            MIN_INTERVAL_WHILE_BEHIND if behind else max(MIN_INTERVAL_WHILE_BEHIND, self._idle)
        )
        return pause_before_next_call(interval, since_call, size, since_answer, self._read_rate)

    async def run(self) -> None:
        iterator = await self._iterator()
        clock = self._clock or asyncio.get_running_loop().time
        while True:
            started = clock()
            try:
                self.calls += 1
                resp = await self._client.get_records(
                    ShardIterator=iterator, Limit=self._max_records
                )
            except Exception as exc:
                if error_code(exc) == "ExpiredIteratorException":
                    iterator = await self._after_expiry(clock() - started)
                    continue
                await self._handle(exc, "GetRecords")
                continue
            returned = clock()
            try:
                children = await end_children(resp, _NEXT, self._witness, self._shard_id)
            except MalformedAnswerError as exc:  # the same iterator reads the same place again
                await self._handle(exc, "GetRecords")
                continue
            self._backoff.reset()
            if self._progress is not None:
                self._progress.ok()
            raw = records_from_response(resp, self.fast_decode)
            records = await self._filter.on_loop_or_thread(raw)
            lag = resp.get("MillisBehindLatest")
            ended = children is not None
            if raw:
                self._last_delivered = raw[-1].sequence_number
            # Before the records go to the processor (which may change the list).
            full = len(raw) >= self._max_records
            behind = full or (lag or 0) > self._idle * 1000.0
            size = page_bytes(raw) if self._read_rate > 0 else 0
            # An empty answer goes out too: it says where the shard's lag is (at the tip, 0: a
            # job that runs until caught up learns that this shard is, caught_up.py), and a
            # processor may ask to be called after it (callProcessRecordsEvenForEmptyRecordList:
            # the KCL calls it after every empty read, behind the tip too).
            if records or ended or lag is not None:
                await self._put(
                    FetchedBatch(
                        records=records,
                        millis_behind_latest=lag,
                        shard_ended=ended,
                        child_shards=children or [],
                        page_full=full,
                    )
                )
            if ended:
                return
            iterator = str(resp.get("NextShardIterator"))
            now = clock()
            await self._sleep(self._pause(behind, now - started, size, now - returned))
