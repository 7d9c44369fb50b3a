"""One shard consumer's failure budget: ``max_processing_attempts`` failures in a row, then park.

Every step of a tenure that can fail over and over reports here. A failure counts, is logged with
the shard and waits a backoff; the one that spends the budget parks the lease (``Parked``). A
failure a retry may fix (a retriable ``KclpySparkError``: throttling, a dependency that does not
answer) waits a backoff without counting (``retrying``): an outage is the worker's health's
business, not a reason to park every lease. "In a row" is kept honest: any step that succeeds
starts the count again (``succeeded``), and so does a read that kept getting answers for
``ANSWERED_FOR`` seconds after the last failure (``answered_since``), so rare errors days apart
never add up, while a source that answers once and fails again each time still parks.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from kclpy_spark.processor import RedeliverFromCheckpoint
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.tenure import LeaseLost, Parked, ShardStats, ShutdownSignal, Tenure

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds of answers after a failure that make it not "in a row" with the next one: longer than
# the longest backoff (30 s), so the wait itself never counts as a working read.
ANSWERED_FOR = 60.0


class FailureBudget:
    def __init__(
        self,
        tenure: Tenure,
        stats: ShardStats,
        *,
        limit: int,
        park_duration: float,
        backoff: Backoff,
        monotonic: Callable[[], float],
        metrics: WorkerMetrics,
        label: str,
    ) -> None:
        self._tenure = tenure
        self._stats = stats
        self._limit = limit
        self._park_duration = park_duration
        self.backoff = backoff
        self._monotonic = monotonic
        self._metrics = metrics
        self._label = label  # the lease key: the metrics' shard label
        self.failures = 0  # in a row
        self._failed_at = float("-inf")  # monotonic time of the last failure counted
        self._steps: set[str] = set()  # the steps that failed in this row

    def succeeded(self) -> None:
        self.failures = 0
        self._steps.clear()

    def succeeded_at(self, step: str) -> None:
        """``step`` succeeded: the count starts again if only ``step`` failed in this row (a
        call after an empty read says nothing of the reads: a source that answers once, empty,
        then fails, still parks)."""
        if self._steps <= {step}:
            self.succeeded()

    def answered_since(self, last_ok: float | None) -> None:
        """The source's last answer (``FetchProgress.last_ok``): answers going on for
        ANSWERED_FOR seconds after the last failure mean the failures before were not in a
        row."""
        if last_ok is not None and last_ok - self._failed_at >= ANSWERED_FOR:
            self.succeeded()

    async def retrying(
        self, what: str, step: Callable[[], Awaitable[T]], *, progress: bool = True
    ) -> T:
        """``step()`` until it succeeds: retriable errors wait without counting, every other
        failure counts (``failed``). A success starts the count again unless the step is no
        progress (``progress=False``: a lease's announcement to its processor, which every
        restarted read on the executors makes before it reads)."""
        transient = 0
        while True:
            try:
                result = await step()
            except (LeaseLost, ShutdownSignal, Parked, RedeliverFromCheckpoint):
                raise  # the last: the consumer reads again from the checkpoint
            except KclpySparkError as exc:
                if not exc.retriable:
                    await self.failed(what, exc)
                    continue
                transient += 1
                log.warning("shard %s: %s failed, retrying: %s", self._stats.shard_id, what, exc)
                await self._tenure.pause(self.backoff.delay(transient))
            except Exception as exc:
                await self.failed(what, exc)
            else:
                if progress:
                    self.succeeded()
                return result

    async def failed(self, what: str, exc: BaseException, detail: str = "") -> None:
        """Count a failure; park the lease when the budget is spent (raises Parked), else wait a
        backoff. Raises LeaseLost if the lease went meanwhile: then the failure was the lease's,
        not the records'."""
        self._tenure.current()
        self.failures += 1
        self._steps.add(what)
        self._failed_at = self._monotonic()
        self._stats.failures += 1
        self._metrics.processing_failures.labels(*self._metrics.shard(self._label)).inc()
        log.error(
            "shard %s: %s failed%s (attempt %d of %d): %s",
            self._stats.shard_id,
            what,
            detail,
            self.failures,
            self._limit,
            exc if isinstance(exc, KclpySparkError) else repr(exc),
            exc_info=not isinstance(exc, KclpySparkError),
        )
        if self.failures >= self._limit:
            await self.park(f"{what} failed {self.failures} times in a row: {exc}")
            raise Parked()
        await self._tenure.pause(self.backoff.delay(self.failures))

    async def park(self, reason: str) -> None:
        self._stats.park_reason = reason
        await self._tenure.park(reason, self._park_duration)
