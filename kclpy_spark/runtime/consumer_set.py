"""The shard consumers of one worker: one asyncio task per lease it holds, from take to end.

``ConsumerSet`` starts a ``ShardConsumer`` for each lease taken, tells consumers when their lease
is lost or must be handed back, and handles how each one ended: a finished shard wakes the taker
(its children may be ready), a lost lease is dropped, a stream removed from the configuration
gets its leases released, a lease another worker asked for (graceful handoff) is handed over
once its processor has had ``shutdown_requested``. The consumers themselves release or park
their leases when they give them up (``Tenure``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from checkpoint.base.clock import AsyncSleep, Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.counters import CoordinationCounters, Counter
from checkpoint.lease import OwnerFigures, owner_tag, split_lease_key
from checkpoint.leasing.held_lease import HeldLease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.port import LeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.logs import shard_context
from kclpy_spark.moves.rules.load import ema
from kclpy_spark.runtime.caught_up import CaughtUp
from kclpy_spark.runtime.consumer import Outcome, ProcessorFactory, ShardConsumer, ShardStats
from kclpy_spark.runtime.health import ConsumerView
from kclpy_spark.runtime.lease_calls import lease_call
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.streams import StreamContext

log = logging.getLogger(__name__)

# Ended tenures kept for status (the oldest are forgotten first).
FINISHED_KEPT = 256


@dataclass
class _Running:
    consumer: ShardConsumer
    task: asyncio.Task[Outcome]
    warned_call: float | None = None  # start of the processor call already warned about
    bytes_seen: int = 0  # stats.bytes at the last throughput measurement
    measured_at: float | None = None
    kbps: float | None = None  # the moving average of the read throughput


class ConsumerSet:
    def __init__(
        self,
        cfg: WorkerConfig,
        processors: ProcessorFactory,
        *,
        holder: LeaseHolder,
        table: LeaseTable,
        clock: Clock,
        sleep: AsyncSleep,
        rng: random.Random,
        metrics: WorkerMetrics,
        counters: CoordinationCounters,
        on_shard_end: Callable[[], None],
        caught_up: CaughtUp | None = None,
        runs_no_more: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """``runs_no_more(worker)``: whether a worker that asked for a lease has stopped since
        (by its status record), so that a handoff is not completed to it."""
        self._cfg = cfg
        self._runs_no_more = runs_no_more
        self._caught_up = caught_up
        self._processors = processors
        self._holder = holder
        self._owner_tag = owner_tag(holder.worker_id)  # what our figures name us by, once
        self._table = table
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._metrics = metrics
        self._counters = counters
        self._on_shard_end = on_shard_end
        self.running: dict[str, _Running] = {}
        self.changes = 0  # consumers started or ended so far (the CPU meter's marker)
        self.finished: dict[str, ShardStats] = {}
        self._hand_back: set[str] = set()  # leases to release when their consumer has stopped
        self._handing_over: set[str] = set()
        self._background: set[asyncio.Future[None]] = set()
        self._cancelling = False  # shutdown_all cancels what outlived its grace (no one else)
        self._telling: set[asyncio.Future[None]] = set()  # lease_lost to cancelled consumers
        # Leases whose consumer was cancelled while a processor call ran on its thread (a
        # suspend's grace ran out): no consumer of the lease starts until that call returns.
        self._draining: dict[str, tuple[asyncio.Future[Any], float]] = {}  # -> (its end, since)
        # A read silent this long (not blocked on a full queue) makes the worker not ready.
        self.stall_after = max(30.0, 10 * cfg.idle_time_between_reads)

    def __contains__(self, lease_key: str) -> bool:
        return lease_key in self.running or lease_key in self._draining

    def stats(self) -> list[ShardStats]:
        return [r.consumer.stats for r in self.running.values()]

    def stats_of(self, lease_key: str) -> ShardStats | None:
        running = self.running.get(lease_key)
        return None if running is None else running.consumer.stats

    def views(self) -> list[ConsumerView]:
        now = self._clock.monotonic()
        views = []
        for r in self.running.values():
            stats = r.consumer.stats
            stalled = stats.state == "processing" and r.consumer.progress.stalled(self.stall_after)
            if stalled:
                r.consumer.lag_unknown()
            views.append(ConsumerView(stats.shard_id, stats.state, stalled, self._hung(r, now)))
        for key, (_, since) in self._draining.items():  # a cancelled call that runs on
            if now - since > self._cfg.processor_stall_timeout:
                views.append(ConsumerView(split_lease_key(key)[1], "cancelled", False, now - since))
        return views

    def _hung(self, running: _Running, now: float) -> float | None:
        """Seconds the consumer's processor call has been running, once past the timeout."""
        started = running.consumer.stats.call_started
        if started is None or now - started <= self._cfg.processor_stall_timeout:
            running.warned_call = None
            return None
        if running.warned_call != started:  # once per call
            running.warned_call = started
            log.warning(
                "shard %s: a processor call has been running for %.0fs (processor_stall_timeout "
                "%.0fs); the lease is held without progress",
                running.consumer.stats.shard_id,
                now - started,
                self._cfg.processor_stall_timeout,
            )
        return now - started

    def start(self, held: HeldLease, context: StreamContext) -> None:
        key = held.lease_key
        if key in self._draining:  # taken by a path that did not look: never beside that call
            log.warning("lease %s: a cancelled processor call still runs; giving it back", key)
            self._in_background(key, "a cancelled processor call of it still runs here")
            return
        consumer = ShardConsumer(
            held=held,
            holder=self._holder,
            table=self._table,
            processors=self._processors,
            sources=context.sources,
            probe=context.probe,
            cfg=self._cfg,
            clock=self._clock,
            sleep=self._sleep,
            rng=self._rng,
            metrics=self._metrics,
            initial_position=context.initial_position,
            caught_up=self._caught_up,
        )
        task = asyncio.create_task(consumer.run(), name=f"shard-{held.lease.shard_id}")
        self.running[key] = _Running(consumer, task)
        self.changes += 1
        task.add_done_callback(functools.partial(self._done, key))
        with shard_context(held.lease.shard_id):
            log.info(
                "worker %s took lease %s (checkpoint %s)",
                self._cfg.worker_id,
                key,
                held.lease.checkpoint,
            )

    def lost(self, lease_key: str, token: uuid.UUID | None = None) -> None:
        """The lease was lost; with ``token``, only the tenure held under it (a late report
        must not stop a consumer of the lease taken again since)."""
        running = self.running.get(lease_key)
        if running is not None and (token is None or running.consumer.token == token):
            running.consumer.lease_lost()

    def lost_unless_held(self, held_keys: set[str]) -> list[str]:
        """A lease can also go between renewals (a checkpoint's conditional write lost, a write
        refused as expired): its consumer must stop too. The keys of those told now."""
        told = []
        for key, running in list(self.running.items()):
            consumer = running.consumer
            if key not in held_keys and not consumer.finishing:
                if not consumer.tenure.lost.is_set():
                    told.append(key)
                consumer.lease_lost()
        return told

    def hand_back(self, context: StreamContext) -> None:
        """The stream was removed from the configuration: stop its consumers (after
        ``shutdown_requested``) and release their leases."""
        for key, running in list(self.running.items()):
            if context.owns(running.consumer.held_lease):
                self._hand_back.add(key)
                running.consumer.request_shutdown()

    def measure_throughput(self) -> None:
        """Each consumer's read throughput since the last call, smoothed (the KCL 3.x moving
        average), with its records and lag, handed to the holder for the next renewal to write
        (load-aware balancing; ``status``)."""
        now = self._clock.monotonic()
        for key, r in self.running.items():
            stats = r.consumer.stats
            total = stats.bytes
            if r.measured_at is not None and now > r.measured_at:
                r.kbps = ema(r.kbps, (total - r.bytes_seen) / 1024 / (now - r.measured_at))
            kbps = None if r.kbps is None else round(r.kbps, 3)
            at = round(self._clock.wall(), 1)
            figures = OwnerFigures(self._owner_tag, at, stats.records, stats.millis_behind_latest)
            self._holder.set_figures(key, r.consumer.token, throughput_kbps=kbps, figures=figures)
            r.bytes_seen, r.measured_at = total, now

    def hand_over(self, held: HeldLease, timeout: float) -> None:
        """Another worker asked for this lease (graceful handoff): its consumer stops, the
        processor gets ``shutdown_requested`` (and checkpoints there), then the handoff is
        completed. After ``timeout`` it is completed anyway and the consumer told the lease is
        lost (its late checkpoints are refused: the completion moved the counter)."""
        key = held.lease_key
        if key in self._handing_over:
            return  # the renewals report it until it is done
        self._handing_over.add(key)
        running = self.running.get(key)
        if running is not None and running.consumer.token == held.token:
            running.consumer.request_shutdown()
        task = None if running is None else running.task
        future = asyncio.ensure_future(self._hand_over(held, task, timeout))
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    async def _hand_over(
        self, held: HeldLease, task: asyncio.Task[Outcome] | None, timeout: float
    ) -> None:
        key, to = held.lease_key, held.lease.lease_owner
        try:
            done = task is None or bool((await asyncio.wait([task], timeout=timeout))[0])
            if not done:
                log.warning("lease %s: the processor did not finish shutdown_requested within "
                            "%.0f s; handing the lease over anyway", key, timeout)  # fmt: skip
            # A receiver that stopped since it asked would never take the lease: completed to
            # it, the lease waited out twice the failover time unread. Taken back and released.
            check = self._runs_no_more
            gone = to is not None and check is not None and await check(to)
            try:
                result = await lease_call(
                    self._holder.release, key, held.token, take_back_handoff=gone
                )
            except KclpySparkError as exc:
                log.warning("lease %s: completing the handoff failed (%s); it expires", key, exc)
            else:
                if result.won and gone:
                    log.info("lease %s: %s, which asked for it, runs no more; released instead",
                             key, to)  # fmt: skip
                elif result.won:
                    log.info("lease %s: handed over to %s", key, to)
                    self._metrics.events.add(key, "handed", f"to {to}, which asked for it")
            if not done and task is not None:
                self.lost(key, held.token)
        finally:
            self._handing_over.discard(key)

    def _done(self, key: str, task: asyncio.Task[Outcome]) -> None:
        running = self.running.pop(key, None)
        self.changes += 1
        hand_back = key in self._hand_back
        self._hand_back.discard(key)  # whatever the end: a later tenure is not handed back
        if running is not None:
            self._remember(key, running.consumer.stats)
        if task.cancelled():
            call = None if running is None else running.consumer.call_running()
            if call is not None:
                log.warning("lease %s: its consumer was cancelled while a processor call still "
                            "runs on its thread; the lease is not run here again until that "
                            "call returns", key)  # fmt: skip
            # Its processor is told (lease_lost: it lets go of what it holds) once that call
            # returned, and the lease is not run here again until it was told.
            settled = self._tell_cancelled(running.consumer, call) if running else call
            self._drain(key, settled)
            if not self._cancelling:  # a CancelledError nobody here asked for ended the task
                log.error("shard consumer for %s was cancelled unasked; releasing the lease", key)
                release = functools.partial(self._in_background, key, "cancelled unasked")
                if settled is None:  # not while its processor runs: another worker would too
                    release()
                else:
                    settled.add_done_callback(functools.partial(_then, release))
            return
        exc = task.exception()
        if exc is not None:  # run() handles every failure; this is a bug in the handling itself
            log.error("shard consumer for %s failed: %r; releasing the lease", key, exc)
            self._in_background(key, "the consumer failed")
            return
        outcome = task.result()
        if outcome is Outcome.SHARD_END:
            self._counters.increment(Counter.PARTITIONS_COMPLETED)
            self._on_shard_end()  # the children may be ready for someone: look now
        elif outcome is Outcome.SHUTDOWN and hand_back:
            self._in_background(key, "its stream is no longer configured")
        elif outcome is Outcome.LEASE_LOST:
            self._counters.increment(Counter.PARTITION_NOT_OWNED_ERRORS)
            self._holder.drop(key, None if running is None else running.consumer.token)

    def _tell_cancelled(
        self, consumer: ShardConsumer, call: asyncio.Future[Any] | None
    ) -> asyncio.Future[None]:
        """``lease_lost`` to a cancelled consumer's processor once ``call`` (the one it was in)
        returned, on a task of its own (kept in ``_telling``, never awaited by a stop); the
        task, which ends when the processor was told."""

        async def tell() -> None:
            if call is not None:
                await asyncio.wait([call])
            await consumer.after_cancel()

        task = asyncio.ensure_future(tell())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
        return task

    def _drain(self, key: str, thread: asyncio.Future[Any] | None) -> None:
        """The lease ``key`` is not run here again until ``thread`` (its processor's last call
        and its ``lease_lost``) is done; it shows as hung meanwhile if that takes too long."""
        if thread is None:
            return
        self._draining[key] = (thread, self._clock.monotonic())

        def returned(done: asyncio.Future[Any]) -> None:
            if self._draining.get(key, (None, 0.0))[0] is done:
                del self._draining[key]

        thread.add_done_callback(returned)

    def _remember(self, key: str, stats: ShardStats) -> None:
        """Keep the last FINISHED_KEPT ended tenures for status; forget the shard's per-shard
        metrics (a lag gauge of a shard held elsewhere now would alert falsely; a finished
        shard's counters would stay forever)."""
        self.finished.pop(key, None)
        self.finished[key] = stats
        while len(self.finished) > FINISHED_KEPT:
            self.finished.pop(next(iter(self.finished)))
        self._metrics.forget(key)

    def _in_background(self, key: str, why: str) -> None:
        held = self._holder.get_if_held(key)
        if held is None:
            self._holder.drop(key)
            return
        token = held.token

        def release() -> None:
            try:
                self._holder.release(key, token)
                log.info("released lease %s (%s)", key, why)
            except KclpySparkError as exc:
                log.warning("releasing lease %s failed (%s); it expires instead", key, exc)

        future = asyncio.ensure_future(lease_call(release))
        self._background.add(future)
        future.add_done_callback(self._background.discard)

    async def shutdown_all(
        self, grace: float, on_stopped: Callable[[str], Awaitable[None]] | None = None
    ) -> None:
        """Ask every consumer to shut down and wait up to ``grace`` for them, then cancel the
        rest. ``on_stopped(key)`` runs as soon as a consumer ended by itself (not cancelled:
        its call may still run): its lease is given back then, not after the slowest one's
        shutdown (which held every other lease renewed and unread up to the grace)."""
        running = list(self.running.items())
        for _, r in running:
            r.consumer.request_shutdown()
        if not running:
            return
        ends = [] if on_stopped is None else [
            asyncio.ensure_future(self._when_stopped(key, r.task, on_stopped))
            for key, r in running
        ]  # fmt: skip
        _, pending = await asyncio.wait([r.task for _, r in running], timeout=grace)
        self._cancelling = True
        try:
            for task in pending:
                log.warning("shard task %s did not stop within the grace time; cancelling", task)
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            self._cancelling = False
        for end in await asyncio.gather(*ends, return_exceptions=True):
            if isinstance(end, BaseException):  # a bug; release_all gives back what is left
                log.error("giving a lease back as its consumer stopped failed: %r", end)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def _when_stopped(
        self, key: str, task: asyncio.Task[Outcome], on_stopped: Callable[[str], Awaitable[None]]
    ) -> None:
        """``on_stopped(key)`` once ``task`` ended by itself with a shutdown or its shard's end:
        not cancelled (its call may still run) nor failed (``_done`` gives that one back), nor
        being handed over by ``_hand_over``. (A lease of a stream no longer configured, which
        ``_done`` gives back too, is given back twice: the second finds it gone.)"""
        await asyncio.wait([task])
        if task.cancelled() or task.exception() is not None:
            return
        ended = task.result() in (Outcome.SHUTDOWN, Outcome.SHARD_END)
        if ended and key not in self._handing_over:
            await on_stopped(key)


def _then(step: Callable[[], None], _: asyncio.Future[Any]) -> None:
    step()
