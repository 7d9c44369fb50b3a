"""What the lease loops tell the rest of the worker, by what happened: a scan came back (health,
the suspend flag's and the status page's view of it), a lease was taken, asked for, assigned,
none could be had, or every lease is parked. One collaborator instead of the five parts behind
it (``Health``, ``EventLog``, the metrics, the KCL counters, the status page), so the loops name
the event and the worker decides where it goes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from checkpoint.base.errors import KclpySparkError
from checkpoint.counters import Counter
from checkpoint.lease import Lease
from checkpoint.port import CoordinationRecord

if TYPE_CHECKING:
    from checkpoint import coordination
    from checkpoint.counters import CoordinationCounters
    from checkpoint.port import TableScan
    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.health import Health
    from kclpy_spark.runtime.metrics import WorkerMetrics

log = logging.getLogger(__name__)


class ScanView(Protocol):
    """Who else follows the taker's scans (the status page's feed)."""

    def on_scan(
        self, leases: Sequence[Lease], records: Sequence[CoordinationRecord] = ()
    ) -> None: ...


class TakeReports:
    def __init__(
        self,
        worker_id: str,
        health: Health,
        events: EventLog,
        metrics: WorkerMetrics,
        counters: CoordinationCounters,
        suspend_flag: coordination.SuspendFlag,
        board: ScanView | None = None,
    ) -> None:
        self._worker_id = worker_id
        self._health = health
        self._events = events
        self._metrics = metrics
        self._counters = counters
        self._suspend_flag = suspend_flag
        self._board = board  # the status page's feed (none in tests that have no page)

    def scanned(self, table: TableScan, returned: float) -> None:
        """A scan of the whole table came back (at monotonic ``returned``)."""
        self._health.store_ok(scanned=True)
        self._health.store_ok(coordination=True)  # the scan read the coordination records too
        self._suspend_flag.observe(table.records, returned)
        if self._board is None:
            return
        try:  # the status page's view: never at the cost of taking
            self._board.on_scan(list(table.leases), table.records)
        except Exception:
            log.exception("worker %s: the status page could not follow the scan", self._worker_id)

    def table_answered(self, *, every_lease_read: bool = False) -> None:
        """The lease table answered (``every_lease_read``: each lease looked at was read whole)."""
        self._health.store_ok(scanned=every_lease_read)

    def write_answered(self, failure: KclpySparkError | None = None) -> None:
        """A take's write came back (won or lost), or ``failure`` stopped it (health's
        readiness: writes failing while scans answer)."""
        self._health.writes(0 if failure else 1, [failure] if failure else [])

    def all_parked(self, parked: bool) -> None:
        """Whether every unfinished lease of ours is parked (health reports it)."""
        self._health.all_parked = parked

    def none_acquired(self) -> None:
        """A round that wanted leases could take none (the KCL's counter)."""
        self._counters.increment(Counter.NO_PARTITIONS_ACQUIRED)

    def took(self, lease: Lease, how: str) -> None:
        """We took ``lease`` (``how``: took, stole or handed), as it was before the take."""
        self._counters.increment(Counter.PARTITIONS_ACQUIRED)
        (self._metrics.steals if how == "stole" else self._metrics.takes).inc()
        self._events.add(lease.lease_key, *why_taken(lease, how))

    def asked(self, lease: Lease, to: str, me: str) -> None:
        """We asked ``lease``'s owner to hand it over to ``to`` (us, or a worker we lead)."""
        self._metrics.handoffs_asked.inc()
        if to == me:
            self._events.add(lease.lease_key, "asked", why_taken(lease, "stole")[1])
        else:
            self._events.add(lease.lease_key, "moving", f"from {lease.lease_owner} to {to}, to "
                             "balance the load (assigned by this leader)")  # fmt: skip

    def assigned(self, key: str, to: str, why: str) -> None:
        """As the leader, we assigned lease ``key`` to ``to``."""
        self._events.add(key, "assigned", f"to {to} {why}")


def why_taken(lease: Lease, how: str) -> tuple[str, str]:
    """The event of a take: its kind and why the lease was free to take."""
    if how == "stole":
        return "stole", f"from {lease.lease_owner}, to balance the leases between workers"
    if how == "handed":
        return "took", "handed over to us (graceful handoff)"
    if lease.lease_owner:
        return "took", f"from {lease.lease_owner}, which stopped renewing it"
    return "took", "it had no owner"
