"""A ``kinesis-kcl`` query as a KCL worker of its application (``leaseStore`` set).

The driver side of the source (one Python process per query, alive while the query runs) runs
the daemon's own ``Worker`` on a thread of its own: shard sync when it leads, lease taking and
balancing, renewals, graceful hand-off, status records, all as the daemon does them. Only where
records go differs: each held lease's consumer gets a ``QueryRelay`` as its record source, which
reads nothing. It announces the lease to ``HeldLeases`` (so the planner may read the shard on the
executors) and waits; the planner acknowledges completed batches through the lease's own
checkpointer (fenced by the lease, as any checkpoint), and hands an ended shard's end to the
relay, so the consumer runs the KCL's shard end (children's leases, SHARD_END, release).

The consumer still decides when a lease may be read: after its parents reached SHARD_END.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from checkpoint.base.errors import KclpySparkError
from checkpoint.base.threads import RetiringThreadPool
from checkpoint.lease import HashKeyRange
from checkpoint.sequence import (
    AT_TIMESTAMP,
    LATEST,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
)
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor, ShardEndedInput
from kclpy_spark.readstream.leased import Ack, HeldShard
from kclpy_spark.readstream.offsets import Start
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN, no_time_of_its_own
from kclpy_spark.retrieval.source import FetchedBatch, FetchProgress

log = logging.getLogger(__name__)

ESN = ExtendedSequenceNumber
START_SECONDS = 60.0  # the worker's start (its table checked, its stream found) may take this


@dataclass
class _Entry:
    shard: HeldShard
    post: Callable[[FetchedBatch], None]  # to the relay's consumer, from any thread
    checkpointer: Any = None  # the lease's, once the consumer announced it
    ending: bool = False  # the shard's end was handed to the consumer


@dataclass
class HeldLeases:
    """The leases this query's worker holds and reads, by shard (thread-safe)."""

    _by_shard: dict[str, _Entry] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self._lock)

    def register(self, entry: _Entry) -> None:
        with self._lock:
            self._by_shard[entry.shard.shard_id] = entry
            self.changed.notify_all()

    def unregister(self, entry: _Entry) -> None:
        with self._lock:
            if self._by_shard.get(entry.shard.shard_id) is entry:
                del self._by_shard[entry.shard.shard_id]
            self.changed.notify_all()

    def announce(self, shard_id: str, checkpointer: Any) -> None:
        with self._lock:
            entry = self._by_shard.get(shard_id)
            if entry is not None:
                entry.checkpointer = checkpointer
            self.changed.notify_all()

    def readable(self) -> dict[str, HeldShard]:
        """The shards announced (their consumers read), without those handed their end (their
        relays end at once; their consumers go on with the shard's end)."""
        with self._lock:
            return {
                sid: e.shard
                for sid, e in self._by_shard.items()
                if e.checkpointer is not None and not e.ending
            }

    def entry(self, shard_id: str) -> _Entry | None:
        with self._lock:
            return self._by_shard.get(shard_id)

    def wait(self, until: Callable[[], bool], seconds: float) -> bool:
        """Wait up to ``seconds`` for ``until()`` (checked at every change and every 0.5 s)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while True:
                self._lock.release()
                try:
                    if until():
                        return True
                finally:
                    self._lock.acquire()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 0.5))


def start_of(checkpoint: ESN, position: InitialPosition, wall: float) -> Start:
    """A consumer's start (the lease's checkpoint, and its position for a sentinel) as a
    planned ``Start``; LATEST becomes the moment the consumer began, as the consumer pins it."""
    if not checkpoint.is_sentinel:
        return Start(checkpoint)
    if checkpoint == TRIM_HORIZON:
        return Start()
    if checkpoint == AT_TIMESTAMP:  # without a time: as the daemon, never "now" (skipping)
        if position.timestamp is None:
            raise no_time_of_its_own()
        return Start(AT_TIMESTAMP, int(position.timestamp.timestamp() * 1000))
    assert checkpoint == LATEST
    # The consumer pinned ``wall - margin`` (a moment earlier) in the lease: twice the margin is
    # before that, so records between the two may come twice, never be skipped.
    return Start(AT_TIMESTAMP, int((wall - 2 * LATEST_RESTART_MARGIN) * 1000))


class QueryRelay:
    """A held lease's record source: announces the lease, then waits for its end."""

    def __init__(
        self,
        leases: HeldLeases,
        shard: HeldShard,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> None:
        self._leases, self._shard, self._queue, self._progress = leases, shard, queue, progress

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Queue[FetchedBatch] = asyncio.Queue()

        def post(item: FetchedBatch) -> None:  # from the planner's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                loop.call_soon_threadsafe(ended.put_nowait, item)

        entry = _Entry(self._shard, post)
        self._leases.register(entry)
        try:
            await self._progress.put(self._queue, FetchedBatch([], None, announce=True))
            self._progress.waiting = True  # Spark reads the records: waiting is not stalling
            item = await ended.get()
            self._progress.waiting = False
            await self._progress.put(self._queue, item)
        finally:
            self._leases.unregister(entry)


class QuerySources:
    """The relays of the query's stream (the worker's ``record_sources``)."""

    def __init__(self, leases: HeldLeases, worker_id: str) -> None:
        self._leases, self._worker_id = leases, worker_id

    def relay(
        self,
        shard_id: str,
        start: ESN,
        position: InitialPosition,
        hash_range: HashKeyRange | None,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> QueryRelay:
        tenure = f"{self._worker_id}#{uuid.uuid4().hex[:12]}"
        hashes = None if hash_range is None else (hash_range.start, hash_range.end)
        shard = HeldShard(shard_id, tenure, start_of(start, position, time.time()), hashes)
        return QueryRelay(self._leases, shard, queue, progress)


class QueryProcessor(RecordProcessor):
    """A held lease's processor: meets the checkpointer, and checkpoints SHARD_END at the end
    (the planner acknowledged the shard's last records before handing over its end). It never
    checkpoints at shutdown: the last batch may not have completed."""

    def __init__(self, leases: HeldLeases) -> None:
        self._leases = leases
        self._shard_id = ""

    def initialize(self, initialize_input: Any) -> None:
        self._shard_id = initialize_input.shard_id

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        if not process_records_input.records:
            self._leases.announce(self._shard_id, process_records_input.checkpointer)

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        shard_ended_input.checkpointer.checkpoint()


def acknowledge(
    leases: HeldLeases, ack: Ack, children: Callable[[str], list[dict[str, Any]]] = lambda _: []
) -> bool:
    """Move the lease's checkpoint to the pin's last record, and for an ended shard hand the
    consumer its end (children: the pin's, else ``children(shard_id)``), which checkpoints
    SHARD_END. False when the lease's tenure is over (lost, handed off): the checkpoint stays
    where it was; the next owner reads those records again."""
    entry = leases.entry(ack.shard_id)
    if entry is None or entry.shard.tenure != ack.tenure or entry.checkpointer is None:
        return False
    checkpointer, pin = entry.checkpointer, ack.pin
    try:
        if pin.last is not None:  # the batch completed: its records are acknowledged first
            checkpointer.set_largest_permitted(pin.last, [pin.last.sequence_number])
            checkpointer.checkpoint(pin.last.sequence_number, pin.last.sub_sequence_number)
    except KclpySparkError as exc:  # the lease moved meanwhile: its next owner reads on
        log.info("shard %s: not acknowledged (%s)", ack.shard_id, exc)
        return False
    if ack.ended:
        hand_end(leases, ack.shard_id, [dict(c) for c in pin.children] or children(ack.shard_id))
    return True


# A batch's acknowledgments at a time (each a lease-table write: ~10 ms on DynamoDB, so a
# hundred shards one after another held the batch's commit a second).
ACK_THREADS = 8
_ACK_POOL = RetiringThreadPool(ACK_THREADS, "kclpy-spark-acks")  # idle threads end


def acknowledge_all(
    leases: HeldLeases,
    acks: Sequence[Ack],
    children: Callable[[str], list[dict[str, Any]]] = lambda _: [],
) -> list[bool]:
    """``acknowledge`` each of ``acks`` (each its own lease), up to ``ACK_THREADS`` at once."""
    if len(acks) <= 1:
        return [acknowledge(leases, ack, children) for ack in acks]
    return list(_ACK_POOL.map(lambda ack: acknowledge(leases, ack, children), acks))


def hand_end(leases: HeldLeases, shard_id: str, children: list[dict[str, Any]]) -> bool:
    """Tell the consumer of ``shard_id`` that its shard ended (every record acknowledged), with
    its children: it creates their leases and checkpoints SHARD_END. Not without children (a
    listing that does not show them yet): SHARD_END went in with no child leased, and the
    children waited for the sync's audit; a later batch hands the end (``ends_to_hand``)."""
    entry = leases.entry(shard_id)
    if entry is None or entry.checkpointer is None or entry.ending:
        return False
    if not children:
        log.debug("kinesis-kcl: shard %s ended; its children are not listed yet", shard_id)
        return False
    with leases.changed:
        entry.ending = True
    entry.post(FetchedBatch([], 0, shard_ended=True, child_shards=children))
    return True


class QueryWorker:
    """The query's worker on a thread of its own; ``stop()`` hands its leases over."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.leases = HeldLeases()
        self._sources = QuerySources(self.leases, cfg.worker_id)
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._worker: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.error: BaseException | None = None
        # Given up on (start timed out, or stop came first): a worker that starts late stops
        # at once instead of holding leases nobody reads.
        self._given_up = False
        self._lock = threading.Lock()

    @property
    def worker_id(self) -> str:
        return str(self.cfg.worker_id)

    @property
    def store(self) -> Any:
        return self._worker.store

    def start(self) -> None:
        """Start the worker; raises what stopped it from starting (a missing stream, no table)."""
        thread = threading.Thread(target=self._main, name="kinesis-kcl-worker", daemon=True)
        thread.start()
        self._thread = thread  # once started: a stop meanwhile may join it
        self._started.wait(START_SECONDS)
        with self._lock:
            error, stopped = self.error, self._given_up
            self._given_up = stopped or self._worker is None
        if error is not None:
            raise error
        if stopped:
            raise KclpySparkError("kinesis-kcl: the lease worker was stopped while it started")
        if self._given_up:
            raise KclpySparkError(
                f"kinesis-kcl: the lease worker did not start in {START_SECONDS:.0f}s"
            )

    def _main(self) -> None:
        from kclpy_spark.runtime.daemon import run_worker

        async def started(worker: Any) -> None:
            with self._lock:
                self._worker, self._loop = worker, asyncio.get_running_loop()
                given_up = self._given_up
            self._started.set()
            if given_up:
                worker.request_shutdown()

        def processors() -> RecordProcessor:
            return QueryProcessor(self.leases)

        try:
            asyncio.run(run_worker(self.cfg, processors, on_started=started,
                                   install_signal_handlers=False, patient_start=False,
                                   record_sources=self._relays))  # fmt: skip
        except BaseException as exc:  # told to the planner; the thread ends
            self.error = exc
            log.error("kinesis-kcl: the lease worker stopped: %s", exc)
        finally:
            self._started.set()

    def _relays(self, spec: Any, stream_key: str | None) -> Any:
        return self._sources.relay

    def running(self) -> bool:
        alive = self._thread is not None and self._thread.is_alive()
        return alive and self._worker is not None and not self._given_up and self.error is None

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._given_up = True  # one that has not started yet stops when it does
            worker, loop = self._worker, self._loop
        if loop is not None and worker is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(worker.request_shutdown)
        if self._thread is not None:
            self._thread.join(timeout)
