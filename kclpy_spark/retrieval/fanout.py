"""Enhanced fan-out retrieval on aiobotocore: a registered stream consumer and SubscribeToShard.

``FanOutFetcher`` has PollingFetcher's contract: it puts FetchedBatch items on a bounded queue and
ends after the batch with ``shard_ended=True``. A subscription lasts at most five minutes; the
fetcher renews it a little earlier (``subscription_lifetime``), after the server ends it, and after
errors (full-jitter backoff), each time from the last position the service confirmed
(AFTER_SEQUENCE_NUMBER with the continuation sequence number). An event whose
ContinuationSequenceNumber is null and whose ChildShards name the children ends the shard (one
without children ends it only if ListShards shows the shard closed: ``source.page_end``); its
ChildShards go into the last batch.

Emulators do not all signal the end of a closed shard over the event stream (LocalStack 2026.3
breaks the stream instead), so after a broken stream one GetRecords call checks whether the shard
has ended; on AWS this costs one call per failure and normally finds the shard open.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from checkpoint.base.errors import (
    ResourceNotFoundError,
    error_code,
    is_throttling,
)
from checkpoint.base.retry import Backoff
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.fastdecode import record_from_parsed, records_from_response
from kclpy_spark.retrieval.kpl import Deaggregator
from kclpy_spark.retrieval.positions import StartArgs, iterator_args
from kclpy_spark.retrieval.source import (
    FetchedBatch,
    FetchProgress,
    KinesisShardProbe,
    RecordFilter,
    ShardEndWitness,
    end_children,
    shard_iterator_of,
    wait_or_raise,
)
from kclpy_spark.retrieval.stream_consumer import CONSUMERS, ConsumerRegistry

log = logging.getLogger(__name__)

# The shard-end check after a broken stream reads this many records at most: a whole page of
# small records (10,000, megabytes) took the shard's polling allowance from other applications
# for seconds; 100 large records can still make one answer of up to 10 MB.
END_CHECK_LIMIT = 100

# AWS ends a subscription after 5 minutes; renewing 10 s earlier keeps the gap ours to choose.
SUBSCRIPTION_LIFETIME = 290.0
# AWS allows one SubscribeToShard call per second per consumer and shard, and refuses one
# (ResourceInUseException) within 5 s of a successful one.
MIN_RESUBSCRIBE_INTERVAL = 1.0
AFTER_SUBSCRIBED = 5.0
Sleep = Callable[[float], Awaitable[None]]


def starting_position(
    checkpoint: ExtendedSequenceNumber, initial_position: InitialPosition
) -> dict[str, Any]:
    """SubscribeToShard's StartingPosition for ``checkpoint`` (the same rules as polling)."""
    return position_of(iterator_args(checkpoint, initial_position))


def position_of(args: dict[str, Any]) -> dict[str, Any]:
    """SubscribeToShard's StartingPosition for GetShardIterator's arguments."""
    position: dict[str, Any] = {"Type": args["ShardIteratorType"]}
    if "StartingSequenceNumber" in args:
        position["SequenceNumber"] = args["StartingSequenceNumber"]
    if "Timestamp" in args:
        position["Timestamp"] = args["Timestamp"]
    return position


