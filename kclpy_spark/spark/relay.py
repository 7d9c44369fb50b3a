"""A lease's record source when its records are read on the executors (executor_reads.py).

The consumer of a lease runs as always; its ``RecordSource`` is a ``LeaseRelay``, which reads
nothing itself: it registers the lease with ``ExecutorReads`` and puts on the consumer's queue
first an announcement (so the Spark sink's processor opens the lease's lane with its
checkpointer), then, for each read of the lease, a batch without records that carries the lag and
the shard's end with its children, or raises the read's failure. A read nobody answered
(``NoAnswer``) is counted as a failed call, not put on the queue: the lease's progress then shows
a silent shard. ``ExecutorSources`` makes the relays of one stream (a ``SourceFactory``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque

from checkpoint.lease import HashKeyRange, lease_key_of, stream_name_of
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.retrieval.source import FetchedBatch, FetchProgress
from kclpy_spark.spark.executor_reads import ExecutorReads, LeaseSource, NoAnswer
from kclpy_spark.stream_spec import StreamSpec

Item = FetchedBatch | BaseException | NoAnswer


class _Inbox:
    """What the read thread hands a relay, in order; consecutive lag reports collapse into the
    newest (their counts of records read added up), so it holds a few items however long the
    consumer is busy."""

    def __init__(self) -> None:
        self._items: deque[Item] = deque()
        self._ready = asyncio.Event()

    def put(self, item: Item) -> None:
        last = self._items[-1] if self._items else None
        if isinstance(item, NoAnswer) and isinstance(last, NoAnswer):
            self._items[-1] = last.plus(item)
        elif _lag_only(item) and last is not None and _lag_only(last):
            assert isinstance(item, FetchedBatch) and isinstance(last, FetchedBatch)
            if last.elsewhere is not None:
                item = dataclasses.replace(item, elsewhere=last.elsewhere.plus(item.elsewhere))
            self._items[-1] = item
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> Item:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()


def _lag_only(item: Item) -> bool:
    return isinstance(item, FetchedBatch) and not item.shard_ended and not item.announce


class LeaseRelay:
    def __init__(
        self,
        reads: ExecutorReads,
        source: LeaseSource,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> None:
        self._reads = reads
        self._source = source
        self._queue = queue
        self._progress = progress

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        inbox = _Inbox()

        def post(item: Item) -> None:  # from the read thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(inbox.put, item)

        entry = self._reads.register(self._source, post)
        unanswered = False
        try:
            await self._progress.put(self._queue, FetchedBatch([], None, announce=True))
            while True:
                # Waiting on the reads is not a stalled source (the batcher decides when), unless
                # the last read got no answer: then the silence is the service's.
                self._progress.waiting = not unanswered
                item = await inbox.get()
                self._progress.waiting = False
                if isinstance(item, NoAnswer):
                    unanswered = True
                    for _ in range(item.throttled):
                        self._progress.failed(True)  # counted in the shard's read_throttled
                    if not item.throttled:
                        self._progress.failed(False)
                    continue
                unanswered = False
                if isinstance(item, BaseException):
                    self._progress.failed(False)
                    raise item
                for _ in range(item.elsewhere.throttled if item.elsewhere else 0):
                    self._progress.failed(True)  # counted in the shard's read_throttled
                await self._progress.put(self._queue, item)
                if item.shard_ended:
                    break
            # The shard's end was read. The lease stays registered until its consumer, its
            # shard-end step done, cancels this: a piece whose rows were lost with an executor
            # meanwhile is read again (pinned) for it. What those reads say is not the consumer's
            # to hear (a failure parks the lane: ``ExecutorReads._failed``).
            self._progress.waiting = True
            while True:
                await inbox.get()
        finally:
            self._reads.unregister(entry)


class ExecutorSources:
    """The relays of one stream's leases (a ``SourceFactory``)."""

    def __init__(self, reads: ExecutorReads, spec: StreamSpec, stream_key: str | None) -> None:
        self._reads = reads
        self._spec = spec
        self._stream_key = stream_key

    def __call__(
        self,
        shard_id: str,
        start: ExtendedSequenceNumber,
        position: InitialPosition,
        hash_range: HashKeyRange | None,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> LeaseRelay:
        lease_key = lease_key_of(self._stream_key, shard_id)
        spec = self._spec
        stream = stream_name_of(lease_key) or spec.stream_name or spec.label
        when = position.timestamp
        source = LeaseSource(
            lease_key,
            stream,
            spec.request,
            shard_id,
            start,
            timestamp=when.timestamp() if when is not None else None,
            hash_range=(hash_range.start, hash_range.end) if hash_range is not None else None,
        )
        return LeaseRelay(self._reads, source, queue, progress)
