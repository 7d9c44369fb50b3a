"""Writing one batch: the I/O only. Sink tokens and pending checkpoints, write attempts with
backoff and a timeout, the dead-letter write, and the checkpoint commits. Every change of a lane's
state goes back through ``LaneEvents`` (the MicroBatcher, which holds its lock and owns the lanes).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from tenacity import RetryCallState, Retrying, stop_after_attempt
from tenacity.stop import stop_base

from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.checkpointer import CheckpointError, PreparedCheckpoint
from kclpy_spark.spark.batch import BatchSink, Interrupter, SinkBatch, ToDataFrame
from kclpy_spark.spark.lane import Cut, Lane
from kclpy_spark.spark.pieces import SCHEMA, PendingState, PieceKey, batch_id_of
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.watchdog import Watchdog

log = logging.getLogger(__name__)


class WriteTimeoutError(KclpySparkError):
    """A write attempt overran ``write_timeout``; its Spark jobs were interrupted."""

    retriable = True


class DeadLetterWriter(Protocol):
    def write(self, batch: SinkBatch, error: BaseException) -> None:
        """Store the batch durably with the error; raise if that failed."""
        ...


@dataclass(eq=False)
class Batch:
    """One micro-batch: a cut of each of its lanes, sorted by piece key."""

    parts: list[tuple[Lane, Cut]]
    sink_batch: SinkBatch | None = None
    tokens_ready: bool = False
    prepared: set[int] = field(default_factory=set)  # id() of the cuts whose pending is written
    error: BaseException | None = None  # the last failure, once given up
    outcome: str = "pending"  # written | dead-lettered | parked | abandoned

    @property
    def group(self) -> tuple[PieceKey, ...]:
        return tuple(sorted(cut.key for _, cut in self.parts))

    def __repr__(self) -> str:
        keys = ", ".join(f"{k.lease_key}[{k.first}..{k.last}]" for k in self.group)
        return f"Batch({keys})"


class LaneEvents(Protocol):
    """What the writer tells the batcher; each call changes lanes under the batcher's lock."""

    def tokened(self, lane: Lane, cut: Cut, token: Any) -> None: ...

    def prepared(self, lane: Lane, cut: Cut, checkpoint: PreparedCheckpoint) -> None: ...

    def not_prepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None: ...

    def all_closed(self, batch: Batch) -> bool: ...

    def attempt(self, error: BaseException | None, prepare_s: float, write_s: float) -> None: ...

    def written(self, batch: Batch, *, dead_lettered: bool) -> list[tuple[Lane, Cut]]: ...

    def committed(self, lane: Lane, cut: Cut, seconds: float) -> None: ...

    def commit_failed(self, lane: Lane, cut: Cut, error: Exception) -> None: ...

    def gave_up(self, batch: Batch, error: BaseException) -> None: ...


class _LanesGone(stop_base):
    """Stop retrying once every lease of the batch is lost: their next owners write it."""

    def __init__(self, batch: Batch, events: LaneEvents) -> None:
        self._batch = batch
        self._events = events

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self._events.all_closed(self._batch)


