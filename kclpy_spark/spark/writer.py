"""Writing one batch: the I/O only. Sink tokens and pending checkpoints, write attempts on each
sink with backoff and a timeout, the dead-letter writes, and the checkpoint commits. Every change
of a lane's state goes back through ``LaneEvents`` (the MicroBatcher, which holds its lock and owns
the lanes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_not_exception_type,
    stop_after_attempt,
)
from tenacity.stop import stop_base

from checkpoint.base.durability import SyncError, durable_on_exit
from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.checkpointer import CheckpointError
from kclpy_spark.spark.acks import DEAD_LETTERED, FAILED, WRITTEN, AckSet, PrepareFailedError
from kclpy_spark.spark.batch_life import Batch, LaneEvents
from kclpy_spark.spark.batch_prep import BatchPreparer, is_wrapped, stored_token
from kclpy_spark.spark.frames import RangeChunk, stored_rows_lost
from kclpy_spark.spark.lane import Cut, Lane
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.sink_batch import (
    BatchSink,
    DeadLetterWriter,
    Interrupter,
    RetiresTokens,
    SinkBatch,
    SinkRoute,
    ToDataFrame,
    needs_order,
)
from kclpy_spark.spark.timed_write import (
    TimedWrites,
    WriteHungError,
    WriteThreadsClosedError,
    WriteTimeoutError,
)
from kclpy_spark.spark.watchdog import Watchdog

__all__ = [
    "Batch",
    "BatchWriter",
    "DeadLetterWriter",
    "LaneEvents",
    "WriteHungError",
    "WriteTimeoutError",
]

log = logging.getLogger(__name__)


class LeasesGoneError(KclpySparkError):
    """Every lease of a batch was lost between two of its attempts: no more attempts here."""


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
        parse: Callable[[Any], Any] = lambda df: df,
        interrupter: Interrupter,
        sleep: Callable[[float], None],
        watchdog: Watchdog | None = None,
    ) -> None:
        if not routes or len({r.name for r in routes}) != len(routes):
            raise ValueError("a BatchWriter needs sinks with distinct names")
        self._routes = tuple(routes)
        self._s = settings
        self._events = events
        self._sleep = sleep
        self._timed = TimedWrites(settings.writers, interrupter, watchdog)
        # A sink's prepare and a dead-letter write, timed as writes on threads of their own: on
        # the write threads, the writes hung already (up to their cap) would refuse the very
        # dead-letter write that lets a lease go on past a stuck sink.
        self._side = TimedWrites(
            settings.writers, interrupter, self._timed.watchdog, name="kclpy-spark-sink-write-side"
        )
        self._prep = BatchPreparer(self._routes, events, self._side, to_df, parse)
        self._backoff = Backoff(base=settings.retry_base_delay, cap=settings.retry_max_delay)

    @property
    def sink_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._routes)

    @property
    def watchdog(self) -> Watchdog:
        return self._timed.watchdog

    @property
    def write_threads(self) -> int:
        """Sink-write threads alive: ``writers`` plus the writes still hung."""
        return self._timed.threads.alive

    @property
    def max_hung_writes(self) -> int:
        return self._timed.threads.max_hung

    @property
    def hung_writes(self) -> int:
        """Writes given up on (no answer within timeout and grace) that are still running
        (sink writes; prepares and dead-letter writes hang on threads of their own, capped
        alike)."""
        return self._timed.threads.hung

    def close(self) -> None:
        """Writes not started are not started any more (their batch is abandoned, not failed);
        a write under way finishes on its own thread."""
        self._timed.close()
        self._side.threads.close()

    # --- one batch -------------------------------------------------------------------------------

    def run(self, batch: Batch) -> None:
        acks = batch.acks = AckSet(self.sink_names)
        try:
            if self._prepared_with_retries(batch):
                for route in self._routes:
                    if not self._run_route(batch, route, acks):
                        break
        except WriteThreadsClosedError:
            log.warning("%r: not written, the sink is closing; its next owner writes it", batch)
            self._events.abandoned(batch)
            return
        if acks.done and batch.parts:
            self._commit_all(batch, dead_lettered=acks.dead_lettered)
            return
        batch.error = acks.error() or batch.error
        if not batch.parts or self._events.all_closed(batch):
            log.warning("%r: every lease was lost; their next owners write it", batch)
            self._events.abandoned(batch)
            return
        assert batch.error is not None
        # The records are not lost, only their copy: read again (up to a budget).
        if _rereadable(batch, batch.error) and self._events.reread(batch, batch.error):
            return
        self._events.gave_up(batch, batch.error)

    def _retrying(self, batch: Batch, attempts: int, route: SinkRoute | None) -> Retrying:
        """Retries with backoff until ``attempts``, every lease of the batch lost, the sink
        closing, a write of this batch hung (not resubmitted while it may still run), the rows
        its reads stored on the executors gone (the same write would fail again), or the lease
        table's disk failing a sync (pending checkpoints written again would not be durable)."""
        return Retrying(
            stop=stop_after_attempt(attempts) | _LanesGone(batch, self._events),
            retry=retry_if_not_exception_type((WriteThreadsClosedError, WriteHungError, SyncError))
            & retry_if_exception(lambda exc: not _rereadable(batch, exc)),
            wait=lambda state: self._backoff.delay(state.attempt_number),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda state: self._log_retry(batch, route, attempts, state),
        )

    def _prepared_with_retries(self, batch: Batch) -> bool:
        """Tokens and pending checkpoints before any sink writes (retried as a write is);
        False when the batch was given up on here. Each try's own time (not the backoff between
        tries) counts once toward ``prepare_seconds``, a successful one too."""
        spent = [0.0]

        def prepare(batch: Batch) -> None:
            started = time.perf_counter()
            try:
                self._prep.prepare(batch)
            finally:
                spent[0] += time.perf_counter() - started

        while True:
            spent[0] = 0.0
            try:
                self._retrying(batch, self._s.max_attempts, None)(prepare, batch)
                self._events.attempt(None, spent[0], 0.0)
                break
            except WriteThreadsClosedError:
                raise  # closing: the batch is abandoned, not failed
            except Exception as exc:
                self._events.attempt(exc, spent[0], 0.0)
                if self._dead_letters_unprepared(batch, exc):
                    continue  # prepared again without that sink
                if self._leaves_unprepared(batch, exc):
                    continue  # prepared again without that lease
                batch.error = exc
                return False
        self._events.batch_prepared(batch)
        return True

    def _leaves_unprepared(self, batch: Batch, exc: BaseException) -> bool:
        """One lease's pending checkpoint kept failing with errors a retry may mend (its item
        throttled) while another lease's of the batch was written: that lease leaves the batch
        and parks, the others go on (True). It gave up on the whole batch, parking every lease
        of it (in worker scope, every lease of the worker). Only where each pending checkpoint
        names its own piece alone (the built-in sinks): where it names the whole batch, one
        that leaves would change the batch re-formed after a crash (a function keyed by
        batch_id got a new id); and not when no other lease's was written (the whole table
        refusing: shed one at a time, the batch waited a round of retries for each lease)."""
        part = getattr(exc, "unprepared", None)
        if not isinstance(exc, CheckpointError) or not self._prep.own_groups:
            return False
        others = [p for p in batch.parts if p != part]
        if part not in batch.parts or not any(id(c) in batch.prepared for _, c in others):
            return False
        lane, cut = part
        log.warning("%r: lease %s leaves it, its pending checkpoint kept failing (%s)",
                    batch, lane.lease_key, exc)  # fmt: skip
        self._events.leave_unprepared(lane, cut, exc)
        batch.parts.remove(part)
        batch.sink_batch = None  # made again without it (the others' pending name them alone)
        return True

    def _dead_letters_unprepared(self, batch: Batch, exc: BaseException) -> bool:
        """A sink's prepare gave up and its failure policy dead-letters: the batch goes to its
        dead letter instead of that sink (True), as a write that gave up would."""
        if not isinstance(exc, PrepareFailedError) or exc.sink in batch.unprepared:
            return False
        route = next(r for r in self._routes if r.name == exc.sink)
        if route.dead_letter is None:
            return False
        log.error("%r: sink %r could not prepare it (%s); it goes to the sink's dead letter",
                  batch, route.name, exc.error)  # fmt: skip
        batch.unprepared[route.name] = exc.error
        return True

    def _run_route(self, batch: Batch, route: SinkRoute, acks: AckSet) -> bool:
        """Write the batch to one sink, with its retries and failure policy; True when the sink
        answered positively (written, or dead-lettered)."""
        unprepared = batch.unprepared.get(route.name)
        if unprepared is not None:  # its prepare gave up: nothing of it was written
            batch.error = unprepared
            dead = self._dead_letter(batch, route, unprepared) and self._retire_tokens(batch, route)
            self._answer(acks, route, DEAD_LETTERED if dead else FAILED, unprepared)
            return dead
        try:
            self._retrying(batch, route.max_attempts, route)(self._attempt, batch, route)
        except WriteThreadsClosedError:
            raise
        except Exception as exc:
            batch.error = exc
            # Rows lost on the executors are read again, not dead-lettered (nor could they be).
            # A hung write to a sink that keeps a lease's batches in order is not dead-lettered
            # either: it may still commit (delta: its version), and the lease's next batch,
            # prepared once this one is acknowledged, would get the same version and be skipped
            # as committed when it lands. Failed instead (parked), the batch keeps its version.
            hung_in_order = isinstance(exc, WriteHungError) and needs_order(route.sink)
            if hung_in_order:
                log.error("%r: its write%s to a sink that keeps batches in order hung and may "
                          "still commit; not dead-lettered", batch, self._of(route))  # fmt: skip
            if (
                not (_rereadable(batch, exc) or hung_in_order)
                and self._dead_letter(batch, route, exc)
                and self._retire_tokens(batch, route)
            ):
                self._answer(acks, route, DEAD_LETTERED, exc)
                return True
            self._answer(acks, route, FAILED, exc)
            return False
        self._answer(acks, route, WRITTEN)
        return True

    def _answer(
        self, acks: AckSet, route: SinkRoute, outcome: str, error: BaseException | None = None
    ) -> None:
        acks.answer(route.name, outcome, error)
        self._events.answered(route.name, outcome)  # counted by sink

    def _dead_letter(self, batch: Batch, route: SinkRoute, error: BaseException) -> bool:
        """The sink's failure policy: True when the batch is now in its dead-letter location."""
        if route.dead_letter is None or batch.sink_batch is None or self._events.all_closed(batch):
            return False
        view = self._view(batch, route)
        dead_letter = route.dead_letter
        try:
            # Timed as a write: on the executor path it collects the batch from Spark, right
            # after a write timed out (when the cluster is least likely to answer).
            self._side.call(
                lambda: dead_letter.write(view, error),
                route.write_timeout,
                f"kclpy-spark-{view.batch_id:016x}-{self._routes.index(route)}-dead-letter",
                f"the dead-letter write of batch {view.batch_id}{self._of(route)}",
            )
        except WriteThreadsClosedError:
            raise
        except Exception:
            log.exception("%r: the dead-letter write%s failed too", batch, self._of(route))
            return False
        log.error("%r went to the dead-letter location%s after: %r", batch, self._of(route), error)
        return True

    def _retire_tokens(self, batch: Batch, route: SinkRoute) -> bool:
        """A dead-lettered batch's tokens made used (``RetiresTokens``: Delta's versions), timed
        as a write; False if that failed (then not acknowledged: failed, parked). Only for a
        batch with a piece re-formed from a pending checkpoint: a write of it from an earlier
        tenure may still commit. Otherwise no write of the batch can outlive it (a hung one
        is not dead-lettered), and a table that does not answer still lets it dead-letter."""
        sink = route.sink
        if not isinstance(sink, RetiresTokens) or batch.sink_batch is None:
            return True
        if not any(cut.replayed for _, cut in batch.parts):
            return True
        view = self._view(batch, route)
        try:
            self._side.call(
                lambda: sink.retire_tokens(view),
                route.write_timeout,
                f"kclpy-spark-{view.batch_id:016x}-{self._routes.index(route)}-retire",
                f"retiring the versions of dead-lettered batch {view.batch_id}{self._of(route)}",
            )
        except WriteThreadsClosedError:
            raise
        except Exception:
            log.exception("%r: its versions%s could not be retired; not acknowledged", batch,
                          self._of(route))  # fmt: skip
            return False
        return True

    def _of(self, route: SinkRoute) -> str:
        return f" of sink {route.name!r}" if len(self._routes) > 1 else ""

    def _log_retry(
        self, batch: Batch, route: SinkRoute | None, attempts: int, state: RetryCallState
    ) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "%r: %s %d of %d%s failed (%r); retrying in %.1fs",
            batch,
            "attempt" if route else "preparing (tokens, pending checkpoints), attempt",
            state.attempt_number,
            attempts,
            self._of(route) if route else "",
            exc,
            delay,
        )

    def _attempt(self, batch: Batch, route: SinkRoute) -> None:
        if batch.attempts.get(route.name) and self._events.all_closed(batch):
            # Every lease went during the backoff: their next owners write it (a function keyed
            # by batch_id may be writing it now), not this worker.
            raise LeasesGoneError(f"{batch!r}: every lease was lost before its next attempt")
        started = time.perf_counter()
        prepared = started
        sink = ""  # named once the sink is called: its own figures count only its writes
        try:
            self._prep.prepare(batch)
            prepared = time.perf_counter()
            if batch.parts:
                batch.attempts[route.name] = batch.attempts.get(route.name, 0) + 1
                sink = route.name
                self._write_once(self._view(batch, route), route)
        except Exception as exc:
            self._events.attempt(exc, prepared - started, time.perf_counter() - prepared, sink)
            raise
        self._events.attempt(None, prepared - started, time.perf_counter() - prepared, sink)

    def _view(self, batch: Batch, route: SinkRoute) -> SinkBatch:
        """The batch as one sink sees this attempt: its own tokens and attempt count (a copy:
        a write given up on may still be reading the one it was given)."""
        assert batch.sink_batch is not None
        several = len(self._routes) > 1
        tokens = {
            lane.lease_key: _token_of(route, cut.token, several=several)
            for lane, cut in batch.parts
        }
        attempt = batch.attempts.get(route.name, 0)
        return dataclasses.replace(batch.sink_batch, tokens=tokens, attempt=attempt)

    def _write_once(self, view: SinkBatch, route: SinkRoute) -> None:
        index = self._routes.index(route)
        self._timed.write(route.sink, view, route.write_timeout, f"{index}", self._of(route))

    # --- commits ---------------------------------------------------------------------------------

    def _commit_all(self, batch: Batch, *, dead_lettered: bool) -> None:
        """The batch's checkpoints, with one wait for the disk. Nothing waits on them being
        durable: one lost to a power cut leaves its pending checkpoint, whose pieces the sinks
        skip as written; a later write's wait (the next batch's) covers them too."""
        try:
            with durable_on_exit():
                for lane in self._events.written(batch, dead_lettered=dead_lettered):
                    self.commit(lane)
        except SyncError as exc:
            log.warning("%r: its checkpoints are written, maybe not on disk yet: %s", batch, exc)

    def commit_claimed(self, claimed: Sequence[tuple[Lane, Cut]]) -> None:
        """Commit each lane's claimed cut in turn. If one raises, the claims not tried yet are
        released before it propagates: a claim left standing would hold that lane's checkpoint
        back for good."""
        for i, (lane, cut) in enumerate(claimed):
            try:
                self.commit(lane, cut)
            except BaseException:
                for other, other_cut in claimed[i + 1 :]:
                    self._events.release_claim(other, other_cut)
                raise

    def commit(self, lane: Lane, claimed: Cut | None = None) -> None:
        """Move the lane's checkpoint over its written prefix (``claimed``: already claimed),
        then over what was written meanwhile, until nothing more is ready. A pending checkpoint
        beyond it (cuts still being written) stays."""
        cut = claimed or self._events.claim_commit(lane)
        while cut is not None:
            try:
                if not self._commit_cut(lane, cut):
                    return
            except BaseException:
                self._events.release_claim(lane, cut)
                raise
            cut = self._events.claim_commit(lane)

    def _commit_cut(self, lane: Lane, cut: Cut) -> bool:
        """One claimed commit, settled either way; False if it failed (retried later)."""
        started = time.perf_counter()
        last = cut.key.last
        try:
            lane.checkpointer.checkpoint_keeping_pending(
                last.sequence_number, last.sub_sequence_number
            )
        except Exception as exc:  # anything else than a CheckpointError is retried later
            log.warning("lease %s: checkpoint after the write failed: %r", lane.lease_key, exc)
            self._events.commit_failed(lane, cut, exc)
            return False
        self._events.committed(lane, cut, time.perf_counter() - started)
        return True


def _rereadable(batch: Batch, error: BaseException) -> bool:
    """The batch was read on the executors and ``error`` says the rows stored there are gone:
    its records are read again (pinned), not its write tried again."""
    chunks = [c for _, cut in batch.parts for c in cut.chunks]
    return (
        bool(chunks) and all(isinstance(c, RangeChunk) for c in chunks) and stored_rows_lost(error)
    )


def _token_of(route: SinkRoute, token: Any, *, several: bool) -> Any:
    """A lease's token for one sink. With several sinks the stored token is ``{BY_SINK: {name:
    token}}``; with one, the sink's own. A piece re-formed from a pending checkpoint written under
    another list of sinks has no token for this one: it gets None (Delta then takes the next
    version, so drain before changing the sinks: a clean stop leaves no pending checkpoint)."""
    if several == is_wrapped(token):
        return stored_token(token, route.name, several=several)
    if token is not None:
        log.warning(
            "a re-formed piece's sink token was stored under another list of sinks; sink %r "
            "gets none (a sink that is not idempotent per piece may write it twice)",
            route.name,
        )
    return None
