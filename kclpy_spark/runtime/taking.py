"""Taking leases: one scan of the lease table per round, the KCL 2.x rule (``plan_takes``) over
what this worker has seen of each lease's counter (``LeaseObserver``), and a conditional take of
each lease it names; a lease taken gets its shard consumer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from checkpoint.counters import Counter
from checkpoint.lease import Lease, LeaseState
from checkpoint.leasing.observer import LeaseObserver
from checkpoint.leasing.taker import plan_takes

if TYPE_CHECKING:
    from kclpy_spark.runtime.worker import Worker

log = logging.getLogger(__name__)

T = TypeVar("T")
Io = Callable[..., Awaitable[Any]]


class Taker:
    def __init__(self, worker: Worker, io: Io) -> None:
        self._w = worker
        self._io = io  # runs a lease-table call on the worker's lease executor
        self._observer = LeaseObserver(worker.timing)

    async def round(self) -> None:
        """One scan of the lease table; take (or steal) what the KCL's rule says."""
        w = self._w
        leases = await self._io(w.store.list_leases)
        w.health.store_ok()
        try:  # the status page's view: never at the cost of taking
            w.board.on_scan(leases)
        except Exception:
            log.exception("worker %s: the status page could not follow the scan", w.cfg.worker_id)
        now_wall = w.clock.wall()
        mine = [x for x in leases if w.streams.context_of(x) is not None]
        if w.caught_up is not None:  # a job: stop when every shard is caught up
            if self._job_complete(mine):
                return
            mine = [x for x in mine if not w.caught_up.is_ended(x.lease_key)]
        unfinished = [x for x in mine if not x.checkpoint.is_shard_end]
        # Parked leases are invisible to the taker until their reopen time; leases of streams
        # this worker does not consume (removed from the config) are never taken.
        open_leases = [x for x in mine if x.state(now_wall) is not LeaseState.CLOSED]
        w.health.all_parked = bool(unfinished) and all(
            x.state(now_wall) is LeaseState.CLOSED for x in unfinished
        )
        monotonic = w.clock.monotonic()
        scan = self._observer.observe(open_leases, monotonic)
        plan = plan_takes(
            scan,
            w.cfg.worker_id,
            max_leases_for_worker=w.cfg.max_leases_for_worker,
            max_leases_to_steal=w.cfg.max_leases_to_steal,
            rng=w.rng,
            steal_cooldown=w.timing.steal_cooldown,
        )
        if not plan.leases:
            if plan.mine < plan.target:
                w.counters.increment(Counter.NO_PARTITIONS_ACQUIRED)
            return
        log.info("worker %s: %s", w.cfg.worker_id, plan.reason)
        for lease in plan.leases:
            if not w.may_take:  # suspended or stopping meanwhile: take (or steal) no more
                return
            if lease.lease_key not in w.consumers:
                await self._take(lease, stolen=lease in plan.steal)

    def _job_complete(self, leases: list[Lease]) -> bool:
        w = self._w
        assert w.caught_up is not None
        if not leases or w.caught_up.remaining(leases):
            return False
        done, failed = len(w.caught_up.done), len(w.caught_up.failed)
        log.info("worker %s: caught up (%d lease(s) done, %d failed); stopping",
                 w.cfg.worker_id, done, failed)  # fmt: skip
        w.caught_up_complete = True
        w.request_shutdown()
        return True

    async def _take(self, lease: Lease, *, stolen: bool) -> None:
        w = self._w
        take = asyncio.ensure_future(self._io(w.store.take_lease, lease, w.cfg.worker_id))
        try:
            taken = await asyncio.shield(take)
        except asyncio.CancelledError:
            # Stopping: the take may still win in its thread. Hold what it took, so the stop's
            # release gives it back at once instead of leaving it owned by nobody alive.
            with contextlib.suppress(Exception):
                late = await take
                if late is not None:
                    w.holder.add_taken(late)
            raise
        if taken is None:
            log.info("lease %s: another worker took it first", lease.lease_key)
            return
        self._observer.record_write(taken, w.clock.monotonic())
        w.counters.increment(Counter.PARTITIONS_ACQUIRED)
        (w.metrics.steals if stolen else w.metrics.takes).inc()
        held = w.holder.add_taken(taken)
        w.events.add(lease.lease_key, *_why_taken(lease, stolen=stolen))
        context = w.streams.context_of(taken)
        if context is None or not w.may_take:  # its stream removed, or suspended, meanwhile
            await self._io(w.holder.release, held.lease_key, held.token)
            return
        w.consumers.start(held, context)


def _why_taken(lease: Lease, *, stolen: bool) -> tuple[str, str]:
    """The event of a take: its kind and why the lease was free to take."""
    if stolen:
        return "stole", f"from {lease.lease_owner}, to balance the leases between workers"
    if lease.lease_owner:
        return "took", f"from {lease.lease_owner}, which stopped renewing it"
    return "took", "it had no owner"