class BatchWriter:
    def __init__(
        self,
        sink: BatchSink,
        settings: BatcherSettings,
        events: LaneEvents,
        *,
        to_df: ToDataFrame | None,
        interrupter: Interrupter,
        dead_letter: DeadLetterWriter | None,
        sleep: Callable[[float], None],
        watchdog: Watchdog | None = None,
    ) -> None:
        self._sink = sink
        self._s = settings
        self._events = events
        self._to_df = to_df
        self._interrupter = interrupter
        self._dead_letter = dead_letter
        self._sleep = sleep
        self.watchdog = watchdog or Watchdog(callback_threads=settings.writers)
        self._backoff = Backoff(base=settings.retry_base_delay, cap=settings.retry_max_delay)

    # --- one batch -------------------------------------------------------------------------------

    def run(self, batch: Batch) -> None:
        retrying = Retrying(
            stop=stop_after_attempt(self._s.max_attempts) | _LanesGone(batch, self._events),
            wait=lambda state: self._backoff.delay(state.attempt_number),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda state: self._log_retry(batch, state),
        )
        try:
            retrying(self._attempt, batch)
        except Exception as exc:
            batch.error = exc
        else:
            if batch.parts:
                self._commit_all(batch, dead_lettered=False)
            else:
                batch.outcome = "abandoned"  # every lease was lost before its write
            return
        if self._events.all_closed(batch):
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
                self._commit_all(batch, dead_lettered=True)
                return
        batch.outcome = "parked"
        self._events.gave_up(batch, batch.error)

    def _log_retry(self, batch: Batch, state: RetryCallState) -> None:
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

    def _attempt(self, batch: Batch) -> None:
        started = time.perf_counter()
        prepared = started
        try:
            self._prepare(batch)
            prepared = time.perf_counter()
            if batch.parts:
                assert batch.sink_batch is not None
                self._write_once(batch.sink_batch)
        except Exception as exc:
            self._events.attempt(exc, prepared - started, time.perf_counter() - prepared)
            raise
        self._events.attempt(None, prepared - started, time.perf_counter() - prepared)

    def _prepare(self, batch: Batch) -> None:
        """Tokens, then each cut's pending checkpoint (once per batch), then the SinkBatch."""
        if not batch.tokens_ready:
            fresh = [cut.piece for _, cut in batch.parts if not cut.replayed]
            tokens = self._sink.prepare(fresh) if fresh else {}
            for lane, cut in batch.parts:
                if not cut.replayed:
                    self._events.tokened(lane, cut, tokens.get(lane.lease_key))
            batch.tokens_ready = True
        while not self._prepare_pending(batch):
            # A cut left the batch: the pending checkpoints written so far name the old
            # composition, so the survivors' are written again with the new one.
            batch.prepared.clear()
            batch.sink_batch = None
        if batch.sink_batch is None and batch.parts:
            chunks = [c.batch for _, cut in batch.parts for c in cut.chunks]
            pieces = tuple(cut.piece for _, cut in batch.parts)
            batch.sink_batch = SinkBatch(
                batch_id_of([p.key for p in pieces]),
                pieces,
                pa.Table.from_batches(chunks, schema=SCHEMA),
                {lane.lease_key: cut.token for lane, cut in batch.parts},
                to_df=self._to_df,
            )

    def _prepare_pending(self, batch: Batch) -> bool:
        """Write the pending checkpoint of each cut not yet prepared; False when a cut had to
        leave the batch (its lease cannot take a checkpoint any more)."""
        for lane, cut in list(batch.parts):
            if id(cut) in batch.prepared:
                continue
            last = cut.key.last
            state = PendingState(batch.group, cut.token).encode()
            try:
                checkpoint = lane.checkpointer.prepare_checkpoint(
                    last.sequence_number, last.sub_sequence_number, state
                )
            except CheckpointError as exc:
                if exc.retry_may_help:
                    raise
                log.warning("lease %s: cannot prepare its checkpoint (%s)", lane.lease_key, exc)
                self._events.not_prepared(lane, cut, exc)
                batch.parts.remove((lane, cut))
                return False
            batch.prepared.add(id(cut))
            self._events.prepared(lane, cut, checkpoint)
        return True

    def _write_once(self, sink_batch: SinkBatch) -> None:
        sink_batch.attempt += 1
        tag = f"kclpy-spark-{sink_batch.batch_id:016x}-{sink_batch.attempt}"

        def on_timeout() -> None:
            log.warning("batch %s overran the %.0fs write timeout", tag, self._s.write_timeout)
            self._interrupter.interrupt(tag)

        with self._interrupter.tagged(tag):
            deadline = self.watchdog.after(self._s.write_timeout, on_timeout)
            try:
                self._sink.write(sink_batch)
            except Exception as exc:
                if deadline.fired.is_set():
                    raise WriteTimeoutError(
                        f"batch {sink_batch.batch_id} overran {self._s.write_timeout}s: {exc!r}"
                    ) from exc
                raise
            finally:
                deadline.cancel()

    # --- commits ---------------------------------------------------------------------------------

    def _commit_all(self, batch: Batch, *, dead_lettered: bool) -> None:
        batch.outcome = "dead-lettered" if dead_lettered else "written"
        for lane, cut in self._events.written(batch, dead_lettered=dead_lettered):
            self.commit(lane, cut)

    def commit(self, lane: Lane, cut: Cut) -> None:
        """Checkpoint at the written cut's end (clears the pending checkpoint)."""
        started = time.perf_counter()
        try:
            assert cut.prepared is not None
            cut.prepared.checkpoint()
        except Exception as exc:  # anything else than a CheckpointError is retried later
            log.warning("lease %s: checkpoint after the write failed: %r", lane.lease_key, exc)
            self._events.commit_failed(lane, cut, exc)
            return
        self._events.committed(lane, cut, time.perf_counter() - started)
