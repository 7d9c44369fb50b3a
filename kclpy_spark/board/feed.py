"""Feeding the status page's model from a running worker, at no steady cost to the lease table:
each taker scan is observed as it happens (the scan the worker makes anyway), the worker's own
figures are read in memory, and the other workers' published records are read only when the page
asks (at most every ``refresh`` seconds). A worker that is suspended does not scan: then the page's
request makes the scan."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from checkpoint import coordination
from checkpoint.lease import Lease
from kclpy_spark.board.model import Board
from kclpy_spark.runtime.publish import status_payload

if TYPE_CHECKING:
    from kclpy_spark.runtime.worker import Worker

Io = Callable[..., Awaitable[Any]]


class WorkerBoard:
    def __init__(self, worker: Worker, io: Io, *, refresh: float = 10.0) -> None:
        self._w = worker
        self._io = io  # runs a lease-table call on the worker's lease executor
        self._refresh = refresh
        self.board = Board(
            worker.cfg.application_name,
            worker.cfg.stream,
            worker_ttl=3 * worker.timing.lease_duration,
        )
        self._leases: Sequence[Lease] = ()
        self._scanned = -math.inf
        self._others: dict[str, dict[str, Any]] = {}
        self._others_read = -math.inf
        self._lock = asyncio.Lock()

    def on_scan(self, leases: Sequence[Lease]) -> None:
        """The taker scanned the table: a new look, with no request of its own."""
        self._leases = leases
        self._scanned = self._w.clock.monotonic()
        self._observe()

    def _observe(self) -> None:
        w = self._w
        now_wall = w.clock.wall()
        fresh = w.clock.monotonic() - self._others_read <= 3 * self._refresh
        statuses: dict[str, Any] = dict(self._others) if fresh else {}
        own = status_payload(w, now_wall)
        statuses[w.cfg.worker_id] = {**own, "updated_at": now_wall, "worker_id": w.cfg.worker_id}
        self.board.observe(self._leases, statuses, now_wall, suspended=w.suspended)

    async def snapshot(self) -> dict[str, Any]:
        async with self._lock:
            w = self._w
            now = w.clock.monotonic()
            if now - self._scanned > 2 * w.timing.take_interval:
                self._leases = await self._io(w.store.list_leases)
                self._scanned = now
            if now - self._others_read > self._refresh:
                owners = {x.lease_owner for x in self._leases if x.lease_owner}
                owners.discard(w.cfg.worker_id)
                self._others = {
                    o: await self._io(coordination.worker_status, w.store, o)
                    for o in sorted(owners)
                }
                self._others_read = now
            self._observe()
            return self.board.snapshot()
