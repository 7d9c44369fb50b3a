"""The worker: renews and takes leases, leads shard sync when elected, runs one ShardConsumer per
held lease, and shuts down gracefully.

Lease-table calls are synchronous (boto3, sqlite3) and run in threads; Kinesis reads are asyncio
(aiobotocore). Lease expiry is judged only by this process's monotonic clock (see leasing/).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.base.errors import KclpySparkError
from checkpoint.counters import CoordinationCounters, Counter
from checkpoint.lease import Lease, LeaseState
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.leasing.observer import LeaseObserver
from checkpoint.leasing.taker import plan_takes
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.sequence import InitialPosition, Sentinel
from kclpy_spark.config import StreamSpec, WorkerConfig
from kclpy_spark.logs import set_application, shard_context
from kclpy_spark.ops import control
from kclpy_spark.processor import RecordProcessor
from kclpy_spark.runtime.consumer import Outcome, ShardConsumer, ShardStats
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.runtime.metrics import StatusServer, WorkerMetrics
from kclpy_spark.runtime.streams import StreamContext, stream_identity
from shard_sync.discovery import KinesisShardLister
from shard_sync.leader import LeaderElection

log = logging.getLogger(__name__)

ProcessorFactory = Callable[[], RecordProcessor]


@dataclass
class _Running:
    consumer: ShardConsumer
    task: asyncio.Task[Outcome]


class Worker:
    """One worker of an application. ``run()`` returns after ``request_shutdown()``."""

    def __init__(
        self,
        cfg: WorkerConfig,
        processor_factory: ProcessorFactory,
        *,
        store: LeaseStore,
        kinesis_sync: Any,
        kinesis_async: Any,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        stream_tracker: Callable[[], tuple[StreamSpec, ...]] | None = None,
    ) -> None:
        self.cfg = cfg
        self._kinesis_sync = kinesis_sync
        # Re-read every shard-sync interval in multi-stream mode: streams added or removed while
        # running are picked up (the daemon re-reads the config file's [[streams]]).
        self._stream_tracker = stream_tracker or (lambda: cfg.stream_specs)
        self.streams: dict[str, StreamContext] = {}
        self._factory = processor_factory
        self.store = store
        self._kinesis = kinesis_async
        self._clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self.timing = LeaseTiming(failover=cfg.failover_time)
        self.counters = CoordinationCounters()
        self.metrics = WorkerMetrics(self.counters)
        self.suspended = False
        self._last_store_ok: float | None = None
        self.status_server: StatusServer | None = None
        self.holder = LeaseHolder(store, cfg.worker_id, self._clock, self.timing.lease_duration)
        self._observer = LeaseObserver(self.timing)
        self.leader = LeaderElection(
            store, cfg.worker_id, lease_duration=self.timing.lease_duration, clock=self._clock
        )
        self._running: dict[str, _Running] = {}
        self._background: set[asyncio.Future[None]] = set()
        self.finished: dict[str, ShardStats] = {}
        self._stop = asyncio.Event()
        self._take_now = asyncio.Event()
        self.started = asyncio.Event()

    # --- public ----------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        log.info("worker %s: shutdown requested", self.cfg.worker_id)
        self._stop.set()

    def shard_stats(self) -> list[ShardStats]:
        return [r.consumer.stats for r in self._running.values()]

    def readiness(self) -> tuple[bool, str]:
        """Ready when started and the lease store answered within three renewal intervals."""
        if not self.started.is_set():
            return False, "starting"
        if self._last_store_ok is None:
            return False, "no lease-table round trip yet"
        age = self._clock.monotonic() - self._last_store_ok
        if age > 3 * self.timing.renew_interval:
            return False, f"lease table unreachable for {age:.0f}s"
        return True, "suspended" if self.suspended else "ready"

    async def run(self) -> None:
        set_application(self.cfg.application_name, self.cfg.stream)
        if self.cfg.metrics_port is not None:
            self.status_server = StatusServer(
                self.metrics, self.readiness, self.cfg.metrics_host, self.cfg.metrics_port
            )
            await self.status_server.start()
        try:
            await self._run()
        finally:
            if self.status_server is not None:
                await self.status_server.stop()

    async def _refresh_streams(self, *, first: bool = False) -> None:
        """Bring the stream contexts in line with the tracker's list of streams."""
        multi = bool(self.cfg.streams)
        specs = {spec.label: spec for spec in self._stream_tracker()}
        for label in [x for x in self.streams if x not in specs]:
            context = self.streams.pop(label)
            log.warning("stream %s is no longer configured: handing its leases back", label)
            for running in list(self._running.values()):
                if context.owns(running.consumer.held_lease):
                    running.consumer.request_shutdown()
        for label, spec in specs.items():
            if label in self.streams:
                continue
            try:
                lister = KinesisShardLister(
                    self._kinesis_sync, stream_name=spec.stream_name, stream_arn=spec.stream_arn
                )
                await asyncio.to_thread(lister.wait_until_active)
                stream_key: str | None = None
                if multi:
                    stream_key = await asyncio.to_thread(stream_identity, self._kinesis_sync, spec)
            except KclpySparkError as exc:
                if first and not multi:
                    raise
                log.error("stream %s cannot be consumed now (will retry): %s", label, exc)
                continue
            self.streams[label] = StreamContext(
                spec,
                stream_key=stream_key,
                initial_position=spec.initial_position or self.cfg.initial_position,
                kinesis_sync=self._kinesis_sync,
                table=self.store,
                ignore_unexpected_child_shards=self.cfg.ignore_unexpected_child_shards,
                counters=self.counters,
            )
            if not first:
                log.info("now consuming stream %s", label)
                self._take_now.set()

    def _context_of(self, lease: Lease) -> StreamContext | None:
        for context in self.streams.values():
            if context.owns(lease):
                return context
        return None

    async def _run(self) -> None:
        await self._refresh_streams(first=True)
        log.info(
            "worker %s starts on stream %s (application %s, lease store %s)",
            self.cfg.worker_id,
            self.cfg.stream,
            self.cfg.application_name,
            self.cfg.lease_store,
        )
        await self._control_round()
        await self._leader_tick()
        await self._maintenance_round()
        # Leadership is renewed in its own loop, so a long maintenance round (a throttled
        # ListShards, a big scan) never lets the leadership lapse while this worker still syncs.
        loops = [
            asyncio.create_task(self._loop(self._renew_round, self.timing.renew_interval)),
            asyncio.create_task(self._take_loop()),
            asyncio.create_task(
                self._loop(self._leader_tick, self.timing.renew_interval, first=False)
            ),
            asyncio.create_task(
                self._loop(self._maintenance_round, self.cfg.shard_sync_interval, first=False)
            ),
            # Once per lease duration: suspend reacts within one failover time and `status` sees
            # figures that old, for a third of the lease-table requests of a per-renewal round.
            asyncio.create_task(
                self._loop(self._control_round, self.timing.lease_duration, first=False)
            ),
        ]
        self.started.set()
        try:
            await self._stop.wait()
        finally:
            renewer = loops[0]
            for task in loops[1:]:
                task.cancel()
            await asyncio.gather(*loops[1:], return_exceptions=True)
            await self._shutdown_consumers()
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            await self._release_all()
            log.info("worker %s stopped", self.cfg.worker_id)

    # --- loops -----------------------------------------------------------------------------------

    async def _loop(self, step: Callable[[], Any], interval: float, *, first: bool = True) -> None:
        if not first:
            await asyncio.sleep(interval)
        while True:
            try:
                await step()
            except KclpySparkError as exc:
                log.warning("worker %s: %s", self.cfg.worker_id, exc)
            except Exception:
                log.exception("worker %s: unexpected error in %s", self.cfg.worker_id, step)
            await asyncio.sleep(interval)

    async def _take_loop(self) -> None:
        while True:
            try:
                await self._take_round()
            except KclpySparkError as exc:
                log.warning("worker %s: lease taking failed: %s", self.cfg.worker_id, exc)
            except Exception:
                log.exception("worker %s: unexpected error taking leases", self.cfg.worker_id)
            self._take_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._take_now.wait(), self.timing.take_interval)

    async def _renew_round(self) -> None:
        report = await asyncio.to_thread(self.holder.renew_all)
        self.metrics.renewals.inc(len(report.renewed))
        self.metrics.renewal_failures.inc(len(report.failed))
        self.metrics.leases_lost.inc(len(report.lost))
        self.metrics.leases_held.set(len(self.holder.held()))
        if not report.failed:
            self._last_store_ok = self._clock.monotonic()
        for lease in report.lost:
            running = self._running.get(lease.lease_key)
            if running is not None:
                with shard_context(lease.shard_id):
                    log.warning("worker %s lost lease %s", self.cfg.worker_id, lease.lease_key)
                running.consumer.lease_lost()
        # A lease can also go between renewals (a checkpoint's conditional write lost, local
        # expiry): its consumer must stop too.
        held = self.holder.held_keys()
        for key, running in list(self._running.items()):
            if key not in held and not running.consumer.finishing:
                running.consumer.lease_lost()

    async def _control_round(self) -> None:
        """Publish this worker's status; follow the application's suspend flag."""
        now = self._clock.wall()
        suspended = await asyncio.to_thread(control.is_suspended, self.store)
        self._last_store_ok = self._clock.monotonic()
        if suspended and not self.suspended:
            log.warning("worker %s: application suspended; releasing leases", self.cfg.worker_id)
            self.suspended = True
            await self._shutdown_consumers()
            await self._release_all(resign=False)
        elif not suspended and self.suspended:
            log.warning("worker %s: application resumed", self.cfg.worker_id)
            self.suspended = False
            self._take_now.set()
        await asyncio.to_thread(
            control.publish_worker_status,
            self.store,
            self.cfg.worker_id,
            self._status_payload(now),
            now_wall=now,
        )

    def _status_payload(self, now_wall: float) -> dict[str, Any]:
        now = self._clock.monotonic()
        leases: dict[str, Any] = {}
        for held in self.holder.held():
            running = self._running.get(held.lease_key)
            stats = running.consumer.stats if running else None
            leases[held.lease_key] = {
                "state": stats.state if stats else "held",
                "records": stats.records if stats else 0,
                "millis_behind_latest": stats.millis_behind_latest if stats else None,
                "last_renewal": now_wall - (now - held.last_counter_change),
            }
        return {"suspended": self.suspended, "leader": self.leader.is_leader, "leases": leases}

    async def _leader_tick(self) -> None:
        await asyncio.to_thread(self.leader.tick)

    async def _maintenance_round(self) -> None:
        """Follow the stream list (every worker); shard sync, audit and cleanup (the leader)."""
        if self.cfg.streams:
            await self._refresh_streams()
        if not self.leader.is_leader or self.suspended:
            return
        for context in list(self.streams.values()):
            try:
                result = await asyncio.to_thread(context.maintenance.run_once)
            except KclpySparkError as exc:
                log.warning("shard sync of stream %s failed: %s", context.label, exc)
                continue
            if result.synced is not None and result.synced.created:
                self._take_now.set()
        await asyncio.to_thread(self.leader.note, last_sync=self._clock.wall())

    async def _take_round(self) -> None:
        if self.suspended:
            return
        leases = await asyncio.to_thread(self.store.list_leases)
        now_wall = self._clock.wall()
        # Parked leases are invisible to the taker until their reopen time; leases of streams
        # this worker does not consume (removed from the config) are never taken.
        open_leases = [
            x
            for x in leases
            if x.state(now_wall) is not LeaseState.CLOSED and self._context_of(x) is not None
        ]
        scan = self._observer.observe(open_leases, self._clock.monotonic())
        plan = plan_takes(
            scan,
            self.cfg.worker_id,
            max_leases_for_worker=self.cfg.max_leases_for_worker,
            max_leases_to_steal=self.cfg.max_leases_to_steal,
            rng=self._rng,
            steal_cooldown=self.timing.steal_cooldown,
        )
        if not plan.leases:
            if plan.mine < plan.target:
                self.counters.increment(Counter.NO_PARTITIONS_ACQUIRED)
            return
        log.info("worker %s: %s", self.cfg.worker_id, plan.reason)
        for lease in plan.leases:
            if lease.lease_key in self._running:
                continue
            taken = await asyncio.to_thread(self.store.take_lease, lease, self.cfg.worker_id)
            if taken is None:
                log.info("lease %s: another worker took it first", lease.lease_key)
                continue
            self.counters.increment(Counter.PARTITIONS_ACQUIRED)
            (self.metrics.steals if lease in plan.steal else self.metrics.takes).inc()
            await self._start_consumer(taken.lease_key, self.holder.add_taken(taken))

    # --- consumers -------------------------------------------------------------------------------

    async def _start_consumer(self, key: str, held: Any) -> None:
        context = self._context_of(held.lease)
        if context is None:  # its stream was removed meanwhile
            await asyncio.to_thread(
                self.holder.update, held.lease_key, held.token, self.store.evict_lease
            )
            self.holder.drop(held.lease_key)
            return
        position = context.initial_position
        if held.lease.checkpoint.sentinel is Sentinel.AT_TIMESTAMP:
            # A `kclpy-spark reset --to AT_TIMESTAMP:<t>` stored its time in the lease store.
            when = await asyncio.to_thread(control.reset_timestamp, self.store)
            if when is not None:
                position = InitialPosition.at_timestamp(when)
        consumer = ShardConsumer(
            held=held,
            holder=self.holder,
            table=self.store,
            processor=self._factory(),
            kinesis=self._kinesis,
            stream=context.spec.request,
            cfg=self.cfg,
            wall=self._clock.wall,
            rng=self._rng,
            metrics=self.metrics,
            initial_position=position,
        )
        task = asyncio.create_task(consumer.run(), name=f"shard-{held.lease.shard_id}")
        self._running[key] = _Running(consumer, task)
        task.add_done_callback(functools.partial(self._consumer_done, key))
        with shard_context(held.lease.shard_id):
            log.info(
                "worker %s took lease %s (checkpoint %s)",
                self.cfg.worker_id,
                key,
                held.lease.checkpoint,
            )

    def _consumer_done(self, key: str, task: asyncio.Task[Outcome]) -> None:
        running = self._running.pop(key, None)
        if running is not None:
            self.finished[key] = running.consumer.stats
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("shard consumer for %s failed: %r; releasing the lease", key, exc)
            self.holder.drop(key)
            return
        outcome = task.result()
        if outcome is Outcome.SHARD_END:
            self.counters.increment(Counter.PARTITIONS_COMPLETED)
            self._take_now.set()  # the children may be ready for someone: look now
        elif outcome is Outcome.SHUTDOWN and not self._stop.is_set() and not self.suspended:
            # Its stream was removed from the configuration: give the lease back now.
            held = self.holder.get_if_held(key)
            if held is not None:
                token = held.token

                def release() -> None:
                    self.holder.update(key, token, self.store.evict_lease)
                    self.holder.drop(key)

                future = asyncio.ensure_future(asyncio.to_thread(release))
                self._background.add(future)
                future.add_done_callback(self._background.discard)
        elif outcome is Outcome.LEASE_LOST:
            self.counters.increment(Counter.PARTITION_NOT_OWNED_ERRORS)
            self.holder.drop(key)

    async def _shutdown_consumers(self) -> None:
        running = list(self._running.values())
        for r in running:
            r.consumer.request_shutdown()
        if not running:
            return
        _, pending = await asyncio.wait([r.task for r in running], timeout=self.cfg.shutdown_grace)
        for task in pending:
            log.warning("shard task %s did not stop within the grace time; cancelling", task)
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def _release_all(self, *, resign: bool = True) -> None:
        for held in self.holder.held():
            result = await asyncio.to_thread(
                self.holder.update, held.lease_key, held.token, self.store.evict_lease
            )
            self.holder.drop(held.lease_key)
            with shard_context(held.lease.shard_id):
                log.info(
                    "worker %s released lease %s%s",
                    self.cfg.worker_id,
                    held.lease_key,
                    "" if result.won else " (already lost)",
                )
        self.metrics.leases_held.set(0)
        if resign:
            with contextlib.suppress(KclpySparkError):
                await asyncio.to_thread(self.leader.resign)
