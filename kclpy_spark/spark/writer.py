"""Writing one batch: the I/O only. Sink tokens and pending checkpoints, write attempts on each
sink with backoff and a timeout, the dead-letter writes, and the checkpoint commits. Every change
of a lane's state goes back through ``LaneEvents`` (the MicroBatcher, which holds its lock and owns
the lanes).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from tenacity import RetryCallState, Retrying, stop_after_attempt
from tenacity.stop import stop_base

from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.checkpointer import CheckpointError, PreparedCheckpoint
from kclpy_spark.spark.acks import DEAD_LETTERED, FAILED, WRITTEN, AckSet
from kclpy_spark.spark.batch import (
    BatchSink,
    DeadLetterWriter,
    Interrupter,
    SinkBatch,
    SinkRoute,
    ToDataFrame,
)
from kclpy_spark.spark.lane import Cut, Lane
from kclpy_spark.spark.pieces import SCHEMA, PendingState, PieceKey, batch_id_of
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.watchdog import Watchdog

__all__ = ["Batch", "BatchWriter", "DeadLetterWriter", "LaneEvents", "WriteTimeoutError"]

log = logging.getLogger(__name__)


class WriteTimeoutError(KclpySparkError):
    """A write attempt overran its sink's ``write_timeout``: its Spark jobs were interrupted, or it
    gave no answer at all (then it is abandoned, left running in its thread)."""

    retriable = True


# A write that overran its timeout gets this long (at most its timeout again) to end after its
# Spark jobs were interrupted; after that it counts as failed and is abandoned.
HUNG_GRACE = 30.0


@dataclass(eq=False)
class Batch:
    """One micro-batch: a cut of each of its lanes, sorted by piece key."""

    parts: list[tuple[Lane, Cut]]
    sink_batch: SinkBatch | None = None
    tokens_ready: bool = False
    prepared: set[int] = field(default_factory=set)  # id() of the cuts whose pending is written
    error: BaseException | None = None  # the last failure, once given up
    outcome: str = "pending"  # written | dead-lettered | parked | abandoned
    acks: AckSet | None = None  # the sinks' answers
    attempts: dict[str, int] = field(default_factory=dict)  # write attempts by sink name

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


def single_route(
    sink: BatchSink, settings: BatcherSettings, dead_letter: DeadLetterWriter | None = None
) -> SinkRoute:
    """The one sink of an application with a ``[sink]`` table, with the batcher's policy."""
    return SinkRoute("sink", sink, settings.max_attempts, settings.write_timeout, dead_letter)