class FanOutFetcher:
    """Reads one shard through enhanced fan-out from ``checkpoint`` onward into ``queue``.

    Ends after putting the batch with ``shard_ended=True``. Raises ResourceNotFoundError if the
    stream or shard vanished, mapped non-retriable errors (access, bad request); retries the rest
    with backoff until cancelled. ``subscriptions`` and ``renewals`` count for tests and status.
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
        consumer_name: str,
        subscription_lifetime: float = SUBSCRIPTION_LIFETIME,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        deaggregator: Deaggregator | None = None,
        registry: ConsumerRegistry | None = None,
        progress: FetchProgress | None = None,
        end_witness: ShardEndWitness | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._stream = stream
        self._start_args = StartArgs(checkpoint, initial_position, wall)
        self._shard_id = shard_id
        self._start = checkpoint
        self._initial = initial_position
        self._queue = queue
        self._witness = end_witness or KinesisShardProbe(client, stream)
        self._consumer_name = consumer_name
        self._lifetime = subscription_lifetime
        self._sleep = sleep
        self._clock = clock
        self._backoff = Backoff(rng)
        self._filter = RecordFilter(checkpoint, deaggregator)
        self._progress = progress
        self._registry = registry or CONSUMERS
        # Resume AFTER this sequence number (the last record or a later continuation number).
        self._resume: str | None = None
        self._floor = 0 if checkpoint.is_sentinel else int(checkpoint.sequence_number)
        self._last_subscribe: float | None = None  # the last call (its answer: the registry's)
        self._not_found = 0
        self.subscriptions = 0
        self.renewals = 0

    @property
    def deaggregator(self) -> Deaggregator | None:
        return self._filter.deaggregator

    def _position(self) -> dict[str, Any]:
        if self._resume is not None:
            return {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": self._resume}
        return position_of(self._start_args())

    def _advance(self, raw: list[Record], continuation: str | None) -> None:
        """Move the resume point: to the last record received, or to a continuation number that
        lies beyond it (an emulator may send a placeholder such as "0": never move back)."""
        if raw:
            self._resume = raw[-1].sequence_number
        if continuation and continuation.isdigit():
            current = int(self._resume) if self._resume is not None else self._floor
            if int(continuation) > current:
                self._resume = continuation

    async def _put(self, batch: FetchedBatch) -> None:
        if self._progress is not None:
            await self._progress.put(self._queue, batch)
        else:
            await self._queue.put(batch)

    async def _handle(self, exc: BaseException, operation: str) -> None:
        """Back off after a retriable failure; raise the mapped error otherwise."""
        if self._progress is not None:
            self._progress.failed(is_throttling(exc))
        await wait_or_raise(
            exc,
            f"{operation} on shard {self._shard_id}",
            self._backoff,
            self._sleep,
            retrying="resubscribing",
        )

    async def _pace(self, arn: str) -> None:
        """A call a second at most, and none within 5 s of an answered one (this fetcher's or an
        earlier one's on the shard: the registry's)."""
        answered = self._registry.subscribed_at(arn, self._shard_id)
        since = ((self._last_subscribe, MIN_RESUBSCRIBE_INTERVAL),
                 (answered, AFTER_SUBSCRIBED))  # fmt: skip
        due = max((t + gap for t, gap in since if t is not None), default=-math.inf)
        wait = due - self._clock()
        if wait > 0:
            await self._sleep(wait)
        self._last_subscribe = self._clock()

    async def run(self) -> None:
        arn = await self._registry.ensure(
            self._client, self._stream, self._consumer_name, sleep=self._sleep
        )
        self._not_found = 0
        while True:
            await self._pace(arn)
            position = self._position()  # out of the try: a position it cannot build is no retry
            try:
                resp = await self._client.subscribe_to_shard(
                    ConsumerARN=arn, ShardId=self._shard_id, StartingPosition=position
                )
            except Exception as exc:
                if error_code(exc) == "ResourceNotFoundException":
                    arn = await self._register_again(exc)
                else:
                    await self._handle(exc, "SubscribeToShard")
                continue
            self.subscriptions += 1
            # Counted from its answer: Kinesis counts from when it took the call, after it went.
            self._registry.note_subscribed(arn, self._shard_id, self._clock(), AFTER_SUBSCRIBED)
            try:
                if await self._consume(resp["EventStream"]):
                    return
            except Exception as exc:
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.info("shard %s: subscription broke (%r)", self._shard_id, exc)
                if await self._ended_by_polling():
                    return
                if error_code(exc) == "ResourceNotFoundException":
                    arn = await self._register_again(exc)
                else:
                    await self._handle(exc, "SubscribeToShard event stream")

    async def _register_again(self, exc: Exception) -> str:
        """The consumer was deregistered (another worker's shutdown) or the shard is gone:
        register again; raise ResourceNotFoundError if that keeps not helping."""
        self._not_found += 1
        if self._not_found > 3:
            raise ResourceNotFoundError(
                f"SubscribeToShard on shard {self._shard_id}: {exc}"
            ) from exc
        log.warning("shard %s: %s; registering the consumer again", self._shard_id, exc)
        arn = await self._registry.stream_arn(self._client, self._stream, sleep=self._sleep)
        self._registry.forget(arn, self._consumer_name)
        await self._sleep(self._backoff.next_delay())
        return await self._registry.ensure(
            self._client, self._stream, self._consumer_name, sleep=self._sleep
        )

    async def _consume(self, events: Any) -> bool:
        """Deliver a subscription's events until it ends (False: renew) or the shard ends
        (True). Errors from the stream propagate."""
        started = self._clock()
        iterator = aiter(events)
        try:
            while True:
                remaining = self._lifetime - (self._clock() - started)
                if remaining <= 0:
                    self.renewals += 1
                    return False
                lifetime = asyncio.timeout(remaining)
                try:
                    async with lifetime:
                        event = await anext(iterator)
                except StopAsyncIteration:
                    return False
                except TimeoutError:
                    if not lifetime.expired():  # the stream's own read timeout: a failure
                        raise
                    self.renewals += 1
                    return False
                body = event.get("SubscribeToShardEvent")
                if body is not None and await self._on_event(body):
                    return True
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    async def _on_event(self, body: dict[str, Any]) -> bool:
        key = "ContinuationSequenceNumber"
        children = await end_children(body, key, self._witness, self._shard_id)
        ended = children is not None
        self._backoff.reset()
        self._not_found = 0
        if self._progress is not None:
            self._progress.ok()
        raw = [record_from_parsed(r) for r in body.get("Records", ())]
        records = await self._filter.on_loop_or_thread(raw)
        continuation = body.get("ContinuationSequenceNumber")
        self._advance(raw, continuation)
        if records or ended or body.get("MillisBehindLatest") is not None:  # see polling
            await self._put(
                FetchedBatch(
                    records=records,
                    millis_behind_latest=body.get("MillisBehindLatest"),
                    shard_ended=ended,
                    child_shards=children or [],
                )
            )
        return ended

    async def _ended_by_polling(self) -> bool:
        """One GetRecords from the resume point: deliver what it returns; True if the shard has
        ended (the records and child shards went out in the last batch)."""
        if self._resume is not None:
            args: dict[str, Any] = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": self._resume,
            }
        else:
            args = self._start_args()
        try:
            it = await self._client.get_shard_iterator(
                **self._stream, ShardId=self._shard_id, **args
            )
            resp = await self._client.get_records(
                ShardIterator=shard_iterator_of(it), Limit=END_CHECK_LIMIT
            )
            children = await end_children(resp, "NextShardIterator", self._witness, self._shard_id)
        except Exception as exc:
            log.debug("shard %s: shard-end check failed: %r", self._shard_id, exc)
            return False
        ended = children is not None
        raw = records_from_response(resp)
        records = await self._filter.on_loop_or_thread(raw)
        self._advance(raw, None)
        if records or ended:
            await self._put(
                FetchedBatch(
                    records=records,
                    millis_behind_latest=resp.get("MillisBehindLatest"),
                    shard_ended=ended,
                    child_shards=children or [],
                    page_full=len(raw) >= END_CHECK_LIMIT,  # more may wait even at lag 0
                )
            )
        if ended:
            log.info("shard %s ended (seen by GetRecords after the stream broke)", self._shard_id)
        return ended
