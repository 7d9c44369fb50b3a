"""The micro-batcher: gathers leases' records into batches, writes them, then acknowledges.

Records wait in per-lease *lanes* (lanes.py). A batch is due when its records reach
``max_records`` or ``max_bytes``, when its oldest record has waited ``max_wait``, when a lane must
be drained (shard end, shutdown), or when the buffer is full. In ``worker`` scope one batch takes
pieces of every lease that has records (throughput); in ``lease`` scope each batch is one lease's.

One batch, in a writer thread (writer.py does the steps):

1. ``sink.prepare`` gives each new piece its token; each piece's end and the batch's composition
   are written as the lease's *pending* checkpoint (``Checkpointer.prepare_checkpoint``), so a
   worker that takes the lease after a crash re-forms the identical piece (and, when it holds every
   lease of the batch, the identical batch: same ``batch_id``).
2. ``sink.write`` is attempted up to ``max_attempts`` times with exponential backoff and jitter;
   an attempt that overruns ``write_timeout`` has its Spark jobs interrupted.
3. On success each piece is acknowledged in its lease's ``AckTracker``, and the checkpoint is
   committed to the contiguous acknowledged prefix (``PreparedCheckpoint.checkpoint``). On failure
   nothing is committed: the failure policy dead-letters the batch (then acknowledges it) or parks
   its leases (``SinkParkedError`` from the next ``process_records``; the consumer parks the lease
   and it is redelivered from the checkpoint when it reopens).

A lease has at most one piece in flight: its next piece's pending checkpoint could otherwise
overwrite the one that makes the first piece replayable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from checkpoint.acks import AckTracker
from checkpoint.base.clock import Clock, SystemClock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.batch import BatchSink, Interrupter, NoInterrupter, ToDataFrame
from kclpy_spark.spark.lanes import Lane, LaneState, Recovery, TwoPhaseCheckpointer
from kclpy_spark.spark.pieces import Chunk, PendingState
from kclpy_spark.spark.planner import next_wakeup, plan_due
from kclpy_spark.spark.settings import (
    BatcherSettings,
    BatcherStats,
    DrainResult,
    LaneClosedError,
    SinkParkedError,
)
from kclpy_spark.spark.writer import BatchWriter, DeadLetterWriter, PlannedBatch

__all__ = [
    "BatcherSettings",
    "BatcherStats",
    "DrainResult",
    "LaneClosedError",
    "MicroBatcher",
    "SinkParkedError",
]

log = logging.getLogger(__name__)


class MicroBatcher:
    """Thread-safe. ``threaded=False`` runs nothing in the background: call ``step()`` (tests)."""

    def __init__(
        self,
        sink: BatchSink,
        settings: BatcherSettings | None = None,
        *,
        to_df: ToDataFrame | None = None,
        interrupter: Interrupter | None = None,
        dead_letter: DeadLetterWriter | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        threaded: bool = True,
        on_batch_done: Callable[[PlannedBatch], None] | None = None,
    ) -> None:
        self.settings = settings or BatcherSettings()
        self.stats = BatcherStats()
        self._clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._lanes: dict[str, Lane] = {}
        self._active = 0
        self._closed = False
        self._writer = BatchWriter(
            sink,
            self.settings,
            self._cond,
            self.stats,
            to_df=to_df,
            interrupter=interrupter or NoInterrupter(),
            dead_letter=dead_letter,
            clock=self._clock,
            sleep=sleep,
        )
        self._on_batch_done = on_batch_done
        self._threaded = threaded
        self._dispatcher: threading.Thread | None = None
        if threaded:
            self._dispatcher = threading.Thread(
                target=self._dispatch_loop, name="kclpy-spark-sink-dispatcher", daemon=True
            )
            self._dispatcher.start()

    # --- lanes (called by the processors) --------------------------------------------------------

    def open_lane(
        self,
        lease_key: str,
        shard_id: str,
        checkpointer: TwoPhaseCheckpointer,
        checkpoint: ExtendedSequenceNumber | None,
    ) -> Lane:
        """Start buffering for a lease just taken; re-form its pending piece if it has one."""
        recovery = self._recovery(lease_key, checkpointer, checkpoint)
        tracker = AckTracker(self._clock, self.settings.ack_timeout)
        lane = Lane(lease_key, shard_id, checkpointer, tracker, recovery)
        with self._cond:
            old = self._lanes.get(lease_key)
            if old is not None:
                self._close_locked(old)
            self._lanes[lease_key] = lane
        return lane

    def _recovery(
        self,
        lease_key: str,
        checkpointer: TwoPhaseCheckpointer,
        checkpoint: ExtendedSequenceNumber | None,
    ) -> Recovery | None:
        pending = checkpointer.pending_checkpoint
        if pending is None or (checkpoint is not None and not checkpoint < pending[0]):
            return None
        target, raw = pending
        state = PendingState.decode(raw)
        mine = [k for k in state.group if k.lease_key == lease_key] if state else []
        if mine:
            # The piece's own last record: the pending checkpoint says SHARD_END instead when
            # the piece ended at a closed shard's last record.
            target = mine[0].last
        if target.is_sentinel:
            log.warning("lease %s: pending checkpoint %s cannot be re-formed", lease_key, target)
            return None
        log.info("lease %s: re-forming the range up to %s first", lease_key, target)
        return Recovery(
            target,
            state.group if state else (),
            state.token if state else None,
            since=self._clock.monotonic(),
        )

    def add(self, lane: Lane, chunk: Chunk) -> None:
        """Buffer a lease's next records; blocks while the buffer is full (backpressure).
        Raises SinkParkedError if the sink gave up on this lease, LaneClosedError if closed."""
        with self._cond:
            while True:
                self._raise_if_unusable(lane)
                if not (self._threaded and self._must_wait(lane)):
                    break
                self._cond.wait(1.0)
            lane.add(chunk, self._clock.monotonic())
            self._cond.notify_all()

    def drain(self, lane: Lane, timeout: float | None, *, final: bool) -> DrainResult:
        """Flush the lane now and wait until its records are written and checkpointed.
        ``final``: no more records will come (shard end), so a re-formed piece is cut at what
        arrived. Without it, an incomplete re-formed piece is left for the next owner."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        with self._cond:
            if lane.state is LaneState.PARKED and final:
                lane.state = LaneState.ACTIVE  # re-arm: try the failed piece again
            lane.forced = True
            if final:
                lane.force_recovery_cut()
            self._cond.notify_all()
        while True:
            with self._cond:
                result = self._drained(lane, final)
                if result is not None:
                    return result
                if self._threaded:
                    left = None if deadline is None else deadline - self._clock.monotonic()
                    if left is not None and left <= 0:
                        return DrainResult.TIMEOUT
                    self._cond.wait(1.0 if left is None else min(left, 1.0))
                    continue
            if self.step() == 0 and not self._commits_due():
                with self._cond:
                    return self._drained(lane, final) or DrainResult.TIMEOUT

    def close_lane(self, lane: Lane) -> None:
        """Lease lost or handed over: drop its buffered records (the next owner reads them again
        from the checkpoint); a write in flight finishes but commits nothing."""
        with self._cond:
            self._close_locked(lane)

    def lane_state(self, lane: Lane) -> LaneState:
        with self._cond:
            return lane.state

    # --- lifecycle -------------------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        if self._dispatcher is not None:
            self._dispatcher.join(timeout)
        with self._cond:  # writes in flight finish (or time out) on their own threads
            while self._active > 0 and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._active:
                log.warning("closing the sink with %d batch(es) still being written", self._active)

    def status(self) -> dict[str, Any]:
        with self._cond:
            lanes = {
                key: {
                    "state": lane.state.value,
                    "buffered_rows": lane.rows,
                    "buffered_bytes": lane.nbytes,
                    "in_flight_rows": lane.inflight.piece.rows if lane.inflight else 0,
                    "recovering": lane.recovery is not None,
                    "park_reason": lane.park_reason,
                }
                for key, lane in self._lanes.items()
            }
            stats = dict(vars(self.stats))
        return {"lanes": lanes, "stats": stats}

    # --- running batches -------------------------------------------------------------------------

    def step(self) -> int:
        """Manual mode: retry due commits, then form and write the batches due now, in this
        thread. Returns the number of batches written (attempted)."""
        for lane in self._take_due_commits():
            self._writer.retry_commit(lane)
        with self._cond:
            batches = self._form_due(limit=None)
            self._active += len(batches)
            if batches:  # cutting pieces freed buffer room: wake blocked adders
                self._cond.notify_all()
        for batch in batches:
            self._run(batch)
        return len(batches)

    def run_until_idle(self, max_rounds: int = 1000) -> int:
        total = 0
        for _ in range(max_rounds):
            n = self.step()
            if n == 0 and not self._commits_due():
                return total
            total += n
        raise RuntimeError("the batcher did not become idle")

    def _run(self, batch: PlannedBatch) -> None:
        try:
            self._writer.run(batch)
        except Exception as exc:  # a bug here must not kill the writer thread or lose records
            log.exception("%r failed unexpectedly", batch)
            self._writer.park(batch, exc)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()
            if self._on_batch_done is not None:
                self._on_batch_done(batch)

    def _dispatch_loop(self) -> None:
        while True:
            try:
                if not self._dispatch_once():
                    return
            except Exception:  # a bug must not silently stop every sink write
                log.exception("the sink dispatcher failed; going on")
                with self._cond:
                    self._cond.wait(1.0)

    def _dispatch_once(self) -> bool:
        with self._cond:
            if self._closed:
                return False
            room = self.settings.writers - self._active
            batches = self._form_due(limit=room) if room > 0 else []
            self._active += len(batches)
            if batches:  # cutting pieces freed buffer room: wake blocked adders
                self._cond.notify_all()
            if not batches and not self._commits_due():
                self._cond.wait(self._next_wakeup())
                return True
        for lane in self._take_due_commits():
            self._writer.retry_commit(lane)
        for batch in batches:
            # Daemon threads, one per batch (a batch takes 100 ms at least): a write stuck in
            # user code must not keep the process from exiting.
            threading.Thread(
                target=self._run, args=(batch,), name="kclpy-spark-sink-writer", daemon=True
            ).start()
        return True

    # --- under the lock --------------------------------------------------------------------------

    def _raise_if_unusable(self, lane: Lane) -> None:
        if lane.state is LaneState.PARKED:
            raise SinkParkedError(
                f"lease {lane.lease_key}: the sink gave up on a batch ({lane.park_reason}); "
                "the lease must be parked and its records redelivered later"
            )
        if lane.state is LaneState.CLOSED or self._closed:
            raise LaneClosedError(f"lease {lane.lease_key}: the sink lane is closed")

    def _must_wait(self, lane: Lane) -> bool:
        if lane.recovery is not None:
            return False  # it may need more records before anything can be flushed
        buffered = sum(x.nbytes for x in self._lanes.values() if x.state is LaneState.ACTIVE)
        return buffered >= self.settings.buffer_limit

    def _close_locked(self, lane: Lane) -> None:
        lane.state = LaneState.CLOSED
        lane.drop()
        lane.uncommitted = None
        if self._lanes.get(lane.lease_key) is lane:
            del self._lanes[lane.lease_key]
        self._cond.notify_all()

    def _drained(self, lane: Lane, final: bool) -> DrainResult | None:
        if lane.state is LaneState.CLOSED:
            return DrainResult.CLOSED
        if lane.state is LaneState.PARKED:
            return DrainResult.PARKED
        if lane.idle or (
            not final
            and lane.inflight is None
            and lane.uncommitted is None
            and lane.recovery is not None
            and not lane.recovery_ready
        ):
            return DrainResult.DONE
        return None

    def _commits_due(self) -> bool:
        now = self._clock.monotonic()
        return any(x.uncommitted and x.commit_retry_at <= now for x in self._lanes.values())

    def _take_due_commits(self) -> list[Lane]:
        with self._cond:
            now = self._clock.monotonic()
            due = [x for x in self._lanes.values() if x.uncommitted and x.commit_retry_at <= now]
            for lane in due:
                lane.commit_retry_at = float("inf")  # taken: not due again until rescheduled
            return due

    def _next_wakeup(self) -> float:
        return next_wakeup(self._lanes.values(), self.settings, self._clock.monotonic())

    def _form_due(self, limit: int | None) -> list[PlannedBatch]:
        """Cut the batches due now (at most ``limit``); their pieces are marked in flight."""
        return plan_due(self._lanes.values(), self.settings, self._clock.monotonic(), limit)