class BatchWriter:
    """Writes a batch to every sink in turn; the checkpoint moves once each answered positively
    (acks.py). A sink that answered is not asked again for this batch; the first sink that fails
    for good stops the batch (the sinks after it are not written: the records come again)."""

    def __init__(
        self,
        routes: Sequence[SinkRoute],
        settings: BatcherSettings,
        events: LaneEvents,
        *,
        to_df: ToDataFrame | None,
        interrupter: Interrupter,
        sleep: Callable[[float], None],
        watchdog: Watchdog | None = None,
    ) -> None:
        if not routes or len({r.name for r in routes}) != len(routes):
            raise ValueError("a BatchWriter needs sinks with distinct names")
        self._routes = tuple(routes)
        self._s = settings
        self._events = events
        self._to_df = to_df
        self._interrupter = interrupter
        self._sleep = sleep
        self.watchdog = watchdog or Watchdog(callback_threads=settings.writers)
        self._backoff = Backoff(base=settings.retry_base_delay, cap=settings.retry_max_delay)
        # Sink writes run on these threads (one per writer, long-lived: Spark keeps a JVM thread
        # per Python thread) so that a write that never answers can be given up on. Such a write
        # keeps its thread and the pool is replaced: threads = writers + writes still hung.
        self._pool_lock = threading.Lock()
        self._pool = self._new_pool()
        self._hung: set[Future[None]] = set()
        self._used: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # threads that wrote

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self._s.writers, thread_name_prefix="kclpy-spark-sink-write")

    @property
    def sink_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._routes)

    @property
    def write_threads(self) -> int:
        """Sink-write threads alive: at most ``writers`` plus the writes still hung."""
        with self._pool_lock:
            return sum(t.is_alive() for t in list(self._used))

    @property
    def hung_writes(self) -> int:
        """Writes given up on (no answer within timeout and grace) that are still running."""
        with self._pool_lock:
            return len(self._hung)

    def close(self) -> None:
        self.watchdog.close()
        with self._pool_lock:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # --- one batch -------------------------------------------------------------------------------

    def run(self, batch: Batch) -> None:
        acks = batch.acks = AckSet(self.sink_names)
        for route in self._routes:
            if not self._run_route(batch, route, acks):
                break
        if acks.done:
            if batch.parts:
                self._commit_all(batch, dead_lettered=acks.dead_lettered)
            else:
                batch.outcome = "abandoned"  # every lease was lost before its write
            return
        batch.error = acks.error() or batch.error
        if self._events.all_closed(batch):
            batch.outcome = "abandoned"
            log.warning("%r: every lease was lost; their next owners write it", batch)
            return
        assert batch.error is not None
        batch.outcome = "parked"
        self._events.gave_up(batch, batch.error)

    def _run_route(self, batch: Batch, route: SinkRoute, acks: AckSet) -> bool:
        """Write the batch to one sink, with its retries and failure policy; True when the sink
        answered positively (written, or dead-lettered)."""
        retrying = Retrying(
            stop=stop_after_attempt(route.max_attempts) | _LanesGone(batch, self._events),
            wait=lambda state: self._backoff.delay(state.attempt_number),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda state: self._log_retry(batch, route, state),
        )
        try:
            retrying(self._attempt, batch, route)
        except Exception as exc:
            batch.error = exc
            if self._dead_letter(batch, route, exc):
                acks.answer(route.name, DEAD_LETTERED, exc)
                return True
            acks.answer(route.name, FAILED, exc)
            return False
        acks.answer(route.name, WRITTEN)
        return True

    def _dead_letter(self, batch: Batch, route: SinkRoute, error: BaseException) -> bool:
        """The sink's failure policy: True when the batch is now in its dead-letter location."""
        if route.dead_letter is None or batch.sink_batch is None or self._events.all_closed(batch):
            return False
        try:
            route.dead_letter.write(self._view(batch, route), error)
        except Exception:
            log.exception("%r: the dead-letter write%s failed too", batch, self._of(route))
            return False
        log.error("%r went to the dead-letter location%s after: %r", batch, self._of(route), error)
        return True

    def _of(self, route: SinkRoute) -> str:
        return f" of sink {route.name!r}" if len(self._routes) > 1 else ""

    def _log_retry(self, batch: Batch, route: SinkRoute, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%r: attempt %d of %d%s failed (%r); retrying in %.1fs",
            batch,
            state.attempt_number,
            route.max_attempts,
            self._of(route),
            exc,
            delay,
        )

    def _attempt(self, batch: Batch, route: SinkRoute) -> None:
        started = time.perf_counter()
        prepared = started
        try:
            self._prepare(batch)
            prepared = time.perf_counter()
            if batch.parts:
                batch.attempts[route.name] = batch.attempts.get(route.name, 0) + 1
                self._write_once(self._view(batch, route), route)
        except Exception as exc:
            self._events.attempt(exc, prepared - started, time.perf_counter() - prepared)
            raise
        self._events.attempt(None, prepared - started, time.perf_counter() - prepared)

    def _view(self, batch: Batch, route: SinkRoute) -> SinkBatch:
        """The batch as one sink sees it: its own tokens and attempt count."""
        assert batch.sink_batch is not None
        if len(self._routes) == 1:
            batch.sink_batch.attempt = batch.attempts.get(route.name, 0)
            return batch.sink_batch
        tokens = {lane.lease_key: _token_of(route, cut.token) for lane, cut in batch.parts}
        attempt = batch.attempts.get(route.name, 0)
        return dataclasses.replace(batch.sink_batch, tokens=tokens, attempt=attempt)

    def _prepare(self, batch: Batch) -> None:
        """Tokens, then each cut's pending checkpoint (once per batch), then the SinkBatch."""
        if not batch.tokens_ready:
            fresh = [cut.piece for _, cut in batch.parts if not cut.replayed]
            given = {r.name: r.sink.prepare(fresh) if fresh else {} for r in self._routes}
            for lane, cut in batch.parts:
                if not cut.replayed:
                    by_sink = {name: t.get(lane.lease_key) for name, t in given.items()}
                    token = by_sink if len(self._routes) > 1 else next(iter(by_sink.values()))
                    self._events.tokened(lane, cut, token)
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

    def _write_once(self, view: SinkBatch, route: SinkRoute) -> None:
        """One attempt, on a sink-write thread: interrupted at ``write_timeout``; failed (and left
        running) when it has not answered after the grace that follows."""
        tag = f"kclpy-spark-{view.batch_id:016x}-{self._routes.index(route)}-{view.attempt}"
        timeout = route.write_timeout

        def on_timeout() -> None:
            log.warning("batch %s overran its %.0fs write timeout%s", tag, timeout, self._of(route))
            self._interrupter.interrupt(tag)

        deadline = self.watchdog.after(timeout, on_timeout)
        try:
            with self._pool_lock:
                future = self._pool.submit(self._tagged_write, route.sink, view, tag)
            wait([future], timeout + min(HUNG_GRACE, timeout))
            if not future.done():
                self._abandon(future)
                raise WriteTimeoutError(
                    f"batch {view.batch_id}{self._of(route)} gave no answer within {timeout:g}s "
                    "and the grace after it: counted as failed (the write is left running)"
                )
            try:
                future.result()
            except Exception as exc:
                if deadline.fired.is_set():
                    raise WriteTimeoutError(
                        f"batch {view.batch_id}{self._of(route)} overran {timeout:g}s: {exc!r}"
                    ) from exc
                raise
        finally:
            deadline.cancel()

    def _tagged_write(self, sink: BatchSink, view: SinkBatch, tag: str) -> None:
        with self._pool_lock:
            self._used.add(threading.current_thread())
        with self._interrupter.tagged(tag):
            sink.write(view)

    def _abandon(self, future: Future[None]) -> None:
        """Give up on a write that does not answer: a new pool serves the next writes (the old one
        lets its idle threads end; the hung thread ends when its write does)."""
        if future.cancel():
            return  # it had not started: nothing is left running
        with self._pool_lock:
            self._hung.add(future)
            old, self._pool = self._pool, self._new_pool()
        old.shutdown(wait=False)
        future.add_done_callback(self._unhung)
        log.error("a sink write gave no answer; abandoned (%d write(s) hung now)", self.hung_writes)

    def _unhung(self, future: Future[None]) -> None:
        with self._pool_lock:
            self._hung.discard(future)

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


def _token_of(route: SinkRoute, token: Any) -> Any:
    """A lease's token for one of several sinks: the stored token maps sink names to tokens (a
    piece re-formed from a pending checkpoint written with one sink has none for them)."""
    return token.get(route.name) if isinstance(token, Mapping) else None
