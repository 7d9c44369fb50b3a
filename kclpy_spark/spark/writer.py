"""Writing one planned batch: prepare, attempt with retries, then acknowledge and commit, or apply
the failure policy. Used by the MicroBatcher (batcher.py) from its writer threads.

Lane fields are changed only under the batcher's condition lock; lease-table and sink I/O happen
outside it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from tenacity import RetryCallState, Retrying, stop_after_attempt, wait_random_exponential
from tenacity.stop import stop_base

from checkpoint.base.clock import Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import SHUTDOWN, CheckpointError
from kclpy_spark.spark.batch import BatchSink, Interrupter, SinkBatch, ToDataFrame
from kclpy_spark.spark.lanes import InFlight, Lane, LaneState
from kclpy_spark.spark.pieces import SCHEMA, PendingState, PieceKey, batch_id_of
from kclpy_spark.spark.settings import BatcherSettings, BatcherStats

log = logging.getLogger(__name__)


class WriteTimeoutError(KclpySparkError):
    """A write attempt overran ``write_timeout``; its Spark jobs were interrupted."""

    retriable = True


class DeadLetterWriter(Protocol):
    def write(self, batch: SinkBatch, error: BaseException) -> None:
        """Store the batch durably with the error; raise if that failed."""
        ...


@dataclass(eq=False)
class Entry:
    """One piece of a planned batch, with the lane it came from."""

    lane: Lane
    flight: InFlight
    token: Any = None
    prepared: bool = False


@dataclass(eq=False)
class PlannedBatch:
    entries: list[Entry]
    tokens_ready: bool = False
    sink_batch: SinkBatch | None = None
    error: BaseException | None = None  # the last failure, once given up
    outcome: str = "pending"  # written | dead-lettered | parked | abandoned

    @property
    def group(self) -> tuple[PieceKey, ...]:
        return tuple(sorted(e.flight.piece.key for e in self.entries))

    def __repr__(self) -> str:
        keys = ", ".join(f"{k.lease_key}[{k.first}..{k.last}]" for k in self.group)
        return f"PlannedBatch({keys})"


class _LanesGone(stop_base):
    """Stop retrying once every lease of the batch is lost: their next owners write it."""

    def __init__(self, batch: PlannedBatch) -> None:
        self._batch = batch

    def __call__(self, retry_state: RetryCallState) -> bool:
        return all(e.lane.state is LaneState.CLOSED for e in self._batch.entries)


class BatchWriter:
    def __init__(
        self,
        sink: BatchSink,
        settings: BatcherSettings,
        cond: threading.Condition,
        stats: BatcherStats,
        *,
        to_df: ToDataFrame | None,
        interrupter: Interrupter,
        dead_letter: DeadLetterWriter | None,
        clock: Clock,
        sleep: Callable[[float], None],
    ) -> None:
        self._sink = sink
        self._s = settings
        self._cond = cond
        self._stats = stats
        self._to_df = to_df
        self._interrupter = interrupter
        self._dead_letter = dead_letter
        self._clock = clock
        self._sleep = sleep

    # --- one batch -------------------------------------------------------------------------------

    def run(self, batch: PlannedBatch) -> None:
        retrying = Retrying(
            stop=stop_after_attempt(self._s.max_attempts) | _LanesGone(batch),
            wait=wait_random_exponential(
                multiplier=self._s.retry_base_delay, max=self._s.retry_max_delay
            ),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda state: self._log_retry(batch, state),
        )
        try:
            retrying(self._attempt, batch)
        except Exception as exc:
            batch.error = exc
        else:
            if batch.entries:
                self._written(batch)
            else:
                batch.outcome = "abandoned"  # every lease was lost before its write
            return
        if all(e.lane.state is LaneState.CLOSED for e in batch.entries):
            batch.outcome = "abandoned"
            log.warning("%r: every lease was lost; their next owners write it", batch)
            return
        assert batch.error is not None
        if self._dead_letter is not None and batch.sink_batch is not None:
            try:
                self._dead_letter.write(batch.sink_batch, batch.error)
            except Exception:
                log.exception("%r: the dead-letter write failed too; parking", batch)
            else:
                log.error("%r went to the dead-letter location after: %r", batch, batch.error)
                with self._cond:
                    self._stats.dead_lettered_batches += 1
                self._written(batch, outcome="dead-lettered")
                return
        self.park(batch, batch.error)

    def _log_retry(self, batch: PlannedBatch, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%r: attempt %d of %d failed (%r); retrying in %.1fs",
            batch,
            state.attempt_number,
            self._s.max_attempts,
            exc,
            delay,
        )

    def _attempt(self, batch: PlannedBatch) -> None:
        try:
            started = time.perf_counter()
            self._prepare(batch)
            prepared = time.perf_counter()
            if not batch.entries:
                return
            sink_batch = batch.sink_batch
            assert sink_batch is not None
            try:
                self._write_once(sink_batch)
            finally:
                with self._cond:
                    self._stats.prepare_seconds += prepared - started
                    self._stats.write_seconds += time.perf_counter() - prepared
        except Exception as exc:
            with self._cond:
                self._stats.failed_attempts += 1
                self._stats.last_error = repr(exc)
            raise

    def _prepare(self, batch: PlannedBatch) -> None:
        """Tokens, then each piece's pending checkpoint (once per batch), then the SinkBatch."""
        if not batch.tokens_ready:
            fresh = [e for e in batch.entries if e.flight.recovery is None]
            tokens = self._sink.prepare([e.flight.piece for e in fresh]) if fresh else {}
            for e in batch.entries:
                rec = e.flight.recovery
                e.token = rec.token if rec is not None else tokens.get(e.lane.lease_key)
            batch.tokens_ready = True
        for e in list(batch.entries):
            if e.prepared:
                continue
            last = e.flight.piece.key.last
            state = PendingState(batch.group, e.token).encode()
            try:
                e.flight.prepared = e.lane.checkpointer.prepare_checkpoint(
                    last.sequence_number, last.sub_sequence_number, state
                )
            except CheckpointError as exc:
                if exc.retry_may_help:
                    raise
                log.warning("lease %s: cannot prepare its checkpoint (%s)", e.lane.lease_key, exc)
                self._lost(e, exc)
                batch.entries.remove(e)
                batch.sink_batch = None
                continue
            e.prepared = True
            with self._cond:
                tracker = e.lane.tracker
                tracker.rewind()  # nothing of this lease is outstanding but this piece
                e.flight.handle = tracker.deliver(e.flight.piece.key.first, last)
        if batch.sink_batch is None and batch.entries:
            chunks = [c.batch for e in batch.entries for c in e.flight.chunks]
            pieces = tuple(e.flight.piece for e in batch.entries)
            batch.sink_batch = SinkBatch(
                batch_id_of([p.key for p in pieces]),
                pieces,
                pa.Table.from_batches(chunks, schema=SCHEMA),
                {e.lane.lease_key: e.token for e in batch.entries},
                to_df=self._to_df,
            )

    def _write_once(self, sink_batch: SinkBatch) -> None:
        sink_batch.attempt += 1
        tag = f"kclpy-spark-{sink_batch.batch_id:016x}-{sink_batch.attempt}"
        fired = threading.Event()

        def on_timeout() -> None:
            fired.set()
            log.warning("batch %s overran the %.0fs write timeout", tag, self._s.write_timeout)
            self._interrupter.interrupt(tag)

        timer = threading.Timer(self._s.write_timeout, on_timeout)
        timer.daemon = True
        with self._interrupter.tagged(tag):
            timer.start()
            try:
                self._sink.write(sink_batch)
            except Exception as exc:
                if fired.is_set():
                    raise WriteTimeoutError(
                        f"batch {sink_batch.batch_id} overran {self._s.write_timeout}s: {exc!r}"
                    ) from exc
                raise
            finally:
                timer.cancel()

    # --- outcomes --------------------------------------------------------------------------------

    def _written(self, batch: PlannedBatch, outcome: str = "written") -> None:
        batch.outcome = outcome
        rows = batch.sink_batch.rows if batch.sink_batch is not None else 0
        with self._cond:
            if outcome == "written":
                self._stats.batches += 1
                self._stats.rows += rows
            for e in batch.entries:
                key = e.lane.lease_key
                self._stats.by_lease_rows[key] = self._stats.by_lease_rows.get(key, 0) + (
                    e.flight.piece.rows
                )
        for e in batch.entries:
            with self._cond:
                if e.lane.state is LaneState.CLOSED:
                    continue
                acked = e.flight.handle is not None and e.flight.handle.ack()
                if not acked:
                    log.error("lease %s: acknowledgment refused; re-forming", e.lane.lease_key)
                    e.lane.requeue(e.flight, batch.group, e.token, self._clock.monotonic())
                    continue
                position = e.lane.tracker.checkpointable()
            if position != e.flight.piece.key.last:
                log.error(
                    "lease %s: acked prefix %s, piece ends %s",
                    e.lane.lease_key,
                    position,
                    e.flight.piece.key.last,
                )
            self._commit(e.lane, e.flight)

    def _commit(self, lane: Lane, flight: InFlight) -> None:
        """Checkpoint at the written piece's end (clears the pending checkpoint)."""
        started = time.perf_counter()
        try:
            assert flight.prepared is not None
            flight.prepared.checkpoint()
        except CheckpointError as exc:
            with self._cond:
                if exc.value == SHUTDOWN or lane.state is LaneState.CLOSED:
                    self._close(lane)
                elif exc.retry_may_help:
                    lane.uncommitted = flight
                    lane.commit_retry_at = self._clock.monotonic() + self._s.commit_retry_delay
                else:
                    lane.state = LaneState.PARKED
                    lane.park_reason = f"checkpoint failed: {exc}"
                    lane.requeue(flight, (flight.piece.key,), None, self._clock.monotonic())
                self._cond.notify_all()
            log.warning("lease %s: checkpoint after the write failed: %s", lane.lease_key, exc)
            return
        with self._cond:
            if lane.inflight is flight:
                lane.inflight = None
            lane.uncommitted = None
            self._stats.commits += 1
            self._stats.commit_seconds += time.perf_counter() - started
            self._cond.notify_all()

    def retry_commit(self, lane: Lane) -> None:
        flight = lane.uncommitted
        if flight is not None:
            self._commit(lane, flight)

    def park(self, batch: PlannedBatch, error: BaseException) -> None:
        """Give up on the batch: nothing is checkpointed, each piece waits at the head of its
        lane to be re-formed, and the lanes are PARKED until the lease is parked or re-armed."""
        batch.outcome = "parked"
        log.error(
            "%r: giving up after %d attempts (%r); parking its leases",
            batch,
            self._s.max_attempts,
            error,
        )
        now = self._clock.monotonic()
        with self._cond:
            self._stats.parked_batches += 1
            for e in batch.entries:
                if e.lane.state is LaneState.CLOSED:
                    continue
                if e.flight.handle is not None:
                    e.flight.handle.nack()
                e.lane.tracker.rewind()
                e.lane.requeue(e.flight, batch.group, e.token, now)
                e.lane.state = LaneState.PARKED
                e.lane.park_reason = repr(error)
            self._cond.notify_all()

    def _lost(self, entry: Entry, exc: BaseException) -> None:
        with self._cond:
            if isinstance(exc, CheckpointError) and exc.value != SHUTDOWN:
                entry.lane.requeue(
                    entry.flight, (entry.flight.piece.key,), entry.token, self._clock.monotonic()
                )
                entry.lane.state = LaneState.PARKED
                entry.lane.park_reason = f"cannot prepare the checkpoint: {exc}"
            else:
                self._close(entry.lane)
            self._cond.notify_all()

    @staticmethod
    def _close(lane: Lane) -> None:
        lane.state = LaneState.CLOSED
        lane.drop()
        lane.inflight = lane.uncommitted = None
