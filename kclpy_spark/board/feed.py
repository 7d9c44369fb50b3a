"""Feeding the status page's model from a running worker, at no steady cost to the lease table: each
taker scan is observed as it happens (the scan the worker makes anyway), the worker's own figures
are the last snapshot it published (``runtime.publish.LatestStatus``: at start, after every
control round whatever the round came to, and when it is suspended; never its live state), and
the other workers' published records are read only when the page asks (at most every ``refresh``
seconds). A worker that is suspended does not scan: then the page's request makes the scan."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from checkpoint import coordination
from checkpoint.base.clock import Clock
from checkpoint.lease import Lease
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.port import CoordinationRecord
from kclpy_spark.board.model import Board

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.lease_store import LeaseStore
    from kclpy_spark.runtime.publish import StatusSnapshot

Io = Callable[..., Awaitable[Any]]


class WorkerBoard:
    """The status page's model for one worker. ``published()`` is the worker's last published
    status snapshot (None before its first control round)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        store: LeaseStore,
        clock: Clock,
        timing: LeaseTiming,
        io: Io,
        published: Callable[[], StatusSnapshot | None],
        *,
        refresh: float = 10.0,
    ) -> None:
        self._cfg, self._store, self._clock, self._timing = cfg, store, clock, timing
        self._io = io  # runs a lease-table call on the worker's lease executor
        self._published = published
        self._refresh = refresh
        self.board = Board(
            cfg.application_name, cfg.stream, worker_ttl=3 * timing.lease_duration,
            silent_after=timing.lease_duration + timing.max_clock_skew,
        )  # fmt: skip
        self._leases: Sequence[Lease] = ()
        self._scanned = -math.inf
        self._others: dict[str, dict[str, Any]] = {}
        self._others_read = -math.inf
        self._lock = asyncio.Lock()

    def on_scan(self, leases: Sequence[Lease], records: Sequence[CoordinationRecord] = ()) -> None:
        """The taker scanned the table (and the workers' status records): a new look, with no
        request of its own."""
        self._leases = leases
        self._scanned = self._clock.monotonic()
        if records:
            self._note_workers(records)
        self._observe()

    def _note_workers(self, records: Sequence[CoordinationRecord]) -> None:
        """Every worker's status record, those that hold no lease too (spare, suspended, or
        handing a lease over): read only for the leases' owners, the page left them out."""
        statuses = coordination.worker_statuses(records)
        statuses.pop(self._cfg.worker_id, None)
        self._others, self._others_read = statuses, self._clock.monotonic()

    def _observe(self) -> None:
        now_wall, me = self._clock.wall(), self._cfg.worker_id
        fresh = self._clock.monotonic() - self._others_read <= 3 * self._refresh
        statuses: dict[str, Any] = dict(self._others) if fresh else {}
        own = self._published()
        mine = {} if own is None else own.payload()
        if own is not None:
            statuses[me] = {**mine, "updated_at": own.at, "worker_id": me}
        suspended = bool(mine.get("suspended", False))
        self.board.observe(self._leases, statuses, now_wall, suspended=suspended)

    async def snapshot(self) -> dict[str, Any]:
        async with self._lock:
            now = self._clock.monotonic()
            if (
                now - self._scanned > 2 * self._timing.take_interval
                or now - self._others_read > self._refresh
            ):
                table = await self._io(self._store.scan_table, coordination.WORKER_PREFIX)
                self._leases, self._scanned = list(table.leases), now
                self._note_workers(table.records)
            self._observe()
            return self.board.snapshot()
