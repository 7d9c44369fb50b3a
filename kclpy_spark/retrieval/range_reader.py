"""Reading one planned range of a shard (``spark/ranges.py``) with GetShardIterator and GetRecords:
what a Spark task runs on an executor, on an aiobotocore Kinesis client.

It reads as the polling source does (``polling.py``): calls spaced at most five a second and paced
by the bytes of each page (``read_rate``), throttling and transient failures retried with jittered
backoff, an expired iterator replaced from the last record seen, an answer that is not a clear
shard end asked again (``end_children``), KPL aggregates split with the child's hash range applied.
It stops where the range says (``ReadRange``): a budget spent, the tip, the shard's end, or, for a
pinned range, its last record. Every kept record goes to ``on_records`` page by page; the result
is the ``RangeEnd``, checked against the pin when there is one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from checkpoint.base.errors import (
    DependencyError,
    MalformedAnswerError,
    error_code,
    is_throttling,
)
from checkpoint.base.retry import Backoff
from checkpoint.lease import HashKeyRange
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.fastdecode import (
    install_fast_getrecords,
    page_bytes,
    records_from_response,
)
from kclpy_spark.retrieval.kpl import Deaggregator, has_sub_records_after
from kclpy_spark.retrieval.polling import MIN_INTERVAL_WHILE_BEHIND, pause_before_next_call
from kclpy_spark.retrieval.positions import iterator_args
from kclpy_spark.retrieval.source import (
    KinesisShardProbe,
    ShardEndWitness,
    end_children,
    shard_iterator_of,
    wait_or_raise,
)
from kclpy_spark.spark.ranges import Key, RangeEnd, ReadRange, check_pinned

log = logging.getLogger(__name__)

ESN = ExtendedSequenceNumber
PAGE_LIMIT = 10_000  # GetRecords' own limit on records a call


class RangeReadTimeoutError(DependencyError):
    """A pinned range was not read to its last record within its time budget (retried)."""


class RangeReader:
    """Reads one range on ``client`` (an aiobotocore Kinesis client)."""

    def __init__(
        self,
        client: Any,
        rng: ReadRange,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        witness: ShardEndWitness | None = None,
        random_source: random.Random | None = None,
    ) -> None:
        self._client = client
        self._rng = rng
        self._stream = dict(rng.stream_arg)
        self._sleep = sleep
        self._clock = clock
        self._wall = wall
        self._witness = witness or KinesisShardProbe(client, self._stream)
        self._backoff = Backoff(random_source)
        self._fast = install_fast_getrecords(client)
        deaggregator = None
        if rng.kpl:
            hash_range = HashKeyRange(*rng.hash_range) if rng.hash_range else None
            deaggregator = Deaggregator(hash_range, shard_id=rng.shard_id)
        self._deaggregator = deaggregator
        self._window = rng.window()
        self._whole = rng.whole_window()  # decided at the first page with records
        self.calls = 0
        self.throttled = 0
        self._called: float | None = None  # when the previous call started
        self._answered: float | None = None  # and when its answer came
        self._page_size = 0  # its records' bytes, for the read rate
        self._page_records = 0  # and how many records it held
        self._replacement: str | None = None  # an iterator that replaced an expired one
        self._gave_way = False  # the last call was throttled (or timed out): the range ends
        self._expired = False  # ... or its iterator expired and no new one could be had
        self._deadline = math.inf  # the range's time budget ends (monotonic), set by read()

    async def _iterator(self, resume: ESN | None) -> str | None:
        """An iterator at the range's start, or at ``resume`` (the last record a page held);
        None when the range's time ran out first, or, unpinned, at once when throttled (the
        range gives way, as for a throttled GetRecords)."""
        rng = self._rng
        if resume is not None:
            args: dict[str, Any] = {
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                "StartingSequenceNumber": resume.sequence_number,
            }
        elif rng.pinned is not None and rng.pinned.first is not None:
            args = {
                "ShardIteratorType": "AT_SEQUENCE_NUMBER",
                "StartingSequenceNumber": rng.pinned.first.sequence_number,
            }
        else:
            args = iterator_args(rng.after, _initial_position(rng))
        while True:
            try:
                answer = await self._client.get_shard_iterator(
                    **self._stream, ShardId=rng.shard_id, **args
                )
                return shard_iterator_of(answer)
            except Exception as exc:
                if rng.pinned is None and is_throttling(exc):
                    self.throttled += 1  # gives way at once, as a throttled GetRecords does
                    return None
                if not await self._failed(exc, "GetShardIterator"):
                    return None

    async def _failed(self, exc: Exception, operation: str) -> bool:
        """Back off a retriable failure (raise the others), no further than the range's time
        budget; False when that is spent. One slow shard would otherwise hold its read job, and
        every lease read in it, past the budget (the job ends with its slowest task)."""
        if is_throttling(exc):
            self.throttled += 1
        left = self._deadline - self._clock()

        async def nap(seconds: float) -> None:
            await self._sleep(max(0.0, min(seconds, left)))

        await wait_or_raise(exc, f"{operation} on shard {self._rng.shard_id}", self._backoff, nap)
        return self._clock() < self._deadline

    async def read(self, on_records: Callable[[list[Record]], None]) -> RangeEnd:
        """The range read; a failure carries ``next_call_at`` (when the shard may be called
        again by this read's pacing): a retry after a big page waited only the backoff."""
        try:
            return await self._read(on_records)
        except Exception as exc:
            exc.next_call_at = self._next_call_at()  # type: ignore[attr-defined]
            raise

    async def _read(self, on_records: Callable[[list[Record]], None]) -> RangeEnd:
        rng, pin = self._rng, self._rng.pinned
        if pin is not None and not pin.needs_read:
            return RangeEnd(rng.lease_key, None, None, 0, 0, shard_ended=pin.shard_ended)
        started = self._clock()
        self._deadline = started + rng.max_seconds
        use_given = pin is None and rng.iterator is not None
        first = str(rng.iterator) if use_given else await self._iterator(None)
        if first is None:
            if pin is not None:
                raise RangeReadTimeoutError(
                    f"lease {rng.lease_key}: no iterator for the pinned range within "
                    f"{rng.max_seconds:g} s"
                )
            return _Found().end(rng, self.calls, self.throttled, self._next_call_at())
        iterator = first
        found = _Found()
        while True:
            now = self._clock()
            if now - started >= rng.max_seconds:
                if pin is not None:
                    raise RangeReadTimeoutError(
                        f"lease {rng.lease_key}: the pinned range was not read again within "
                        f"{rng.max_seconds:g} s"
                    )
                found.next_iterator = iterator
                break
            await self._pace(now)
            limit = PAGE_LIMIT if pin is not None else min(PAGE_LIMIT, rng.max_records - found.rows)
            answer = await self._page(iterator, limit, found)
            if answer is None:  # failed, backed off; throttled; or the iterator was replaced
                if self._gave_way:  # the next round reads on with the same iterator, if valid
                    found.next_iterator = None if self._expired else iterator
                    break
                iterator = self._replacement or iterator
                continue
            found.pages += 1
            over = self._take(answer, found, on_records)
            # A page that went on past the range, or a full one, says nothing of the tip.
            found.left_behind = over or self._page_records >= limit
            if found.bounded:  # the next record arrived after the bound: nothing more is ours
                found.children = None  # nor the shard's end, which comes after that record
                break
            if found.children is not None:
                break
            iterator = str(answer["NextShardIterator"])
            if pin is not None:
                if over or found.last == pin.last:
                    break
            elif self._enough(found, limit):
                found.next_iterator = iterator
                break
        end = found.end(rng, self.calls, self.throttled, self._next_call_at(), self._out_of_range())
        check_pinned(rng, end)
        return end

    def _out_of_range(self) -> int:
        """The KPL sub-records skipped so far for lying outside the shard's hash range (their
        aggregates whole)."""
        deaggregator = self._deaggregator
        return 0 if deaggregator is None else deaggregator.counters.skipped_out_of_range

    def _enough(self, found: _Found, limit: int) -> bool:
        """An unpinned range is done: its budget is read, or its last page was at the tip."""
        rng = self._rng
        return (
            found.rows >= rng.max_records
            or found.nbytes >= rng.max_bytes
            or 0 < rng.max_pages <= found.pages
            or (found.lag == 0 and self._page_records < limit)  # a full page: maybe not the tip
        )

    async def _pace(self, now: float) -> None:
        """At most five calls a second, and a page's bytes at ``read_rate`` (polling.py)."""
        await self._sleep(self._pause(now))

    def _pause(self, now: float) -> float:
        """How long from ``now`` until the next call: one call's interval from the last (even
        one that failed), and the last page's bytes at ``read_rate`` from its answer."""
        if self._called is None:
            return 0.0
        answered = self._answered if self._answered is not None else self._called
        return pause_before_next_call(
            MIN_INTERVAL_WHILE_BEHIND,
            now - self._called,
            self._page_size,
            now - answered,
            self._rng.read_rate,
        )

    def _next_call_at(self) -> float | None:
        """When (wall clock) the shard may be called again after this read; None: no call."""
        if self._called is None:
            return None
        return self._wall() + self._pause(self._clock())

    async def _page(self, iterator: str, limit: int, found: _Found) -> Mapping[str, Any] | None:
        """One GetRecords answer with its shard end settled (``found.children``); None after a
        failure (backed off) or an expired iterator (``_replacement`` holds the new one)."""
        self._replacement = None
        self._gave_way = self._expired = False
        self._called = self._clock()
        try:
            self.calls += 1
            answer: Mapping[str, Any] = await self._client.get_records(
                ShardIterator=iterator, Limit=limit
            )
            found.children = await end_children(
                answer, "NextShardIterator", self._witness, self._rng.shard_id
            )
        except MalformedAnswerError as exc:  # the same iterator reads the same place again
            await self._failed(exc, "GetRecords")
            return None
        except Exception as exc:
            if error_code(exc) == "ExpiredIteratorException":
                self._replacement = await self._iterator(found.seen or _start_of(self._rng))
                # None: throttled, or out of time. Unpinned, the range ends with what it has
                # and the next round starts after it: read on with the expired iterator, it
                # called the shard twice each pause until the range's time was spent, and
                # handed that iterator to the next round, which did the same.
                self._gave_way = self._replacement is None and self._rng.pinned is None
                self._expired = self._gave_way
            elif is_throttling(exc) and self._rng.pinned is None:
                # Another reader takes the shard's allowance: the range ends here with what it
                # has (its planner backs the lease off). Retried until the range's time ran
                # out, it held its read job, and every lease read in it, that long each round.
                self.throttled += 1
                self._gave_way = True
            else:
                await self._failed(exc, "GetRecords")
            return None
        self._answered = self._clock()
        self._backoff.reset()
        return answer

    def _take(
        self,
        answer: Mapping[str, Any],
        found: _Found,
        on_records: Callable[[list[Record]], None],
    ) -> bool:
        """Keep the page's records that belong to the range; True once past a pin's end."""
        raw = records_from_response(answer, self._fast)
        self._page_size = page_bytes(raw)
        self._page_records = len(raw)
        found.read_records += len(raw)
        found.read_bytes += self._page_size
        if raw:
            found.seen = ESN(raw[-1].sequence_number, 0)
        records = self._deaggregator(raw, None) if self._deaggregator else raw
        if self._whole is not None and records:
            self._keep_whole(records)
        kept, over = self._kept(records, found)
        if kept:
            found.rows += len(kept)
            # The page's size (known without a pass) when it kept all: near enough for a budget.
            found.nbytes += self._page_size if kept is records else page_bytes(kept)
            on_records(kept)
        found.lag = answer.get("MillisBehindLatest")
        return over

    def _keep_whole(self, records: list[Record]) -> None:
        """The first page read (not deaggregated) after ``(seq, k > 0)``: if the record at seq
        is a KPL aggregate with sub-records after k, it is kept whole (``kpl.skip_through``)."""
        whole, self._whole = self._whole, None
        assert whole is not None and whole.low is not None
        seq, after = whole.low[0], self._rng.after.sub_sequence_number
        for record in records:
            if int(record.sequence_number) == seq and has_sub_records_after(record, after):
                self._window = whole
                return

    def _kept(self, records: list[Record], found: _Found) -> tuple[list[Record], bool]:
        """The records the range keeps (the page itself when it keeps all: a page inside the
        range is not looked at record by record), and whether the page went past a pin."""
        if not records:
            return records, False
        until = self._rng.until_millis if self._rng.pinned is None else None
        if until is not None and any(r.timestamp_millis > until for r in records):
            records = self._before(records, until, found)
            if not records:
                return records, False
        window = self._window
        first, last = records[0], records[-1]
        low = (int(first.sequence_number), first.sub_sequence_number)
        high = (int(last.sequence_number), last.sub_sequence_number)
        if window.keeps_all(low, high, found.last_key):
            found.note(low, first, high, last)
            return records, False
        kept: list[Record] = []
        for record in records:
            key = (int(record.sequence_number), record.sub_sequence_number)
            if window.past(key):
                return kept, True
            if window.keeps(key, found.last_key):
                kept.append(record)
                found.note(key, record, key, record)
        return kept, False

    @staticmethod
    def _before(records: list[Record], until: int, found: _Found) -> list[Record]:
        """The records before the first one that arrived after ``until`` (which ends the read)."""
        for index, record in enumerate(records):
            if record.timestamp_millis > until:
                found.bounded = True
                return records[:index]
        return records


@dataclass
class _Found:
    """What a read has found so far."""

    first: ESN | None = None
    last: ESN | None = None
    last_key: Key | None = None
    seen: ESN | None = None  # the last record a page held (where an expired iterator resumes)
    rows: int = 0
    nbytes: int = 0
    lag: int | None = None
    children: list[dict[str, Any]] | None = None
    next_iterator: str | None = None
    # The last page held records after the range's end, or was full: its lag (0 on a full page
    # from an emulator, or at the same millisecond) does not say the range reached the tip.
    left_behind: bool = False
    pages: int = 0  # GetRecords answers taken
    read_records: int = 0  # Kinesis records those answers held (before deaggregation)
    read_bytes: int = 0  # and their bytes
    bounded: bool = False  # a record after the range's ``until_millis`` was met

    def note(self, first_key: Key, first: Record, last_key: Key, last: Record) -> None:
        """Records from ``first`` to ``last`` were kept."""
        if self.first is None:
            self.first = ESN(first.sequence_number, first_key[1])
        self.last, self.last_key = ESN(last.sequence_number, last_key[1]), last_key

    def end(
        self,
        rng: ReadRange,
        calls: int,
        throttled: int,
        next_call_at: float | None,
        out_of_range: int = 0,
    ) -> RangeEnd:
        if rng.pinned is not None:  # a pinned read says only what its pin says: records past
            ended, children = rng.pinned.shard_ended, None  # it are the next range's
        else:
            ended, children = self.children is not None, self.children
        return RangeEnd(
            rng.lease_key,
            self.first,
            self.last,
            self.rows,
            self.nbytes,
            millis_behind_latest=self.lag,
            left_behind=self.left_behind,
            shard_ended=ended,
            child_shards=tuple(children or ()),
            next_iterator=self.next_iterator,
            calls=calls,
            throttled=throttled,
            unanswered=not self.pages and not self.rows and not ended,
            bounded=self.bounded,
            next_call_at=next_call_at,
            read_records=self.read_records,
            read_bytes=self.read_bytes,
            out_of_range=out_of_range,
        )


def _initial_position(rng: ReadRange) -> InitialPosition:
    """What ``iterator_args`` needs beside the checkpoint: the time of an AT_TIMESTAMP start."""
    if rng.timestamp is not None:
        return InitialPosition.at_timestamp(rng.timestamp)
    return InitialPosition.trim_horizon()


def _start_of(rng: ReadRange) -> ESN | None:
    """Where a read that has seen no record yet resumes after its iterator expired."""
    if rng.pinned is not None and rng.pinned.first is not None:
        return rng.pinned.first
    return None if rng.after.is_sentinel else rng.after
