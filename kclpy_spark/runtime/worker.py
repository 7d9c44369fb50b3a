"""The worker: renews and takes leases, leads shard sync when elected, runs one ShardConsumer per
held lease (``ConsumerSet``), watches its streams (``StreamSet``) and its own health, and shuts
down gracefully.

Lease-table calls are synchronous (boto3, sqlite3). The worker's own ones (renewal rounds, taking,
control, leadership, shard sync) run on a small executor of their own, so processor calls that
block in their threads (a slow process_records, a Spark sink applying backpressure) can never
delay a renewal (an ``async def`` processor method runs on the event loop, which schedules the
rounds: one that blocks the loop delays them, and is logged and counted, ``loop_watch``);
each lease is then renewed on the holder's renewal pool against its own deadline. Kinesis reads
are asyncio (aiobotocore). Lease expiry is judged only by this process's monotonic clock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections.abc import Callable, Sized
from typing import Any, TypeVar

from checkpoint import coordination
from checkpoint.base.clock import AsyncSleep, Clock, SystemClock
from checkpoint.base.errors import CorruptLeaseError, KclpySparkError
from checkpoint.base.threads import RetiringThreadPool
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from kclpy_spark.board.feed import WorkerBoard
from kclpy_spark.config import WorkerConfig
from kclpy_spark.logs import set_application
from kclpy_spark.moves.assigning import leader_election, lease_timing
from kclpy_spark.moves.lease_worker import Placement
from kclpy_spark.moves.reports import TakeReports
from kclpy_spark.moves.stopping import (
    StoppedReleases,
    announce_stopping,
    let_new_owners_see,
    release_all,
    runs_no_more,
)
from kclpy_spark.moves.taking import Taker
from kclpy_spark.processor import ReportsReadiness
from kclpy_spark.runtime import publish
from kclpy_spark.runtime.caught_up import CaughtUp
from kclpy_spark.runtime.consumer import ProcessorFactory, ShardStats
from kclpy_spark.runtime.consumer_set import ConsumerSet
from kclpy_spark.runtime.cpu import CpuMeter
from kclpy_spark.runtime.events import EventLog
from kclpy_spark.runtime.health import Health
from kclpy_spark.runtime.identity import unique_worker_id
from kclpy_spark.runtime.lease_calls import run_on
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.runtime.loop_watch import watch_the_loop
from kclpy_spark.runtime.metrics import StatusServer, worker_metrics
from kclpy_spark.runtime.run_state import RunState
from kclpy_spark.runtime.streams import RecordSourcesFor, StreamContext, StreamSet
from kclpy_spark.stream_spec import StreamSpec
from shard_sync.syncer import LeadershipLapsed

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["ProcessorFactory", "Worker"]


def _count(items: Callable[[], Sized]) -> int:
    """``len(items())``: a gauge counted at every scrape, holding no reference to the worker."""
    return len(items())


class Worker:
    """One worker of an application. ``run()`` returns after ``request_shutdown()`` (or, with
    ``exit_reason`` set, when a dependency has been gone for too long)."""

    _measured_at = float("-inf")  # monotonic: the consumers' last throughput measure

    def __init__(
        self,
        cfg: WorkerConfig,
        processor_factory: ProcessorFactory,
        *,
        store: LeaseStore,
        kinesis_sync: Any,
        kinesis_async: Any,
        clock: Clock | None = None,
        sleep: AsyncSleep = asyncio.sleep,
        rng: random.Random | None = None,
        stream_tracker: Callable[[], tuple[StreamSpec, ...]] | None = None,
        record_sources: RecordSourcesFor | None = None,
    ) -> None:
        self.cfg = cfg
        self.sleep = sleep  # every wait of the worker's loops (the injected sleep)
        self.store = store
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.timing = lease_timing(cfg)
        self.counters = CoordinationCounters()
        self.events = EventLog(cfg.worker_id, self.clock.wall)
        self.caught_up = CaughtUp(self.clock.wall()) if cfg.until_caught_up else None  # a job's
        self.metrics = worker_metrics(cfg, self.counters, processor_factory, store, self.events)
        self.cpu = CpuMeter(monotonic=self.clock.monotonic, wall=self.clock.wall)
        self.run_state = RunState(cfg.worker_id, self.clock.monotonic)  # suspended, stopping
        # Stopping: the handoffs of our leases have begun and complete when the consumers stop
        # (release_all), not at the next renewal, so the new owners can find them first.
        self.handing_out = False
        self.instance = uuid.uuid4().hex[:16]  # tells this process from another with the same id
        self.status_writer = coordination.StatusWriter(store, cfg.worker_id, self.instance,
                                                  3 * self.timing.lease_duration)  # fmt: skip
        self.status_cadence = publish.StatusCadence.of(self.timing)
        self.exit_reason: str | None = None
        self.status_server: StatusServer | None = None
        self.holder = LeaseHolder(
            store, cfg.worker_id, self.clock, self.timing.lease_duration,
            skip_checkpointed=cfg.skip_checkpointed_renewals, on_restored=self.metrics.restored,
            restorable=lambda lease: self.streams.shard_exists(lease),
        )  # fmt: skip
        self.metrics.leases_held.set_function(functools.partial(_count, self.holder.held))
        self.leader = leader_election(cfg, store, self.timing, self.clock)
        self.suspend_flag = coordination.SuspendFlag(store, self.clock, self.timing.lease_duration)
        self.health = Health(self.clock.monotonic, store_interval=self.timing.renew_interval,
                             missing_timeout=cfg.missing_dependency_timeout,
                             quiet_interval=self.timing.lease_duration,
                             table_name=cfg.application_name)  # fmt: skip
        self._take_now, self.started = asyncio.Event(), asyncio.Event()
        self.streams = self._stream_set(stream_tracker, kinesis_sync, kinesis_async, record_sources)
        self._processor_factory = processor_factory
        self.consumers = self._consumer_set(processor_factory, sleep)
        # Lease-table calls of the worker's own loops: never queued behind processor threads.
        self._lease_io = RetiringThreadPool(4, "kclpy-spark-lease")
        self._renew_io = RetiringThreadPool(1, "kclpy-spark-renew-round")
        self.taker = Taker(self, self._io)
        self._reporting()

    def _reporting(self) -> None:
        """The status page's snapshot and feed; what the lease loops report into and start."""
        self.latest_status = publish.LatestStatus()
        self.board = WorkerBoard(self.cfg, self.store, self.clock, self.timing, self._io,
                                 self.latest_status.get)  # fmt: skip
        self.reports = TakeReports(self.cfg.worker_id, self.health, self.events, self.metrics,
                                   self.counters, self.suspend_flag, self.board)  # fmt: skip
        self.placement = Placement(self.streams, self.consumers)  # where a lease taken goes

    def _consumer_set(self, processors: ProcessorFactory, sleep: AsyncSleep) -> ConsumerSet:
        return ConsumerSet(
            self.cfg, processors, holder=self.holder, table=self.store, clock=self.clock,
            sleep=sleep, rng=self.rng, metrics=self.metrics, counters=self.counters,
            on_shard_end=self._take_now.set, caught_up=self.caught_up,
            runs_no_more=self._runs_no_more,
        )  # fmt: skip

    async def _runs_no_more(self, worker: str) -> bool:
        return await runs_no_more(
            self.store, self._io, worker, self.clock.wall(), self.timing.status_max_age
        )

    def _stream_set(
        self, tracker: Callable[[], tuple[StreamSpec, ...]] | None, kinesis_sync: Any,
        kinesis_async: Any, record_sources: RecordSourcesFor | None,
    ) -> StreamSet:  # fmt: skip
        cfg = self.cfg
        return StreamSet(
            cfg, tracker or (lambda: cfg.stream_specs), table=self.store,
            kinesis_sync=kinesis_sync, kinesis_async=kinesis_async, counters=self.counters,
            clock=self.clock, rng=self.rng, on_out_of_range=self._out_of_range,
            record_sources=record_sources, still_leading=lambda: self.leader.is_leader,
        )  # fmt: skip

    def _out_of_range(self, lease_key: str, count: int) -> None:
        """From a page's deaggregation, maybe on a thread that outlived the lease's tenure: a
        late count would make its series again after the tenure removed it, for good."""
        if lease_key in self.consumers.running:  # not ended (a call draining counts as ended)
            self.metrics.kpl_out_of_range.labels(*self.metrics.shard(lease_key)).inc(count)

    # --- public ----------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        self.run_state.stop("asked")

    def shard_stats(self) -> list[ShardStats]:
        return self.consumers.stats()

    @property
    def finished(self) -> dict[str, ShardStats]:
        return self.consumers.finished

    @property
    def processor_factory(self) -> Any:
        """What makes this worker's processors (the Spark sink's factory, with a sink)."""
        return self._processor_factory

    def readiness(self) -> tuple[bool, str]:
        missing = list(self.streams.gone())
        ready, why = self.health.readiness(
            suspended=self.run_state.suspended, consumers=self.consumers.views(),
            missing_streams=missing, failing_syncs=self.streams.failing_syncs()
            if self.leader.is_leader and not self.run_state.suspended else (),
        )  # fmt: skip
        if ready and isinstance(self._processor_factory, ReportsReadiness):
            ready, why = self._processor_factory.readiness()
        return ready, why

    async def run(self) -> None:
        set_application(self.cfg.application_name, self.cfg.stream, self.cfg.worker_id)
        # The status page's first view, before the first control round.
        publish.publish_snapshot(self, self.latest_status, self.clock.wall())
        if self.cfg.metrics_port is not None:
            self.metrics.watch_readiness(self.readiness)
            self.status_server = StatusServer(
                self.metrics, self.readiness, self.cfg.metrics_host, self.cfg.metrics_port,
                board=self.board.snapshot, host_names=tuple(self.cfg.metrics_host_names.split(",")),
            )  # fmt: skip
            await self.status_server.start()
        try:
            await self._run()
        finally:
            if self.status_server is not None:
                await self.status_server.stop()
            self.holder.close()
            # Abandoned, not only shut down: the interpreter joins a pool's threads at exit, and
            # a call still in flight (a Kinesis control call: 30 s a try, four tries) kept the
            # stopped daemon alive for minutes, its stop signals no longer heard.
            self._lease_io.abandon(0.0)
            self._renew_io.abandon(0.0)
            self.streams.close()

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the lease executor, with this task's logging context."""
        return await run_on(self._lease_io, fn, *args)

    async def _run(self) -> None:
        await self.streams.refresh(first=True)
        log.info("worker %s starts on stream %s (application %s, lease store %s)",
                 self.cfg.worker_id, self.cfg.stream, self.cfg.application_name,
                 self.cfg.lease_store)  # fmt: skip
        await unique_worker_id(self, self._io)
        await self._control_round()
        await self._io(self.leader.tick)
        await self._maintenance_round()
        loops = [asyncio.create_task(self._loop(f, at, **kw)) for f, at, kw in self._periodic()]
        loops.insert(1, asyncio.create_task(self._take_loop()))
        loops.append(asyncio.create_task(watch_the_loop(
            self.clock, self.sleep, lease_duration=self.timing.lease_duration,
            on_stall=self.metrics.loop_stalls.inc, worker_id=self.cfg.worker_id,
        )))  # fmt: skip
        self.health.started = True
        self.started.set()
        try:
            await self.run_state.stopped()
        finally:
            began = self.clock.monotonic()  # the grace counts every step of the stop
            renewer = loops[0]
            for task in loops[1:]:
                task.cancel()
            await asyncio.gather(*loops[1:], return_exceptions=True)
            grace = self.cfg.shutdown_grace
            self.handing_out = True  # renewals leave the handoffs begun now to the stop below
            await announce_stopping(self, self._io)
            handed = await self.taker.hand_out()
            # The status write, the resign and the hand-offs' writes (each up to half a
            # failover time on a slow table) come out of the same grace.
            grace -= self.clock.monotonic() - began
            if handed:  # lease moves now wait for the processors' checkpoints
                grace -= await let_new_owners_see(self, grace)
            # Each lease is given back as its own consumer stops; renewals go on until then.
            early = StoppedReleases(self, self._io)
            await self.consumers.shutdown_all(max(0.0, grace), on_stopped=early)
            try:  # renewals go on until each lease is given back (none expires meanwhile)
                await release_all(self, self._io)
            finally:
                renewer.cancel()
                await asyncio.gather(renewer, return_exceptions=True)
            log.info("worker %s stopped", self.cfg.worker_id)

    # --- loops -----------------------------------------------------------------------------------

    def _periodic(self) -> list[tuple[Callable[[], Any], float | Callable[[], float], Any]]:
        """The periodic loops, renewals first: leadership in its own loop, at the pace its
        record's life sets, so a long maintenance round (a throttled ListShards, a big scan)
        never lets it lapse; the control round once per lease duration, from the start of the
        last (suspend reacts within two failover times, the flag coming from a scan up to one
        old; ``status`` sees figures about that old; a quiet status record's ``live_for``
        counts on its rounds not drifting later)."""
        return [
            (self._renew_round, self.holder.round_interval, {"rate": True, "first": True}),
            (functools.partial(self._io, self.leader.tick), self.leader.tick_interval, {}),
            (self._maintenance_round, self.cfg.shard_sync_interval, {}),
            (self._control_round, self.timing.lease_duration, {"rate": True}),
        ]

    async def _loop(
        self, step: Callable[[], Any], interval: float | Callable[[], float], *,
        first: bool = False, rate: bool = False,
    ) -> None:  # fmt: skip
        """``step`` every ``interval`` s (or what it says) after the last ended; ``rate``:
        after the last began (renewals: a slow round must not push the next one later)."""
        every = interval if callable(interval) else (lambda: interval)
        if not first:
            await self.sleep(every())
        while True:
            began = self.clock.monotonic()
            try:
                await step()
            except KclpySparkError as exc:
                self._failed(exc)
            except Exception:
                log.exception("worker %s: unexpected error in %s", self.cfg.worker_id, step)
            spent = self.clock.monotonic() - began if rate else 0.0
            await self.sleep(max(0.0, every() - spent))

    def _failed(self, exc: KclpySparkError, what: str = "") -> None:
        """A loop's lease-table call failed: tell health; log it (quietly once the table is
        known to be gone: health has said so at ERROR)."""
        # Quiet once health has said so at ERROR: the table gone, or the same corrupt item (a
        # WARNING every take round was about 15,000 lines a day until someone mended it).
        already_gone = self.health.table_gone_since is not None or (
            isinstance(exc, CorruptLeaseError) and str(exc) == self.health.corrupt_lease
        )
        self.health.store_failed(exc)
        if isinstance(exc, CorruptLeaseError):
            self.metrics.corrupt_lease_reads.inc()
        level = logging.DEBUG if already_gone else logging.WARNING
        log.log(level, "worker %s: %s%s", self.cfg.worker_id, what, exc)

    async def _take_loop(self) -> None:
        while True:
            # Cleared before the round: a wake-up asked during it (a shard ended, leases
            # created) starts the next round at once instead of an interval later.
            self._take_now.clear()
            try:
                if not self.run_state.suspended:
                    await self.taker.round()
            except KclpySparkError as exc:
                self._failed(exc, "lease taking failed: ")
            except Exception:
                log.exception("worker %s: unexpected error taking leases", self.cfg.worker_id)
            await self.taker.wait(self._take_now, self.taker.interval())

    async def _renew_round(self) -> None:
        # On its own thread: a slow scan or maintenance pass on the lease executor never delays
        # a renewal round (renew_all itself waits at most one round). Throughput is measured
        # every KCL renewal interval, whatever the rounds: its moving average keeps its window.
        if self.clock.monotonic() - self._measured_at >= self.timing.renew_interval:
            self._measured_at = self.clock.monotonic()
            self.consumers.measure_throughput()  # written by the next renewals
        report = await run_on(self._renew_io, self.holder.renew_all)
        self.metrics.renewals.inc(len(report.renewed))
        self.metrics.renewals_skipped.inc(len(report.skipped))
        self.metrics.renewal_failures.inc(len(report.failed))
        self.metrics.leases_lost.inc(len(report.lost))
        for exc in report.failed.values():
            self.health.store_failed(exc)
        self.health.writes(len(report.renewed) + len(report.skipped), list(report.failed.values()))
        # Nothing held proves nothing about the table (a skip: a checkpoint landed lately).
        if (report.renewed or report.skipped) and not report.failed:
            self.health.store_ok()
        for lease in report.lost:
            log.warning("worker %s lost lease %s", self.cfg.worker_id, lease.lease_key)
            self.consumers.lost(lease.lease_key, report.lost_tokens.get(lease.lease_key))
        for held in () if self.handing_out else report.handoffs:
            self.consumers.hand_over(held, self.cfg.handoff_timeout)
        for key in self.consumers.lost_unless_held(self.holder.held_keys()):  # between rounds
            self.metrics.leases_lost.inc()
            log.warning("worker %s lost lease %s (a write of it)", self.cfg.worker_id, key)

    async def _control_round(self) -> None:
        """The steps; then the page's view, whatever they came to; then the status record."""
        go_on = False
        try:
            go_on = await self._control_steps()
        finally:
            now = self.clock.wall()
            payload = publish.publish_snapshot(self, self.latest_status, now)
        if go_on:  # the same payload, written when due
            await publish.publish_if_due(self, self._io, now, payload)

    async def _control_steps(self) -> bool:
        """Watch the streams and whether a dependency is gone too long (first: this must not depend
        on the lease table answering); follow the suspend flag. False: the worker gives up."""
        await self.streams.check_present(self._io)
        reason = self.health.fatal(self.streams.gone(), self.streams.configured())
        if reason is not None:
            self.exit_reason = reason
            log.error("worker %s: giving up: %s", self.cfg.worker_id, reason)
            self.run_state.stop("giving up")
            return False
        cpu = self.cpu.sample(self.consumers.changes)
        if cpu is not None:
            self.metrics.cpu_ratio.set(cpu / 100)
        # Read from the coordination records, which on DynamoDB are a table of their own: its
        # answer says nothing about the lease table (scans and renewals tell health that; while
        # suspended there are neither, so one small read of the lease table does).
        suspended, asked = await self._io(self.suspend_flag.read)
        if asked:  # the coordination records answered (not the last scan's copy)
            self.health.store_ok(coordination=True)
        if self.run_state.suspended:
            await self._io(self.store.is_empty)
            self.health.store_ok()
        if suspended and self.run_state.suspend():
            log.warning("worker %s: application suspended; releasing leases", self.cfg.worker_id)
            publish.publish_snapshot(self, self.latest_status, self.clock.wall())
            await self.consumers.shutdown_all(self.cfg.shutdown_grace)
            await release_all(self, self._io, resign=False)
        elif not suspended and self.run_state.resume():
            log.warning("worker %s: application resumed", self.cfg.worker_id)
            self._take_now.set()
        return True

    async def _maintenance_round(self) -> None:
        """Follow the stream list (every worker); shard sync, audit and cleanup (the leader)."""
        if self.cfg.streams:
            removed, added = await self.streams.refresh()
            for context in removed:
                self.consumers.hand_back(context)
            if added:
                self._take_now.set()
        for context in list(self.streams.contexts.values()):
            if not self.leader.is_leader or self.run_state.suspended:
                return  # leadership is re-checked per stream: it may lapse during a long round
            try:
                result = await self._io(context.maintenance.run_once)
            except LeadershipLapsed as exc:  # the next leader's round goes on
                log.info("shard sync of stream %s stopped: %s", context.label, exc)
                return
            except KclpySparkError as exc:
                log.warning("shard sync of stream %s failed: %s", context.label, exc)
                continue
            synced = result.synced
            if synced is not None and (synced.created or synced.reopened):
                self._take_now.set()
            for key in () if synced is None else synced.reopened:
                self.metrics.reopened(key)
        if self.leader.is_leader:  # shown by `status`; written with the next renewal
            self.leader.note_later(last_sync=self.clock.wall())

    def consumed_streams(self) -> list[str] | None:
        """The stream keys of the streams open here; None with one stream per table."""
        if not self.cfg.streams:
            return None
        return [c.stream_key for c in self.streams.contexts.values() if c.stream_key]

    def context_of(self, lease: Lease) -> StreamContext | None:
        return self.streams.context_of(lease)
