"""One shard's consumer: wait on parents, check retention, create and initialize the processor,
process, then shard end, lease loss, shutdown or parking. Runs as an asyncio task; a plain
processor method runs in a thread, an ``async def`` one on the loop.

Nothing fails silently, and no failure is retried forever: every step that can fail over and over
(creating the processor, ``initialize``, reading the shard, checking retention, a
``process_records`` batch, the shard-end step and ``shard_ended``) spends one budget
(budget.py), and when it is spent the lease is parked with the reason and redelivered from its
last checkpoint when it reopens; a failure outside those steps (a bug) parks it at once, after
logging its traceback. Waiting is not failing: parents reaching SHARD_END and a merge child's other
parent getting its lease are waited for as long as they take. Records are never skipped: a read
restarted before its first batch was delivered starts where the first read started. Whatever ends
the tenure, the processor hears of it (``lease_lost`` or ``shutdown_requested``), the log says
why, and the lease table shows it.

The consumer's ports: the lease table and holder, a ``ProcessorFactory``, a ``SourceFactory``
(where records come from), a ``ShardProbe`` and an injected clock and sleep, so its paths are
tested in the pure tier with fakes (tests/unit/runtime/test_consumer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable
from typing import Any, TypeVar

from checkpoint.base.clock import AsyncSleep, Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.counters import CoordinationCounters
from checkpoint.leasing.held_lease import HeldLease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.port import LeaseTable
from checkpoint.sequence import (
    LATEST,
    ExtendedSequenceNumber,
    InitialPosition,
)
from kclpy_spark.config import WorkerConfig
from kclpy_spark.logs import set_shard
from kclpy_spark.processor import (
    IdleAware,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    Record,
    RecordProcessor,
    RedeliverFromCheckpoint,
    ShutdownRequestedInput,
)
from kclpy_spark.retrieval.source import (
    FetchedBatch,
    FetchProgress,
    ReadElsewhere,
    ShardProbe,
    SourceFactory,
    SourceOutage,
)
from kclpy_spark.runtime.before_read import PendingStarts, check_retention, parents_ended
from kclpy_spark.runtime.budget import FailureBudget
from kclpy_spark.runtime.caught_up import CaughtUp
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.resume import ReadStart
from kclpy_spark.runtime.shard_end import ShardEnd, finish_shard
from kclpy_spark.runtime.tenure import (
    LeaseLost,
    Outcome,
    Parked,
    ShardStats,
    ShutdownSignal,
    Tenure,
    call_processor,
    exited,
)

__all__ = ["Outcome", "ProcessorFactory", "ShardConsumer", "ShardStats"]

log = logging.getLogger(__name__)

LOST_WHY = "another worker took it, or it was not renewed within the lease duration"

T = TypeVar("T")
ProcessorFactory = Callable[[], RecordProcessor]


class ShardConsumer:
    def __init__(
        self,
        *,
        held: HeldLease,
        holder: LeaseHolder,
        table: LeaseTable,
        processors: ProcessorFactory,
        sources: SourceFactory,
        probe: ShardProbe,
        cfg: WorkerConfig,
        clock: Clock,
        sleep: AsyncSleep = asyncio.sleep,
        rng: random.Random | None = None,
        metrics: WorkerMetrics | None = None,
        initial_position: InitialPosition | None = None,
        caught_up: CaughtUp | None = None,
    ) -> None:
        self._metrics = metrics or WorkerMetrics(CoordinationCounters())
        self._caught_up = caught_up  # until_caught_up: the job's tracker
        self.tenure = Tenure(
            held,
            holder,
            table,
            sleep=sleep,
            clock=clock,
            on_checkpoint=self._metrics.checkpoint_seconds.observe,
            on_event=self._metrics.events.add,
        )
        self._processors = processors
        self._processor: RecordProcessor | None = None
        self._sources = sources
        self._probe = probe
        self._cfg = cfg
        self._clock = clock
        self.lease_key = held.lease_key
        self._shard_labels = self._metrics.shard(held.lease_key)  # (stream, shard) of its series
        self.stats = ShardStats(held.lease.shard_id)
        self.call_thread: asyncio.Future[Any] | None = None  # the last processor call's thread
        throttled = self._metrics.read_throttled.labels(*self._shard_labels)
        self.progress = FetchProgress(clock.monotonic, on_throttled=throttled.inc)
        configured = initial_position or cfg.initial_position
        lease = held.lease
        self._start = ReadStart(lease.shard_id, lease.checkpoint, lease.start_timestamp, configured)
        # After a rewind (RedeliverFromCheckpoint): the records up to where delivery failed come
        # again, and their success is no progress: the failure count goes on until past them
        # (a batch that kills a MultiLang child every time parks its lease, as before).
        self._rewound_past: ExtendedSequenceNumber | None = None
        self.budget = FailureBudget(
            self.tenure,
            self.stats,
            limit=cfg.max_processing_attempts,
            park_duration=cfg.park_duration,
            backoff=Backoff(rng or random.Random(), base=0.5, cap=30.0),
            monotonic=clock.monotonic,
            metrics=self._metrics,
            label=held.lease_key,
        )

    # --- signals from the worker -----------------------------------------------------------------

    @property
    def held_lease(self) -> Any:
        return self.tenure.lease

    @property
    def token(self) -> Any:
        """The concurrency token of this tenure."""
        return self.tenure.held.token

    @property
    def checkpointer(self) -> Any:
        return self.tenure.checkpointer

    @property
    def finishing(self) -> bool:
        return self.tenure.finishing

    def lease_lost(self) -> None:
        self.tenure.lost.set()

    def request_shutdown(self) -> None:
        self.tenure.shutdown.set()

    # --- the state machine -----------------------------------------------------------------------

    async def run(self) -> Outcome:
        set_shard(self.stats.shard_id)  # this task's log lines (and its threads') name the shard
        try:
            outcome = await self._lifecycle()
        except LeaseLost:
            outcome = Outcome.LEASE_LOST
        except ShutdownSignal:
            outcome = Outcome.SHUTDOWN
        except Parked:
            outcome = Outcome.PARKED
        except Exception as exc:  # a bug: never a silent end of a lease
            log.exception("shard %s: the shard consumer failed unexpectedly", self.stats.shard_id)
            await self.budget.park(f"the consumer failed: {exc!r}")
            outcome = Outcome.PARKED
        return await self._finish(outcome)

    async def after_cancel(self) -> None:
        """Cancelled (a stop's or suspend's grace ran out, its call returned since): the
        processor never heard of it; ``lease_lost`` now, so it lets go of what it holds (a
        MultiLang child and its pipes, a Spark sink's lane and the reads it keeps)."""
        if self._processor is not None:
            await self._safe(self._processor.lease_lost, LeaseLostInput(), "lease_lost")

    async def _lifecycle(self) -> Outcome:
        self.stats.state = "waiting_on_parents"
        await parents_ended(self.tenure, self._cfg.parent_shard_poll_interval)
        starts = self._processors if isinstance(self._processors, PendingStarts) else None
        aged = functools.partial(
            check_retention, self.tenure, self._probe, self._cfg.aged_checkpoint_policy,
            self.budget, self._start, starts,
        )  # fmt: skip
        await self.budget.retrying("checking the checkpoint against the retention", aged)
        self.stats.state = "initializing"
        processor = await self.budget.retrying("creating the processor", self._create_processor)
        checkpoint = self.tenure.lease.checkpoint
        init = InitializeInput(
            self.stats.shard_id, checkpoint.sequence_number, checkpoint.sub_sequence_number
        )
        await self.budget.retrying("initialize", lambda: self._initialize(processor, init))
        self.stats.state = "processing"
        log.info("shard %s: processing from checkpoint %s", self.stats.shard_id, checkpoint)
        return await self._process(processor)

    async def _initialize(self, processor: RecordProcessor, init: InitializeInput) -> None:
        """``initialize``. Nothing is delivered yet, so a processor that says it lost what it
        held has lost nothing: an ordinary failure, counted and tried again (it reached the
        consumer's last resort, which parked the lease at once)."""
        try:
            await self._call(processor.initialize, init)
        except RedeliverFromCheckpoint as exc:
            raise RuntimeError(f"initialize: {exc}") from exc

    async def _finish(self, outcome: Outcome) -> Outcome:
        processor = self._processor
        if outcome is Outcome.LEASE_LOST:  # parkings and releases tell the log themselves
            self._metrics.events.add(self.tenure.lease_key, "lost", LOST_WHY)
        if outcome in (Outcome.LEASE_LOST, Outcome.PARKED, Outcome.RELEASED):
            self.stats.state = outcome.value
            log.info("shard %s: %s; telling the processor", self.stats.shard_id, outcome.value)
            if processor is not None:
                await self._safe(processor.lease_lost, LeaseLostInput(), "lease_lost")
        elif outcome is Outcome.CAUGHT_UP and self._caught_up is not None:
            await self._caught_up.conclude(self.tenure, processor, self._safe)
        if outcome is Outcome.PARKED and self._caught_up is not None:  # a job ends with it
            self._caught_up.finished(self.lease_key, f"parked: {self.stats.park_reason}")
        elif outcome is Outcome.SHUTDOWN:
            self.stats.state = "shutting_down"
            if processor is not None:
                arg = ShutdownRequestedInput(self.tenure.checkpointer)
                await self._safe(processor.shutdown_requested, arg, "shutdown_requested")
                # Then the lease goes, as the KCL tells a processor after shutdownRequested.
                await self._safe(processor.lease_lost, LeaseLostInput(), "lease_lost")
        self.stats.state = outcome.value
        return outcome

    async def _call(self, method: Callable[[Any], Any], arg: object) -> None:
        """A processor call, timed in ``stats.call_started`` while it runs (a call that never
        returns makes the worker not ready: health.py)."""
        self.stats.call_started = self._clock.monotonic()
        try:
            await call_processor(method, arg, self._on_thread)
        finally:
            self.stats.call_started = None

    def _on_thread(self, future: asyncio.Future[Any]) -> None:
        self.call_thread = future

    def call_running(self) -> asyncio.Future[Any] | None:
        """The thread of a processor call that is still running (this consumer's task having
        been cancelled during it): no other consumer of the lease may start before it ends."""
        thread = self.call_thread
        return thread if thread is not None and not thread.done() else None

    async def _safe(self, method: Callable[[Any], Any], arg: object, name: str) -> None:
        """A call whose failure is only logged (lease_lost, shutdown_requested); timed as every
        call is, so one that never returns shows as hung instead of a consumer still running."""
        try:
            await self._call(method, arg)
        except Exception:
            log.exception("shard %s: the processor's %s raised", self.stats.shard_id, name)

    # --- steps -----------------------------------------------------------------------------------

    async def _create_processor(self) -> RecordProcessor:
        """The lease's processor, made on a processor thread as its other calls are: an
        ``__init__`` that opens a connection to a host that does not answer held the event loop,
        and with it every lease's renewal."""
        if self._processor is None:
            made: list[RecordProcessor] = []

            def make(_: object) -> None:
                try:
                    made.append(self._processors())
                except SystemExit as exc:  # sys.exit() in __init__: a failure, not the end
                    raise exited(self._processors, exc) from exc

            await self._call(make, None)
            self._processor = made[0]
        return self._processor

    async def _process(self, processor: RecordProcessor) -> Outcome:
        """Read and deliver until shard end, loss or shutdown; a source that gives up counts as a
        failure and is started again from the last record delivered."""
        while True:
            try:
                return await self._read(processor)
            except (LeaseLost, ShutdownSignal, Parked):
                raise
            except RedeliverFromCheckpoint as exc:
                # Rewound before the backoff: a shutdown during it hands shutdown_requested a
                # checkpointer whose checkpoint() would otherwise record what was lost.
                self._rewind()
                await self.budget.failed("the processor", exc)
            except KclpySparkError as exc:
                if isinstance(exc, SourceOutage):  # not counted; the source backs off
                    log.warning("shard %s: reading failed, retrying: %s", self.stats.shard_id, exc)
                    continue
                self.budget.answered_since(self.progress.last_ok)
                await self.budget.failed("reading the shard", exc)

    def _rewind(self) -> None:
        """Deliver again from the lease's checkpoint: the processor lost what came after it."""
        if self._rewound_past is None:  # lost at the shard end: all that was delivered
            self._rewound_past = self._start.checkpoint
        checkpointer = self.tenure.checkpointer
        checkpoint = checkpointer.written or self.tenure.lease.checkpoint
        checkpointer.rewind(checkpoint)
        self._start.rewound(checkpoint)
        log.warning("shard %s: delivering again from the checkpoint %s", self.stats.shard_id,
                    checkpoint)  # fmt: skip

    async def _read(self, processor: RecordProcessor) -> Outcome:
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue(maxsize=self._cfg.prefetch_batches)
        lease = self.tenure.lease
        since = self._start.begin(self._clock.wall())
        if since is not None:  # a first read at LATEST: store where it begins (resume.py)
            pin = functools.partial(self.tenure.pin_start, since)
            await self.budget.retrying("recording where the LATEST read starts", pin)
            self._start.source_made(self._clock.wall())
        source = self._sources(
            self.stats.shard_id, self._start.checkpoint, self._start.position,
            lease.hash_key_range, queue,
            self.progress,
        )  # fmt: skip
        if self.progress.last_ok is None:  # silent from here: not the wait for the parents
            self.progress.started = self._clock.monotonic()
        fetch = asyncio.create_task(source.run(), name=f"fetch-{self.stats.shard_id}")
        try:
            while True:
                batch = await self.tenure.wait_or_stop(self._next(queue, fetch))
                if batch.elsewhere is not None:  # a read on the executors that succeeded
                    self._count_elsewhere(batch.elsewhere)
                    self.budget.succeeded()
                if batch.records and self._start.checkpoint == LATEST:  # a first LATEST read
                    await self._pin_earlier(batch.records[0].timestamp_millis)
                if batch.records or batch.announce:
                    await self._deliver(processor, batch)
                elif batch.millis_behind_latest is not None:  # an empty read
                    self._lag(batch.millis_behind_latest)
                    if not batch.shard_ended:
                        await self._no_records(processor, batch.millis_behind_latest)
                if batch.shard_ended:
                    return await self._shard_end(processor, batch)
                if self._caught_up is not None and self._caught_up.reached(batch):
                    return Outcome.CAUGHT_UP
                if self.tenure.lost.is_set():
                    raise LeaseLost()
                if self.tenure.shutdown.is_set():
                    return Outcome.SHUTDOWN
        finally:
            fetch.cancel()
            await asyncio.gather(fetch, return_exceptions=True)

    async def _pin_earlier(self, first_millis: int) -> None:
        """Before the first records of a pinned LATEST read are delivered: pinned later than
        their arrival (a clock ahead of Kinesis's), the lease is pinned at it instead."""
        since = self._start.arrived(first_millis)
        if since is not None:
            pin = functools.partial(self.tenure.pin_start, since)
            await self.budget.retrying("recording where the LATEST read starts", pin)

    @staticmethod
    async def _next(queue: asyncio.Queue[FetchedBatch], fetch: asyncio.Task[None]) -> FetchedBatch:
        """The next batch; raises what stopped the source if it stopped first."""
        getter = asyncio.ensure_future(queue.get())
        try:
            done, _ = await asyncio.wait({getter, fetch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():  # stopped or cancelled: no getter task left behind
                getter.cancel()
        if getter in done:
            return getter.result()
        fetch.result()  # raises what stopped the fetcher
        raise KclpySparkError("the record source stopped before the shard ended")

    async def _deliver(self, processor: RecordProcessor, batch: FetchedBatch) -> None:
        """Offer the batch until the processor takes it (each failure counts; parks at last)."""
        checkpointer = self.tenure.checkpointer
        if not batch.records:  # an announcement: the processor meets the checkpointer
            arg = ProcessRecordsInput([], 0, checkpointer)
            await self.budget.retrying(
                "process_records",
                lambda: self._call(processor.process_records, arg),
                progress=False,  # not an answer from the shard: failed reads go on counting
            )
            return
        last = batch.records[-1]
        end = ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)
        # A batch whose process_records raised was not processed: until it succeeds, "the last
        # record delivered" (what checkpoint() with no argument records, e.g. in
        # shutdown_requested) stays at the end of the previous batch.
        before = checkpointer.largest_permitted
        records = batch.records
        while True:
            arg = ProcessRecordsInput(records, batch.millis_behind_latest or 0, checkpointer)
            sequence_numbers = [r.sequence_number for r in records]
            # Checked before every delivery, not only when the renewer reports: a checkpoint that
            # lost its conditional write drops the lease at once.
            self.tenure.current()
            checkpointer.set_largest_permitted(end, sequence_numbers)
            started = self._clock.monotonic()
            try:
                await self._call(processor.process_records, arg)
                self._metrics.process_seconds.observe(self._clock.monotonic() - started)
                break
            except RedeliverFromCheckpoint:
                past = self._rewound_past
                self._rewound_past = end if past is None else max(past, end)
                raise  # counted, and read again from the checkpoint (_process)
            except Exception as exc:
                checkpointer.set_largest_permitted(before)
                first, final = records[0].sequence_number, last.sequence_number
                await self.budget.failed("process_records", exc, f" on records {first}..{final}")
                # Offered again from after what it checkpointed before it failed (the KCL never
                # delivers a checkpointed record again within a tenure).
                records = _after(records, checkpointer.written)
                if not records:
                    break
        if self._rewound_past is None or end > self._rewound_past:
            self._rewound_past = None
            self.budget.succeeded()
        self._start.delivered(end)
        self._count(batch)

    async def _no_records(self, processor: RecordProcessor, lag: int) -> None:
        """After a read with no records: ``process_records`` with none for a processor that asks
        for it (the KCL's callProcessRecordsEvenForEmptyRecordList), else ``no_records`` for an
        IdleAware one. What it raises counts as a failure (nothing is offered again)."""
        if getattr(processor, "call_process_records_even_for_empty_record_list", False) is True:
            what = "process_records"
            arg = ProcessRecordsInput([], lag, self.tenure.checkpointer)
            call = functools.partial(self._call, processor.process_records, arg)
        elif isinstance(processor, IdleAware):
            what, call = "no_records", functools.partial(self._idle, processor)
        else:
            return
        self.tenure.current()  # as before a delivery: not called for a lease lost meanwhile
        try:
            await call()
        except RedeliverFromCheckpoint:
            raise  # read again from the checkpoint (_process): it lost what it held
        except Exception as exc:
            await self.budget.failed(what, exc, " (after a read with no new records)")
        else:  # its own failures count in a row: rare ones never add up
            self.budget.succeeded_at(what)

    async def _idle(self, processor: IdleAware) -> None:
        await self._call(lambda _: processor.no_records(), None)

    def _count(self, batch: FetchedBatch) -> None:
        label = self._shard_labels
        size = sum(r.data_size for r in batch.records)
        self.stats.records += len(batch.records)
        self.stats.batches += 1
        self.stats.bytes += size
        self.stats.last_delivered = batch.records[-1].sequence_number
        self._metrics.records.labels(*label).inc(len(batch.records))
        self._metrics.bytes.labels(*label).inc(size)
        if batch.millis_behind_latest is not None:
            self._lag(batch.millis_behind_latest)

    def _count_elsewhere(self, read: ReadElsewhere) -> None:
        """Records read on Spark's executors for this lease (given to its sink there)."""
        if read.rows:
            self.stats.records += read.rows
            self.stats.bytes += read.nbytes
            self.stats.batches += 1
            self.stats.last_delivered = read.last_sequence or self.stats.last_delivered
            self._metrics.records.labels(*self._shard_labels).inc(read.rows)
            self._metrics.bytes.labels(*self._shard_labels).inc(read.nbytes)
        if read.out_of_range:  # the executor's own line goes to its log, not this process's
            self._metrics.kpl_out_of_range.labels(*self._shard_labels).inc(read.out_of_range)
            log.warning(
                "shard %s: %d KPL sub-record(s) read on the executors were skipped with their "
                "aggregates, which held one outside the shard's hash range, as the KCL skips "
                "them (each aggregate's line is in the executors' logs; counted in "
                "kclpy_spark_kpl_subrecords_out_of_range)",
                self.stats.shard_id, read.out_of_range,
            )  # fmt: skip

    def lag_unknown(self) -> None:
        """Reads have been silent past the stall time (failing, throttled): the last lag no
        longer says where the shard is, and an alert on it would not fire; its series goes, and
        comes back with the next answer."""
        if self.stats.millis_behind_latest is None:
            return
        self.stats.millis_behind_latest = None
        with contextlib.suppress(KeyError):
            self._metrics.behind.remove(*self._shard_labels)

    def _lag(self, millis_behind_latest: int) -> None:
        self.stats.millis_behind_latest = millis_behind_latest
        self._metrics.behind.labels(*self._shard_labels).set(millis_behind_latest / 1000)

    async def _shard_end(self, processor: RecordProcessor, batch: FetchedBatch) -> Outcome:
        self.stats.state = "shard_end"
        done = await finish_shard(
            self.tenure,
            processor,
            batch,
            self._probe,
            poll_interval=self._cfg.parent_shard_poll_interval,
            budget=self.budget,
            call=self._call,
        )
        return Outcome.SHARD_END if done is ShardEnd.DONE else Outcome.RELEASED


def _after(records: list[Record], position: ExtendedSequenceNumber | None) -> list[Record]:
    """The records past ``position`` (all of them when None)."""
    if position is None:
        return records
    return [
        r for r in records
        if position < ExtendedSequenceNumber(r.sequence_number, r.sub_sequence_number)
    ]  # fmt: skip
