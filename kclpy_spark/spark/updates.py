"""How a written batch changes the lanes: the MicroBatcher's side of the writer's reports.

The writer (writer.py) does I/O only and reports each outcome through ``LaneEvents``;
``LaneUpdates`` applies it under the batcher's lock with the ``Lane`` transitions, and keeps the
batcher's statistics.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from checkpoint.base.clock import Clock
from checkpoint.checkpointer import SHUTDOWN, CheckpointError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.acks import OUTCOMES
from kclpy_spark.spark.batch_life import Batch, BatchState
from kclpy_spark.spark.jvm_heap import HeapFigures
from kclpy_spark.spark.lane import Cut, Lane, LaneState
from kclpy_spark.spark.pieces import PendingState, PieceKey
from kclpy_spark.spark.settings import BatcherSettings

log = logging.getLogger(__name__)


@dataclass
class BatcherStats:
    batches: int = 0
    rows: int = 0
    failed_attempts: int = 0
    dead_lettered_batches: int = 0
    parked_batches: int = 0
    commits: int = 0
    # Seconds spent, summed over batches: pending checkpoints, sink writes, checkpoint commits.
    prepare_seconds: float = 0.0
    write_seconds: float = 0.0
    commit_seconds: float = 0.0
    last_error: str = ""
    # By ``[[sinks]]`` name, one entry a configured sink, each made before the first write
    # (``sink``): a scrape reads them without the lock, so none is added while it may run.
    by_sink: dict[str, SinkFigures] = field(default_factory=dict)

    def sink(self, name: str) -> SinkFigures:
        figures = self.by_sink.get(name)
        if figures is None:
            figures = self.by_sink[name] = SinkFigures()
        return figures


@dataclass
class SinkFigures:
    """One sink's share of the writes: attempts, failed ones, their seconds, and each batch's
    answer (``acks``: written, dead-lettered or failed)."""

    attempts: int = 0
    failed_attempts: int = 0
    write_seconds: float = 0.0
    answers: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))


class BatcherStatsCollector(Collector):
    """The batcher's statistics as Prometheus metrics (``kclpy_spark_sink_*``)."""

    _COUNTERS: ClassVar[dict[str, str]] = {
        "batches": "Batches written",
        "rows": "Rows written",
        "failed_attempts": "Sink write attempts that raised",
        "dead_lettered_batches": "Batches written to the dead-letter location",
        "parked_batches": "Batches given up on (their leases parked)",
        "commits": "Checkpoints moved after a write",
        "prepare_seconds": "Seconds spent writing pending checkpoints",
        "write_seconds": "Seconds spent in sink writes",
        "commit_seconds": "Seconds spent moving checkpoints after writes",
    }

    def __init__(
        self,
        stats: BatcherStats,
        hung_writes: Callable[[], int] = lambda: 0,
        *,
        heap: Callable[[], HeapFigures | None] | None = None,
        gc_runs: Callable[[], int] | None = None,
        executor_reads: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """``heap``: the driver JVM's last heap figures (a local JVM only); ``gc_runs``: how
        often the sink ran Python's collector to free what dead batches pinned there;
        ``executor_reads``: with ``read_on = "executors"``, the read jobs run so far and the reads
        whose rows the executors still store."""
        self._stats = stats
        self._hung_writes = hung_writes
        self._heap = heap
        self._gc_runs = gc_runs
        self._executor_reads = executor_reads

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        for name, help_text in self._COUNTERS.items():
            yield CounterMetricFamily(
                f"kclpy_spark_sink_{name}", help_text, value=float(getattr(self._stats, name))
            )
        yield from self._by_sink()
        yield GaugeMetricFamily(
            "kclpy_spark_sink_hung_writes",
            "Sink writes given up on for giving no answer within their timeout, still running",
            value=float(self._hung_writes()),
        )
        if self._gc_runs is not None:
            yield CounterMetricFamily(
                "kclpy_spark_sink_python_gc_runs",
                "Python collections the sink ran to free what dead batches pinned in the JVM",
                value=float(self._gc_runs()),
            )
        if self._executor_reads is not None:
            jobs, stored = self._executor_reads()
            yield CounterMetricFamily(
                "kclpy_spark_sink_executor_read_jobs",
                "Spark jobs that read leases' ranges on the executors",
                value=float(jobs),
            )
            yield GaugeMetricFamily(
                "kclpy_spark_sink_executor_reads_stored",
                "Reads whose rows the executors store (freed once no batch holds them)",
                value=float(stored),
            )
        figures = self._heap() if self._heap is not None else None
        if figures is not None:
            for name, value, help_text in (
                ("used", figures.used, "Driver JVM heap in use when last read"),
                ("live", figures.live, "Driver JVM heap in use after its last collection"),
                ("limit", figures.limit, "The most the driver JVM heap may grow to"),
            ):
                if value is None:  # the live set before the old generation's first collection
                    continue
                yield GaugeMetricFamily(
                    f"kclpy_spark_sink_jvm_heap_{name}_bytes", help_text, value=float(value)
                )

    def _by_sink(self) -> Iterable[CounterMetricFamily]:
        """Each ``[[sinks]]`` sink's figures, labelled with its name: its own writes and
        answers (the sink-wide figures above count a batch once, whatever its sinks)."""
        attempts = CounterMetricFamily(
            "kclpy_spark_sinks_write_attempts", "Write attempts, by sink", labels=["sink"]
        )
        failed = CounterMetricFamily(
            "kclpy_spark_sinks_failed_attempts", "Write attempts that raised, by sink",
            labels=["sink"],
        )  # fmt: skip
        seconds = CounterMetricFamily(
            "kclpy_spark_sinks_write_seconds", "Seconds spent in writes, by sink", labels=["sink"]
        )
        answers = CounterMetricFamily(
            "kclpy_spark_sinks_batches",
            "Batches each sink answered: written, dead-lettered or failed (its policy parks)",
            labels=["sink", "outcome"],
        )
        for name, figures in sorted(self._stats.by_sink.items()):
            attempts.add_metric([name], float(figures.attempts))
            failed.add_metric([name], float(figures.failed_attempts))
            seconds.add_metric([name], figures.write_seconds)
            for outcome, count in sorted(figures.answers.items()):
                answers.add_metric([name, outcome], float(count))
        yield from (attempts, failed, seconds, answers)


class LaneUpdates:
    """The writer's reports (``LaneEvents``), applied to the lanes and the stats under the
    batcher's lock: the batcher's side of every lane change a write causes."""

    def __init__(
        self,
        cond: threading.Condition,
        stats: BatcherStats,
        clock: Clock,
        settings: BatcherSettings,
        close: Callable[[Lane], None],
    ) -> None:
        self._cond = cond
        self.stats = stats
        self._clock = clock
        self._settings = settings
        self._close = close  # closes a lane and forgets it (call with the lock held)

    def tokened(self, lane: Lane, cut: Cut, token: Any) -> None:
        with self._cond:
            lane.tokened(cut, token)

    def write_pending(
        self,
        lane: Lane,
        cut: Cut,
        group: tuple[PieceKey, ...],
        write: Callable[[ExtendedSequenceNumber, PendingState], None],
    ) -> bool:
        """``write(target, state)``: the cut's pending checkpoint, listing every cut of its lane
        out, under the lane's pending-write lock (not the batcher's: the write is I/O), so the
        last write to land lists every cut whose write started. False when the cut has none (it
        was put back meanwhile). The write's error goes to the caller; one that no retry can
        mend first puts the cut back (``not_prepared``) with the lock still held, so no other
        writer prepares a later cut of the lane in between and writes what is put back."""
        with lane.pending_lock:
            with self._cond:
                pending = lane.pending_state(cut, group)
            if pending is None:
                return False
            try:
                write(*pending)
            except CheckpointError as exc:
                if not exc.retry_may_help:
                    self.not_prepared(lane, cut, exc)
                raise
            return True

    def prepared(self, lane: Lane, cut: Cut) -> None:
        with self._cond:
            lane.prepared(cut)
            self._cond.notify_all()  # the lane may cut again

    def leave_unprepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None:
        """``not_prepared`` for a cut whose pending write kept failing with retriable errors,
        under its lane's pending-write lock (as ``write_pending`` puts one back)."""
        with lane.pending_lock:
            self.not_prepared(lane, cut, error)

    def not_prepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None:
        with self._cond:
            if error.value == SHUTDOWN:
                self._close(lane)
            elif lane.put_back(cut, (cut.key,), self._clock.monotonic()):
                lane.park(f"cannot prepare the checkpoint: {error}")
            self._cond.notify_all()

    def batch_prepared(self, batch: Batch) -> None:
        with self._cond:
            batch.move(BatchState.PREPARED)

    def abandoned(self, batch: Batch) -> None:
        with self._cond:
            batch.move(BatchState.ABANDONED)

    def all_closed(self, batch: Batch) -> bool:
        with self._cond:
            return all(lane.state is LaneState.CLOSED for lane, _ in batch.parts)

    def attempt(
        self, error: BaseException | None, prepare_s: float, write_s: float, sink: str = ""
    ) -> None:
        """One attempt: preparing the batch, then (``sink`` named) writing it to that sink."""
        with self._cond:
            stats = self.stats
            stats.prepare_seconds += prepare_s
            stats.write_seconds += write_s
            if error is not None:
                stats.failed_attempts += 1
                stats.last_error = repr(error)
            if sink:
                figures = stats.sink(sink)
                figures.attempts += 1
                figures.write_seconds += write_s
                figures.failed_attempts += error is not None

    def answered(self, sink: str, outcome: str) -> None:
        with self._cond:
            answers = self.stats.sink(sink).answers
            answers[outcome] += 1

    def written(self, batch: Batch, *, dead_lettered: bool) -> list[Lane]:
        """Every sink acknowledged the batch: its cuts are marked written; returns the lanes
        still open (each commits its written prefix)."""
        rows = batch.sink_batch.rows if batch.sink_batch is not None else 0
        with self._cond:
            batch.move(BatchState.DEAD_LETTERED if dead_lettered else BatchState.WRITTEN)
            stats = self.stats
            if dead_lettered:
                stats.dead_lettered_batches += 1
            if not dead_lettered or (batch.acks is not None and batch.acks.written_any):
                stats.batches += 1  # written by a sink (by some, when others dead-lettered it)
                stats.rows += rows
            for lane, cut in batch.parts:
                lane.acknowledged(cut)
            return [lane for lane, _ in batch.parts if lane.state is not LaneState.CLOSED]

    def claim_commit(self, lane: Lane) -> Cut | None:
        with self._cond:
            return lane.claim_commit(self._clock.monotonic())

    def committed(self, lane: Lane, cut: Cut, seconds: float) -> None:
        with self._cond:
            lane.committed(cut)
            self.stats.commits += 1
            self.stats.commit_seconds += seconds
            self._cond.notify_all()

    def commit_failed(self, lane: Lane, cut: Cut, error: Exception) -> None:
        """A commit that failed: retried later unless the lease is gone or the checkpoint can
        never be taken (then every cut out is re-formed and the lane parked). An error that is not a
        ``CheckpointError`` is retried: the write succeeded, so the commit must not be lost."""
        with self._cond:
            now = self._clock.monotonic()
            if lane.state is LaneState.CLOSED or (
                isinstance(error, CheckpointError) and error.value == SHUTDOWN
            ):
                self._close(lane)
            elif not isinstance(error, CheckpointError) or error.retry_may_help:
                lane.commit_later(cut, now + self._settings.commit_retry_delay)
            elif lane.put_back_all(now):
                lane.park(f"checkpoint failed: {error}")
            self._cond.notify_all()

    def release_claim(self, lane: Lane, cut: Cut) -> None:
        """A claimed commit that raised something unexpected or was never tried: retried later,
        so the lane's checkpoint is not held back for good."""
        with self._cond:
            lane.release_claim(cut, self._clock.monotonic() + self._settings.commit_retry_delay)
            self._cond.notify_all()

    def reread(self, batch: Batch, error: BaseException) -> bool:
        """The rows the batch's reads stored on the executors are gone (an executor lost): each
        cut goes back to be read again, pinned to its ends, and written in the same batch; the
        lanes are not parked (what failed was a copy, not the records or the sink). False (and
        nothing done) once a lane of the batch was read again ``max_attempts`` times without its
        checkpoint moving: a batch whose write itself kills executors is given up on instead."""
        text = str(error)  # a Java error's text is a call to the JVM: not under the lock
        why = text.splitlines()[0][:300] if text else repr(error)
        with self._cond:
            if any(lane.rereads >= self._settings.max_attempts for lane, _ in batch.parts):
                return False
            log.warning(
                "%r: the rows its reads stored on the executors are gone (an executor lost?); "
                "its pieces are read again: %s",
                batch,
                why,
            )
            batch.move(BatchState.REREAD)
            now = self._clock.monotonic()
            for lane, cut in batch.parts:
                lane.put_back_unread(cut, batch.group, now)
            self._cond.notify_all()
            return True

    def gave_up(self, batch: Batch, error: BaseException) -> None:
        """Nothing is checkpointed: each cut goes back to the head of its lane to be re-formed,
        and the lanes are parked until the lease is parked or re-armed."""
        log.error(
            "%r: giving up after %d attempt(s) (%r); parking its leases",
            batch,
            sum(batch.attempts.values()),
            error,
        )
        with self._cond:
            batch.move(BatchState.PARKED)
            self.stats.parked_batches += 1
            now = self._clock.monotonic()
            for lane, cut in batch.parts:
                # A cut no longer out (put back with an earlier failed one, maybe re-formed
                # and in flight again) is not this failure's: the lane is not parked for it.
                if lane.put_back(cut, batch.group, now):
                    lane.park(repr(error))
            self._cond.notify_all()
