"""Where a lease's records come from: the ``RecordSource`` port, and what every source shares.

A ``RecordSource`` reads one shard from a start position and puts ``FetchedBatch`` items on the
bounded queue it was given, ending after the batch with ``shard_ended=True``. Polling (GetRecords)
and enhanced fan-out (SubscribeToShard) implement it; tests use a fake. What both real sources do
to raw records is ``RecordFilter`` (KPL deaggregation, and skipping what the start checkpoint
already covers); when they last succeeded is ``FetchProgress``; what they retry and what they
raise is ``wait_or_raise``. ``page_end`` decides whether an answer ends the shard: only one that
says so unmistakably (no next position, and the shard's children named), or one ListShards
confirms with the children (``ShardEndWitness``); anything else is a malformed answer, retried,
so a proxy's empty 200 or an HTML page never ends an open shard. ``ShardProbe`` answers the two
questions a consumer asks of a shard outside reading it (its oldest record, and whether it still
exists). ``kinesis.KinesisSources`` builds the configured source for a lease.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from checkpoint.base.errors import (
    DependencyError,
    KclpySparkError,
    MalformedAnswerError,
    ThrottledError,
    error_code,
    map_aws_error,
)
from checkpoint.base.retry import Backoff
from checkpoint.lease import HashKeyRange
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.fastdecode import records_from_response
from kclpy_spark.retrieval.kpl import MAGIC, Deaggregator, skip_through

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]

# ListShards pages read to find one shard before giving up on confirming its end (1,000 shards a
# page by default: a stream's shard quota is far below this many pages).
MAX_LIST_PAGES = 50


class PageEnd(enum.Enum):
    """What one answer (a GetRecords page or a SubscribeToShard event) says about the shard."""

    MORE = "more"  # a next position: the shard goes on
    ENDED = "ended"  # no next position, and the shard's children named: the shard has ended
    UNCONFIRMED = "unconfirmed"  # no next position and no children: ended only if ListShards says
    MALFORMED = "malformed"  # not an answer of this call (no Records list, a bad next position)


def page_end(page: Mapping[str, Any], next_key: str = "NextShardIterator") -> PageEnd:
    """Classify one answer; ``next_key`` names its next position (GetRecords'
    ``NextShardIterator``, a SubscribeToShard event's ``ContinuationSequenceNumber``). Kinesis
    ends a shard with no next position and its ``ChildShards`` (the KCL refuses any other shard
    end); a 200 answer of ``{}`` or an HTML page parses to neither, and must not end a shard."""
    if not isinstance(page, Mapping) or not isinstance(page.get("Records"), list):
        return PageEnd.MALFORMED
    position = page.get(next_key)
    if position is not None:
        return PageEnd.MORE if isinstance(position, str) and position else PageEnd.MALFORMED
    children = page.get("ChildShards")
    if (
        isinstance(children, list)
        and children
        and all(isinstance(c, Mapping) and c.get("ShardId") for c in children)
    ):
        return PageEnd.ENDED
    return PageEnd.UNCONFIRMED


def not_an_end(verdict: PageEnd) -> MalformedAnswerError:
    """The error for an answer ``page_end`` (and ListShards) did not accept (the caller's log
    line names the call and the shard)."""
    if verdict is PageEnd.MALFORMED:
        why = "an answer that is not a result of the call (no Records list, or a bad next position)"
    else:
        why = "no next position and no child shards, and ListShards does not show the shard closed"
    return MalformedAnswerError(f"{why}: not a shard end")


@dataclass(frozen=True)
class ReadElsewhere:
    """Records of a lease read on Spark's executors and handed to its sink there: counted
    for the lease's figures, never delivered through this process (``throttled``: calls the
    reads had refused for the shard's limits; ``out_of_range``: KPL sub-records skipped with
    their aggregates, one of which lay outside the shard's hash range)."""

    rows: int
    nbytes: int
    last_sequence: str | None = None
    throttled: int = 0
    out_of_range: int = 0

    def plus(self, later: ReadElsewhere | None) -> ReadElsewhere:
        if later is None:
            return self
        last = later.last_sequence or self.last_sequence
        return ReadElsewhere(
            self.rows + later.rows, self.nbytes + later.nbytes, last,
            self.throttled + later.throttled, self.out_of_range + later.out_of_range,
        )  # fmt: skip


@dataclass(frozen=True)
class FetchedBatch:
    """What one read gave: the records, the lag, and whether the shard ended (with its
    children as GetRecords / SubscribeToShard list them)."""

    records: list[Record]
    millis_behind_latest: int | None
    shard_ended: bool = False
    child_shards: list[dict[str, Any]] = field(default_factory=list)
    # Delivered even without records: a source whose records go elsewhere (read on Spark's
    # executors) lets the processor see the lease's checkpointer before its first read.
    announce: bool = False
    elsewhere: ReadElsewhere | None = None  # what that source read for the lease
    # A full page: more records may wait even when the lag says 0 (the lag is to the newest
    # record returned, and a page stops at its record limit).
    page_full: bool = False


class SourceOutage(KclpySparkError):
    """Raised by a record source whose reads failed for a cause outside the shard (a read job
    on the executors that failed whole: executors lost, the cluster down): its consumer reads
    again after a growing backoff without counting a failure (an outage parks no lease). Every
    other error a source raises counts."""

    retriable = True


class RecordSource(Protocol):
    async def run(self) -> None:
        """Read from the start position onto the queue given at construction; return after
        putting the batch with ``shard_ended=True``. Retries throttling and transient failures
        itself; raises mapped non-retriable errors (a vanished stream or shard, a refused
        iterator, bad credentials)."""
        ...


class FetchProgress:
    """When a source last heard from the service successfully (an empty answer counts): the
    consumer's readiness asks it whether reading is making progress."""

    def __init__(
        self, clock: Callable[[], float], on_throttled: Callable[[], None] | None = None
    ) -> None:
        self._clock = clock
        self._on_throttled = on_throttled
        self.started = clock()
        self.last_ok: float | None = None
        self.failures = 0  # consecutive failed calls
        self.throttled = 0  # calls refused for the shard's limits, all told
        self.waiting = False  # blocked on a full queue: the processor is behind, not the source

    def ok(self) -> None:
        self.last_ok = self._clock()
        self.failures = 0

    def failed(self, throttled: bool = False) -> None:
        self.failures += 1
        if throttled:
            self.throttled += 1
            if self._on_throttled is not None:
                self._on_throttled()

    def silent_for(self) -> float:
        """Seconds since the last success (or since the source started, if none yet)."""
        return self._clock() - (self.started if self.last_ok is None else self.last_ok)

    def stalled(self, after: float) -> bool:
        """No successful call for ``after`` seconds, and not because the queue is full."""
        return not self.waiting and self.silent_for() > after

    async def put(self, queue: asyncio.Queue[FetchedBatch], batch: FetchedBatch) -> None:
        """``queue.put`` that marks the wait on a full queue as backpressure, not a stall."""
        self.waiting = True
        try:
            await queue.put(batch)
        finally:
            self.waiting = False
            self.last_ok = self._clock()


class RecordFilter:
    """What every source does to the raw records of one response, in order: KPL deaggregation
    (when given a Deaggregator) and, until the first record arrives, skipping every record and
    sub-record at or before the start checkpoint (a read that starts AT the checkpoint's
    sequence number, so the rest of a KPL aggregate can be delivered)."""

    def __init__(self, start: ExtendedSequenceNumber, deaggregator: Deaggregator | None) -> None:
        self._start: ExtendedSequenceNumber | None = start
        self.deaggregator = deaggregator

    def __call__(self, raw: list[Record]) -> list[Record]:
        after = self._start
        if raw:
            self._start = None  # reading resumes after delivered records from now on
        if self.deaggregator is not None:
            return self.deaggregator(raw, after)
        return skip_through(raw, after, whole=True)

    async def on_loop_or_thread(self, raw: list[Record]) -> list[Record]:
        """``self(raw)``; in a thread when the page holds KPL aggregates (splitting a page of
        them took a quarter of a second and more on the event loop, which every other shard's
        reads, and the worker's lease calls, wait for). One page at a time per source. A page
        is judged by its first and last records (a KPL producer's pages are aggregates
        throughout): no scan of every record on the hot path, which the split makes anyway."""
        if self.deaggregator is not None and raw and MAGIC in (raw[0].head(4), raw[-1].head(4)):
            return await asyncio.to_thread(self, raw)
        return self(raw)


async def wait_or_raise(
    exc: BaseException,
    what: str,
    backoff: Backoff,
    sleep: Sleep,
    *,
    retrying: str = "retrying",
    at_least: float = 0.0,
) -> None:
    """After ``exc`` from the call described by ``what``: sleep a backoff delay (``at_least``
    that long) if a retry may help, else raise the mapped error (the one place sources decide
    that)."""
    if isinstance(exc, asyncio.CancelledError):
        raise exc
    mapped = map_aws_error(exc, what)
    if not isinstance(mapped, ThrottledError | DependencyError):
        raise mapped from exc
    delay = max(at_least, backoff.next_delay())
    level = logging.DEBUG if isinstance(mapped, ThrottledError) else logging.WARNING
    log.log(level, "%s; %s in %.2fs", mapped, retrying, delay)
    await sleep(delay)


class ShardProbe(Protocol):
    async def earliest_sequence_number(self, shard_id: str) -> str | None:
        """The sequence number of the oldest record the shard still holds, or None if it holds
        none. Raises mapped errors (ResourceNotFoundError for a missing stream or shard)."""
        ...

    async def shard_exists(self, shard_id: str) -> bool:
        """False once the shard has aged out of the stream (or never existed)."""
        ...


class ShardEndWitness(Protocol):
    async def children_if_closed(self, shard_id: str) -> list[dict[str, Any]] | None:
        """The shard's children in GetRecords' ``ChildShards`` shape if ListShards lists it as
        closed (with an EndingSequenceNumber) and lists its children; else None (open, unknown,
        or closed with no child listed yet: not an end to act on). Raises mapped errors."""
        ...


async def end_children(
    answer: Mapping[str, Any], next_key: str, witness: ShardEndWitness, shard_id: str
) -> list[dict[str, Any]] | None:
    """The children ``answer`` ends the shard into (its own ``ChildShards``, or the ones
    ``witness`` lists for an end without them); None if the shard goes on. Raises
    MalformedAnswerError for any other answer (``page_end``; an end ListShards does not confirm
    with its children): the caller asks again, as after a failed call."""
    verdict = page_end(answer, next_key)
    if verdict is PageEnd.MORE:
        return None
    if verdict is PageEnd.ENDED:
        return list(answer["ChildShards"])
    if verdict is PageEnd.UNCONFIRMED:
        try:
            listed = await witness.children_if_closed(shard_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("shard %s: could not confirm its end with ListShards: %s", shard_id, exc)
            listed = None
        if listed is not None:
            return listed
    raise not_an_end(verdict)


def shard_iterator_of(answer: Mapping[str, Any]) -> str:
    """GetShardIterator's iterator; MalformedAnswerError for an answer without one (a 200 of
    ``{}`` from a proxy is no iterator, nor an empty shard)."""
    iterator = answer.get("ShardIterator")
    if not isinstance(iterator, str) or not iterator:
        raise MalformedAnswerError("GetShardIterator answered without a ShardIterator")
    return iterator


def children_in_listing(
    shards: list[Mapping[str, Any]], shard_id: str
) -> list[dict[str, Any]] | None:
    """``shard_id``'s children from a complete ListShards listing, as ``ChildShards`` entries;
    None unless the shard is listed closed and at least one child names it."""
    own = [s for s in shards if s.get("ShardId") == shard_id]
    if not own or not (own[0].get("SequenceNumberRange") or {}).get("EndingSequenceNumber"):
        return None
    children = []
    for shard in shards:
        parents = [shard.get("ParentShardId"), shard.get("AdjacentParentShardId")]
        if shard_id in parents:
            children.append(
                {
                    "ShardId": shard.get("ShardId"),
                    "ParentShards": [p for p in parents if p],
                    "HashKeyRange": shard.get("HashKeyRange"),
                }
            )
    return children or None


# Kinesis allows 5 GetRecords calls a second per shard, shared by every application reading it:
# the least time between two calls of ours on one shard (the probe's, the fetchers').
CALL_INTERVAL = 0.2


class KinesisShardProbe:
    """ShardProbe and ShardEndWitness over an aiobotocore Kinesis client."""

    def __init__(
        self,
        client: Any,
        stream: dict[str, str],
        *,
        max_calls: int = 5,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._stream = stream
        self._max_calls = max_calls
        self._sleep = sleep

    async def _trim_horizon_iterator(self, shard_id: str) -> str:
        resp = await self._client.get_shard_iterator(
            **self._stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
        )
        return shard_iterator_of(resp)

    async def earliest_sequence_number(self, shard_id: str) -> str | None:
        # GetRecords at TRIM_HORIZON may answer empty pages before reaching data on a real
        # stream, so a few calls are made while the shard is not caught up.
        try:
            iterator = await self._trim_horizon_iterator(shard_id)
            for call in range(self._max_calls):
                if not iterator:
                    return None
                if call:  # Kinesis's 5 GetRecords a second per shard, shared with every reader
                    await self._sleep(CALL_INTERVAL)
                page = await self._client.get_records(ShardIterator=iterator, Limit=1)
                records = records_from_response(page)
                if records:
                    return records[0].sequence_number
                if not page.get("MillisBehindLatest"):
                    return None
                iterator = page.get("NextShardIterator")
        except Exception as exc:
            raise map_aws_error(exc, f"reading the oldest record of shard {shard_id}") from exc
        return None

    async def children_if_closed(self, shard_id: str) -> list[dict[str, Any]] | None:
        args: dict[str, Any] = dict(self._stream)
        shards: list[Mapping[str, Any]] = []
        try:
            for _ in range(MAX_LIST_PAGES):
                resp = await self._client.list_shards(**args)
                shards.extend(resp.get("Shards") or ())
                token = resp.get("NextToken")
                if not token:
                    return children_in_listing(shards, shard_id)
                args = {"NextToken": token}  # ListShards refuses the stream beside a token
        except Exception as exc:
            raise map_aws_error(exc, f"ListShards looking for shard {shard_id}") from exc
        return None

    async def shard_exists(self, shard_id: str) -> bool:
        try:
            await self._trim_horizon_iterator(shard_id)
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return False
            raise map_aws_error(exc, f"GetShardIterator on shard {shard_id}") from exc
        return True


class SourceFactory(Protocol):
    def __call__(
        self,
        shard_id: str,
        start: ExtendedSequenceNumber,
        position: InitialPosition,
        hash_range: HashKeyRange | None,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> RecordSource: ...
