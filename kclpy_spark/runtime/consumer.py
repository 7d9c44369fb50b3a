"""One shard's consumer: wait on parents, initialize, process, then shard end, lease loss or
shutdown. Runs as an asyncio task; a plain processor method runs in a thread, an ``async def`` one
on the loop.

A processor exception never kills the worker and never skips records: the same batch is offered
again with backoff, and after ``max_processing_attempts`` failures the lease is parked (released
with a reopen time, visible in status) so the records are redelivered from the last checkpoint
later.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from checkpoint.checkpointer import Checkpointer
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import Lease
from checkpoint.leasing.holder import HeldLease, LeaseHolder
from checkpoint.port import LeaseTable
from checkpoint.sequence import LATEST, TRIM_HORIZON, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.logs import set_shard
from kclpy_spark.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
    is_async,
)
from kclpy_spark.retrieval.fanout import FanOutFetcher
from kclpy_spark.retrieval.kpl import Deaggregator
from kclpy_spark.retrieval.polling import FetchedBatch, PollingFetcher, earliest_sequence_number
from kclpy_spark.runtime.metrics import WorkerMetrics
from shard_sync.hierarchy import BlockedOnParentShardError, child_leases_at_shard_end

log = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    SHARD_END = "shard_end"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    PARKED = "parked"


@dataclass
class ShardStats:
    """Live figures for one shard (read by the status display and metrics)."""

    shard_id: str
    state: str = "waiting_on_parents"
    records: int = 0
    batches: int = 0
    bytes: int = 0
    millis_behind_latest: int | None = None
    last_delivered: str | None = None
    failures: int = 0


class LeaseLost(Exception):
    """Internal: the lease was lost while a step was waiting."""


class ShutdownSignal(Exception):
    """Internal: shutdown was requested while a step was waiting."""


class ShardConsumer:
    def __init__(
        self,
        *,
        held: HeldLease,
        holder: LeaseHolder,
        table: LeaseTable,
        processor: RecordProcessor,
        kinesis: Any,
        stream: dict[str, str],
        cfg: WorkerConfig,
        wall: Callable[[], float],
        rng: random.Random | None = None,
        metrics: WorkerMetrics | None = None,
        initial_position: InitialPosition | None = None,
    ) -> None:
        self._held = held
        self._holder = holder
        self._table = table
        self._processor = processor
        self._kinesis = kinesis
        self._stream = stream
        self._cfg = cfg
        self._wall = wall
        self._rng = rng or random.Random()
        self.lease_key = held.lease_key
        self.stats = ShardStats(held.lease.shard_id)
        self._metrics = metrics or WorkerMetrics(CoordinationCounters())
        self._position = initial_position or cfg.initial_position
        self._lost = asyncio.Event()
        # True once the consumer gives its lease up on purpose (shard end, parking).
        self.finishing = False
        self._shutdown = asyncio.Event()
        self.checkpointer = Checkpointer(
            holder,
            held.lease_key,
            held.token,
            held.lease.checkpoint,
            on_write=self._metrics.checkpoint_seconds.observe,
        )

    # --- signals from the worker -----------------------------------------------------------------

    @property
    def held_lease(self) -> Lease:
        return self._held.lease

    def lease_lost(self) -> None:
        self._lost.set()

    def request_shutdown(self) -> None:
        self._shutdown.set()

    # --- helpers ---------------------------------------------------------------------------------

    async def _call(self, method: Callable[[Any], Any], arg: object) -> None:
        if is_async(method):
            await method(arg)
        else:
            result = await asyncio.to_thread(method, arg)
            if asyncio.iscoroutine(result):
                await result

    async def _wait_or_stop(self, awaitable: Awaitable[Any]) -> Any:
        """Await ``awaitable`` unless the lease is lost or shutdown is requested first."""
        task = asyncio.ensure_future(awaitable)
        lost = asyncio.ensure_future(self._lost.wait())
        stop = asyncio.ensure_future(self._shutdown.wait())
        try:
            done, _ = await asyncio.wait({task, lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (lost, stop):
                t.cancel()
        if task in done:
            return task.result()
        task.cancel()
        raise LeaseLost() if self._lost.is_set() else ShutdownSignal()

    def _backoff(self, attempt: int) -> float:
        return self._rng.uniform(0, min(30.0, 0.5 * 2 ** min(attempt, 8)))

    # --- the state machine -----------------------------------------------------------------------

    async def run(self) -> Outcome:
        shard = self.stats.shard_id
        set_shard(shard)  # this task's log lines (and its threads') name the shard
        try:
            self.stats.state = "waiting_on_parents"
            await self._wait_for_parents()
            if not await self._check_retention():
                return await self._finish(Outcome.PARKED)
            self.stats.state = "initializing"
            checkpoint = self._held.lease.checkpoint
            await self._call(
                self._processor.initialize,
                InitializeInput(shard, checkpoint.sequence_number, checkpoint.sub_sequence_number),
            )
            self.stats.state = "processing"
            log.info("shard %s: processing from checkpoint %s", shard, checkpoint)
            outcome = await self._process()
        except LeaseLost:
            outcome = Outcome.LEASE_LOST
        except ShutdownSignal:
            outcome = Outcome.SHUTDOWN
        return await self._finish(outcome)

    async def _finish(self, outcome: Outcome) -> Outcome:
        shard = self.stats.shard_id
        if outcome is Outcome.LEASE_LOST or outcome is Outcome.PARKED:
            self.stats.state = outcome.value
            log.info("shard %s: lease lost; telling the processor", shard)
            await self._safe(self._processor.lease_lost, LeaseLostInput(), "lease_lost")
        elif outcome is Outcome.SHUTDOWN:
            self.stats.state = "shutting_down"
            await self._safe(
                self._processor.shutdown_requested,
                ShutdownRequestedInput(self.checkpointer),
                "shutdown_requested",
            )
        self.stats.state = outcome.value
        return outcome

    async def _safe(self, method: Callable[[Any], Any], arg: object, name: str) -> None:
        try:
            await self._call(method, arg)
        except Exception:
            log.exception("shard %s: the processor's %s raised", self.stats.shard_id, name)

    async def _wait_for_parents(self) -> None:
        lease = self._held.lease
        while True:
            blocking = []
            for parent in sorted(lease.parent_shard_ids):
                parent_lease = await asyncio.to_thread(
                    self._table.get_lease, lease.sibling_key(parent)
                )
                if parent_lease is not None and not parent_lease.checkpoint.is_shard_end:
                    blocking.append(parent)
            if not blocking:
                return
            log.info(
                "shard %s waits for parent shard(s) %s to reach SHARD_END",
                lease.shard_id,
                ", ".join(blocking),
            )
            await self._wait_or_stop(asyncio.sleep(self._cfg.parent_shard_poll_interval))

    async def _process(self) -> Outcome:
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue(maxsize=self._cfg.prefetch_batches)
        lease = self._held.lease
        deaggregator = Deaggregator(lease.hash_key_range) if self._cfg.kpl_deaggregation else None
        fetcher: PollingFetcher | FanOutFetcher
        if self._cfg.retrieval_mode == "fanout":
            fetcher = FanOutFetcher(
                self._kinesis,
                self._stream,
                self.stats.shard_id,
                lease.checkpoint,
                self._position,
                queue,
                consumer_name=self._cfg.consumer_name or self._cfg.application_name,
                rng=self._rng,
                deaggregator=deaggregator,
            )
        else:
            fetcher = PollingFetcher(
                self._kinesis,
                self._stream,
                self.stats.shard_id,
                lease.checkpoint,
                self._position,
                queue,
                max_records=self._cfg.max_records,
                idle_time=self._cfg.idle_time_between_reads,
                rng=self._rng,
                deaggregator=deaggregator,
            )
        fetch_task = asyncio.create_task(fetcher.run(), name=f"fetch-{self.stats.shard_id}")
        lost = asyncio.ensure_future(self._lost.wait())
        stop = asyncio.ensure_future(self._shutdown.wait())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {getter, fetch_task, lost, stop}, return_when=asyncio.FIRST_COMPLETED
                )
                if getter not in done:
                    getter.cancel()
                    if lost in done:
                        raise LeaseLost()
                    if stop in done:
                        return Outcome.SHUTDOWN
                    fetch_task.result()  # raises what stopped the fetcher
                    continue
                batch = getter.result()
                if batch.records and not await self._deliver(batch):
                    return Outcome.PARKED
                if batch.shard_ended:
                    await self._shard_end(batch)
                    return Outcome.SHARD_END
                if self._lost.is_set():
                    raise LeaseLost()
                if self._shutdown.is_set():
                    return Outcome.SHUTDOWN
        finally:
            for task in (fetch_task, lost, stop):
                task.cancel()
            await asyncio.gather(fetch_task, lost, stop, return_exceptions=True)

    async def _deliver(self, batch: FetchedBatch) -> bool:
        """Offer the batch until the processor takes it; False if the lease had to be parked."""
        last = batch.records[-1]
        end = ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)
        # A batch whose process_records raised was not processed: until it succeeds, "the last
        # record delivered" (what checkpoint() with no argument records, e.g. in
        # shutdown_requested) stays at the end of the previous batch.
        before = self.checkpointer.largest_permitted
        lag = batch.millis_behind_latest or 0
        attempt = 0
        while True:
            # Checked before every delivery, not only when the renewer reports: a checkpoint that
            # lost its conditional write drops the lease at once, and nothing more should be
            # handed to the processor after that.
            if self._lost.is_set() or self._holder.get_if_held(self.lease_key) is None:
                raise LeaseLost()
            self.checkpointer.set_largest_permitted(end)
            try:
                await self._call(
                    self._processor.process_records,
                    ProcessRecordsInput(batch.records, lag, self.checkpointer),
                )
                break
            except Exception:
                self.checkpointer.set_largest_permitted(before)
                if self._holder.get_if_held(self.lease_key) is None:
                    # The lease went while the batch was processed (its checkpoint write lost, or
                    # it expired): the failure is the lease's, not the records'. Stop; the new
                    # owner redelivers from the last checkpoint.
                    log.warning(
                        "shard %s: process_records failed after the lease was lost",
                        self.stats.shard_id,
                        exc_info=True,
                    )
                    raise LeaseLost() from None
                attempt += 1
                self.stats.failures += 1
                self._metrics.processing_failures.labels(self.stats.shard_id).inc()
                log.exception(
                    "shard %s: process_records failed on records %s..%s (attempt %d of %d)",
                    self.stats.shard_id,
                    batch.records[0].sequence_number,
                    last.sequence_number,
                    attempt,
                    self._cfg.max_processing_attempts,
                )
                if attempt >= self._cfg.max_processing_attempts:
                    await self._park(f"{attempt} failed attempts")
                    return False
                await self._wait_or_stop(asyncio.sleep(self._backoff(attempt)))
        self.stats.records += len(batch.records)
        self.stats.batches += 1
        size = sum(r.data_size for r in batch.records)
        self.stats.bytes += size
        self.stats.millis_behind_latest = batch.millis_behind_latest
        shard = self.stats.shard_id
        self._metrics.records.labels(shard).inc(len(batch.records))
        self._metrics.bytes.labels(shard).inc(size)
        if batch.millis_behind_latest is not None:
            self._metrics.behind.labels(shard).set(batch.millis_behind_latest)
        self.stats.last_delivered = last.sequence_number
        return True

    async def _check_retention(self) -> bool:
        """Apply ``aged_checkpoint_policy`` when the stored sequence number is older than anything
        the stream still holds. False if the lease was parked."""
        checkpoint = self._held.lease.checkpoint
        if checkpoint.is_sentinel:
            return True
        first = await earliest_sequence_number(self._kinesis, self._stream, self.stats.shard_id)
        if first is None or int(checkpoint.sequence_number) >= int(first):
            return True
        policy = self._cfg.aged_checkpoint_policy
        what = (
            f"shard {self.stats.shard_id}: checkpoint {checkpoint} is older than the stream's "
            f"retention (earliest record {first}); records after the checkpoint may have aged out"
        )
        if policy == "fail":
            log.error("%s. Parking the lease; set aged_checkpoint_policy or run reset", what)
            await self._park(reason="aged-out checkpoint")
            return False
        target = TRIM_HORIZON if policy == "earliest" else LATEST
        held = self._holder.get_if_held(self.lease_key)
        if held is None:
            raise LeaseLost()
        result = await asyncio.to_thread(
            self._holder.update,
            self.lease_key,
            held.token,
            lambda lease: self._table.update_checkpoint(lease, target),
        )
        if not result.won or result.lease is None:
            raise LeaseLost()
        log.warning(
            "%s. Policy %r: restarting at %s (%s)",
            what,
            policy,
            target,
            "possible duplicates" if policy == "earliest" else "records in between are lost",
        )
        self._held = replace(self._held, lease=result.lease)
        self.checkpointer = Checkpointer(
            self._holder,
            self.lease_key,
            self._held.token,
            result.lease.checkpoint,
            on_write=self._metrics.checkpoint_seconds.observe,
        )
        return True

    async def _park(self, reason: str = "repeated processing failures") -> None:
        reopen_at = self._wall() + self._cfg.park_duration
        held = self._holder.get_if_held(self.lease_key)
        if held is None:
            raise LeaseLost()

        self.finishing = True

        def write(lease: Lease) -> Lease | None:
            parked = self._table.update_lease(lease.parked(reopen_at))
            return None if parked is None else self._table.evict_lease(parked)

        result = await asyncio.to_thread(self._holder.update, self.lease_key, held.token, write)
        self._holder.drop(self.lease_key)
        log.error(
            "shard %s: parked (%s); it reopens in %.0fs and is redelivered from its last "
            "checkpoint (%s)",
            self.stats.shard_id,
            reason,
            self._cfg.park_duration,
            "written" if result.won else "write lost: another worker holds it",
        )

    async def _shard_end(self, batch: FetchedBatch) -> None:
        await asyncio.to_thread(self._create_children, batch.child_shards)
        self.checkpointer.mark_shard_end()
        attempt = 0
        while True:
            if self._lost.is_set():
                raise LeaseLost()
            try:
                await self._call(self._processor.shard_ended, ShardEndedInput(self.checkpointer))
            except Exception:
                log.exception("shard %s: shard_ended raised", self.stats.shard_id)
            held = self._holder.get_if_held(self.lease_key)
            if held is None:
                raise LeaseLost()
            if held.lease.checkpoint.is_shard_end:
                break
            attempt += 1
            log.error(
                "shard %s: the processor did not checkpoint at SHARD_END in shard_ended; its "
                "children cannot start. Retrying (attempt %d)",
                self.stats.shard_id,
                attempt,
            )
            await self._wait_or_stop(asyncio.sleep(self._backoff(attempt)))
        # Finished: give the lease up so no worker renews it; cleanup deletes it later.
        self.finishing = True
        await asyncio.to_thread(
            self._holder.update, self.lease_key, held.token, self._table.evict_lease
        )
        self._holder.drop(self.lease_key)
        log.info("shard %s reached SHARD_END; its children may start", self.stats.shard_id)

    def _create_children(self, child_shards: list[dict[str, Any]]) -> None:
        if not child_shards:
            return
        existing = {lease.lease_key: lease for lease in self._table.list_leases()}
        try:
            new = child_leases_at_shard_end(self.lease_key, child_shards, existing)
        except BlockedOnParentShardError as exc:
            # The merge's other parent has no lease yet; when it gets one and ends, it creates the
            # child (the KCL's rule). The auditor's sync covers the case where that never happens.
            log.info("shard %s: %s", self.stats.shard_id, exc)
            new = []
        stream_key = self._held.lease.stream_key
        for spec in new:
            if self._table.create_lease_if_absent(spec.to_lease(stream_key)):
                log.info("shard %s: created child lease %s", self.stats.shard_id, spec.shard_id)
        children = frozenset(str(c["ShardId"]) for c in child_shards)
        held = self._holder.get_if_held(self.lease_key)
        if held is None:
            raise LeaseLost()
        result = self._holder.update(
            self.lease_key,
            held.token,
            lambda lease: self._table.update_lease(replace(lease, child_shard_ids=children)),
        )
        if not result.won:
            raise LeaseLost()
