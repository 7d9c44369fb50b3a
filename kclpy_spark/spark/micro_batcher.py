"""The micro-batcher: gathers leases' records into batches, writes them, then acknowledges.

Records wait in per-lease lanes (lane.py, the one owner of a lane's state). A batch is due when
its records reach ``max_records`` or ``max_bytes``, when its oldest record has waited ``max_wait``,
when a lane must be drained (shard end, shutdown), or when the buffer is full (planner.py). In
``worker`` scope one batch takes a cut of every lease that has records; in ``lease`` scope each
batch is one lease's. Records read on the executors (``reads``) fill a lane whole and are cut at
once. One batch, in one of ``writers`` writer threads (writer.py does the I/O):

1. ``sink.prepare`` gives each new cut its token; each cut's end and the batch's composition are
   written as the lease's *pending* checkpoint, so a worker that takes the lease after a crash
   re-forms the identical piece (and the identical batch when it holds all its leases).
2. ``sink.write`` is attempted up to ``max_attempts`` times with backoff; an attempt that overruns
   ``write_timeout`` has its Spark jobs interrupted.
3. On success each lease's checkpoint moves to its cut's end. On failure nothing is committed: the
   failure policy dead-letters the batch (then commits) or parks its lanes (``SinkParkedError``
   from the next ``process_records``: the consumer parks the lease).

The batcher owns the threads, the timing and the lock; every lane change it makes is a ``Lane``
method called under that lock. Its threads are fixed at start (``writers`` threads, the sink
writes on as many more, at most two per writer that hang: timed_write.py; one thread of reads
on the executors), so resources do not grow with the number of batches written.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.batch_life import Batch
from kclpy_spark.spark.executor_reads import ExecutorReads
from kclpy_spark.spark.lane import (
    BatcherClosedError,
    Cut,
    DrainResult,
    Lane,
    LaneClosedError,
    LaneState,
    SinkParkedError,
    TwoPhaseCheckpointer,
)
from kclpy_spark.spark.lane_feed import LanesFeed
from kclpy_spark.spark.pieces import Chunk
from kclpy_spark.spark.planner import Plan, next_wakeup, plan_due
from kclpy_spark.spark.replays import replays_from_pending
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.sink_batch import (
    BatchSink,
    DeadLetterWriter,
    Interrupter,
    NoInterrupter,
    SinkRoute,
    ToDataFrame,
    needs_order,
    own_pieces_only,
)
from kclpy_spark.spark.updates import BatcherStats, LaneUpdates
from kclpy_spark.spark.writer import BatchWriter, single_route

__all__ = [
    "BatcherClosedError",
    "BatcherSettings",
    "BatcherStats",
    "DrainResult",
    "LaneClosedError",
    "MicroBatcher",
    "SinkParkedError",
]

log = logging.getLogger(__name__)


class MicroBatcher:
    """Thread-safe. ``sink``: one sink (with ``dead_letter`` and the settings' failure policy) or
    several ``SinkRoute``s, each batch written to all of them. ``threaded=False`` runs nothing in
    the background: call ``step()`` (tests)."""

    def __init__(
        self,
        sink: BatchSink | Sequence[SinkRoute],
        settings: BatcherSettings | None = None,
        *,
        to_df: ToDataFrame | None = None,
        interrupter: Interrupter | None = None,
        dead_letter: DeadLetterWriter | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        threaded: bool = True,
        on_batch_done: Callable[[Batch], None] | None = None,
        reads: ExecutorReads | None = None,
        parse: Callable[[Any], Any] = lambda df: df,
    ) -> None:
        """``reads``: the records are read on the executors (executor_reads.py), each lane
        filled by a read as soon as it can take records, and cut whole at once."""
        self.settings = settings or BatcherSettings()
        self.stats = BatcherStats()
        self._clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._lanes: dict[str, Lane] = {}
        self._active = 0
        self._closed = False
        self._updates = LaneUpdates(
            self._cond, self.stats, self._clock, self.settings, self._close_locked
        )
        one = not isinstance(sink, Sequence)
        routes = [single_route(sink, self.settings, dead_letter)] if one else list(sink)  # type: ignore[arg-type]
        self._writer = BatchWriter(
            routes, self.settings, self._updates, to_df=to_df, parse=parse,
            interrupter=interrupter or NoInterrupter(), sleep=sleep,
        )  # fmt: skip
        for route in routes:  # each sink's figures exist before any write (BatcherStats)
            self.stats.sink(route.name)
        # Sinks that need one lease's batches in order (Delta's versions) get one at a time.
        ordered = any(needs_order(r.sink) for r in routes)
        self._depth = 1 if ordered else self.settings.batches_in_flight
        self._on_batch_done = on_batch_done
        self._threaded = threaded
        self._reads = reads
        self._plan_settings = _plan_settings(self.settings, routes, self._depth, reads is not None)
        self._threads = [
            threading.Thread(
                target=self._writer_loop, name=f"kclpy-spark-sink-writer-{i}", daemon=True
            )
            for i in range(self.settings.writers if threaded else 0)
        ]
        # Daemon threads: a write stuck in user code must not keep the process from exiting.
        for thread in self._threads:
            thread.start()
        if reads is not None:
            feed = LanesFeed(self._cond, self._lanes, self._clock, lambda: self._closed)
            reads.start(feed, threaded=threaded)

    # --- lanes (called by the processors) --------------------------------------------------------

    def open_lane(
        self,
        lease_key: str,
        shard_id: str,
        checkpointer: TwoPhaseCheckpointer,
        checkpoint: ExtendedSequenceNumber | None,
    ) -> Lane:
        """Start buffering for a lease just taken; re-form its pieces in flight if it has any."""
        replays = replays_from_pending(lease_key, checkpointer.pending_checkpoint, checkpoint)
        now = self._clock.monotonic()
        lane = Lane(lease_key, shard_id, checkpointer, replays=replays, now=now, depth=self._depth)
        with self._cond:
            old = self._lanes.get(lease_key)
            if old is not None:
                self._close_locked(old)
            self._lanes[lease_key] = lane
        return lane

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

    def check(self, lane: Lane) -> None:
        """Raise what ``add`` would raise for ``lane`` now (SinkParkedError after the sink gave
        up on its batch), without adding anything."""
        with self._cond:
            self._raise_if_unusable(lane)

    def drain(self, lane: Lane, timeout: float | None, *, final: bool) -> DrainResult:
        """Flush the lane now and wait until its records are written and checkpointed.
        ``final``: no more records will come (shard end), so a re-formed piece is cut at what
        arrived (one whose rows were lost on the executors waits for its read again), and a
        parked lane is re-armed to try its failed batch again. Without it, an
        incomplete re-formed piece is left for the next owner."""
        deadline = None if timeout is None else self._clock.monotonic() + timeout
        with self._cond:
            if final:
                lane.rearm()
            lane.force(final=final)
            self._cond.notify_all()
        while True:
            with self._cond:
                result = lane.drained(final)
                if result is not None:
                    return result
                if self._closed:
                    return DrainResult.CLOSED
                if self._threaded:
                    left = None if deadline is None else deadline - self._clock.monotonic()
                    if left is not None and left <= 0:
                        return DrainResult.TIMEOUT
                    self._cond.wait(1.0 if left is None else min(left, 1.0))
                    continue
            if self.step() == 0 and not self._commits_due():
                with self._cond:
                    return lane.drained(final) or DrainResult.TIMEOUT

    def close_lane(self, lane: Lane) -> None:
        """Lease lost, handed over or finished: drop its buffered records (the next owner reads
        them again from the checkpoint) and forget the lane. A write in flight finishes; its
        commit is not started any more (one already running is fenced by the lease)."""
        with self._cond:
            self._close_locked(lane)

    def lane_state(self, lane: Lane) -> LaneState:
        with self._cond:
            return lane.state

    # --- lifecycle -------------------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        if self._reads is not None:
            self._reads.close(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout  # real time: these are threads joined
        for thread in self._threads:  # writes in flight finish (or time out) on their own
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            if self._active:
                log.warning("closing the sink with %d batch(es) still being written", self._active)
        self._writer.close()

    @property
    def threads(self) -> int:
        """Writer threads alive (fixed at start)."""
        return sum(t.is_alive() for t in self._threads)

    @property
    def writes(self) -> BatchWriter:
        """The writer: its ``write_threads`` (one per writer, plus writes still hung),
        ``hung_writes`` (given up on, still running) and ``max_hung_writes``."""
        return self._writer

    @property
    def hung_writes(self) -> int:
        return self._writer.hung_writes

    @property
    def deadlines(self) -> int:
        """Write timeouts scheduled on the watchdog (bounded by the writes in flight)."""
        return self._writer.watchdog.scheduled

    def status(self) -> dict[str, Any]:
        with self._cond:
            lanes = {
                key: {
                    "state": lane.state.value,
                    "buffered_rows": lane.rows,
                    "buffered_bytes": lane.nbytes,
                    "in_flight_rows": sum(c.piece.rows for c in lane.outs),
                    "in_flight_batches": len(lane.outs),
                    "recovering": lane.replaying,
                    "park_reason": lane.park_reason,
                }
                for key, lane in self._lanes.items()
            }
            stats = asdict(self.stats)  # a copy, by-sink figures too
        stats["hung_writes"] = self._writer.hung_writes
        return {"lanes": lanes, "stats": stats, "sinks": list(self._writer.sink_names)}

    # --- running batches -------------------------------------------------------------------------

    def step(self) -> int:
        """Manual mode: retry due commits, then form and write the batches due now, in this
        thread. Returns the number of batches written (attempted)."""
        with self._cond:
            commits = self._claim_commits()
        self._writer.commit_claimed(commits)
        with self._cond:
            batches = self._form_due(limit=None)
            self._active += len(batches)
            if batches:  # cutting freed buffer room: wake blocked adders
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

    def _writer_loop(self) -> None:
        while True:
            try:
                with self._cond:
                    while True:
                        if self._closed:
                            return
                        commits = self._claim_commits()
                        batches = [] if commits else self._form_due(limit=1)
                        if commits or batches:
                            break
                        self._cond.wait(self._next_wakeup())
                    self._active += len(batches)
                    if batches:  # cutting freed buffer room: wake blocked adders
                        self._cond.notify_all()
                self._writer.commit_claimed(commits)
                for batch in batches:
                    self._run(batch)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException:  # a bug must not silently stop every sink write (nor its claims)
                log.exception("a sink writer thread failed; going on")
                with self._cond:
                    self._cond.wait(1.0)

    def _run(self, batch: Batch) -> None:
        try:
            self._writer.run(batch)
        except Exception as exc:  # a bug here must not kill the writer thread or lose records
            log.exception("%r failed unexpectedly", batch)
            if not batch.state.settled:  # written batches keep their commits (retried)
                self._updates.gave_up(batch, exc)
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()
            if self._on_batch_done is not None:
                self._on_batch_done(batch)

    # --- under the lock --------------------------------------------------------------------------

    def _raise_if_unusable(self, lane: Lane) -> None:
        if lane.state is LaneState.PARKED:
            raise SinkParkedError(
                f"lease {lane.lease_key}: the sink gave up on a batch ({lane.park_reason}); "
                "the lease must be parked and its records redelivered later"
            )
        if self._closed:
            raise BatcherClosedError("the Spark sink is closed (the worker is stopping)")
        if lane.state is LaneState.CLOSED:
            raise LaneClosedError(f"lease {lane.lease_key}: the sink lane is closed")

    def _must_wait(self, lane: Lane) -> bool:
        if lane.gathering:
            return False  # it needs more records before its re-formed piece can go
        # Re-formed pieces whole, it waits as any lane: records it took meanwhile (its piece
        # waiting up to regroup_wait for its batch's other pieces) grew past every limit.
        active = [x for x in self._lanes.values() if x.state is LaneState.ACTIVE]
        limit, buffered = self.settings.buffer_limit, sum(x.nbytes for x in active)
        # Full: only a lane holding at least an equal share waits. A lease whose write is slow
        # (one batch in flight, its records piling up) filled the buffer and stopped every
        # other lease's delivery until that write ended; now the others go on, up to twice the
        # limit, where every lane waits (the buffer holds less than that and one delivery).
        if buffered < limit:
            return False
        return buffered >= 2 * limit or lane.nbytes >= limit / max(1, len(active))

    def _close_locked(self, lane: Lane) -> None:
        lane.close()
        if self._lanes.get(lane.lease_key) is lane:
            del self._lanes[lane.lease_key]
        self._cond.notify_all()

    def _commits_due(self) -> bool:
        with self._cond:
            now = self._clock.monotonic()
            return any(x.commit_ready(now) for x in self._lanes.values())

    def _claim_commits(self) -> list[tuple[Lane, Cut]]:
        now = self._clock.monotonic()
        return [
            (lane, cut)
            for lane in self._lanes.values()
            if (cut := lane.claim_commit(now)) is not None
        ]

    def _next_wakeup(self) -> float:
        return next_wakeup(self._lanes.values(), self.settings, self._clock.monotonic())

    def _expected(self, lease_key: str) -> bool:
        lane = next(iter(self._lanes.values()), None)
        return lane is not None and lane.checkpointer.worker_holds(lease_key)

    def _form_due(self, limit: int | None) -> list[Batch]:
        """Cut the batches due now (at most ``limit``)."""
        plans = plan_due(
            self._lanes.values(), self._plan_settings, self._clock.monotonic(), limit,
            self._expected,
        )  # fmt: skip
        return [self._cut(plan) for plan in plans]

    def _cut(self, plan: Plan) -> Batch:
        s = self.settings
        rows_left, bytes_left = s.max_records, s.max_bytes
        parts: list[tuple[Lane, Cut]] = []
        first_read = None
        for lane in plan.lanes:
            if plan.budgeted and (rows_left <= 0 or bytes_left <= 0):
                if not self._reads:
                    break
                # Records read on the executors are cut whole, a round's lanes together past the
                # budget (its reads kept to it: at most 1.5 times its records, or with
                # page_per_lease a page a lease within 1.5 times its bytes); split by it, a
                # round went in two batches, a write job, a sync and commits each. Other rounds'
                # lanes wait.
                if lane.reads_from is not first_read:
                    continue
            first_read = first_read or lane.reads_from
            cut = lane.cut(*((sys.maxsize,) * 2 if self._reads else (rows_left, bytes_left)))
            rows_left -= cut.piece.rows
            bytes_left -= cut.nbytes
            parts.append((lane, cut))
        return Batch(sorted(parts, key=lambda part: part[1].key))


def _plan_settings(
    s: BatcherSettings, routes: list[SinkRoute], depth: int, executors: bool
) -> BatcherSettings:
    """The settings the planner sees: lanes read on the executors are due as soon as filled (a
    read round is their batching); ``max_leases`` only where a lease's pending checkpoint names
    its whole batch (a sink not written once per piece: ``check_groups``, ``depth`` batches of a
    lease out at once)."""
    if not own_pieces_only(routes):
        s.check_groups(depth)
    else:
        s = replace(s, max_leases=sys.maxsize)
    return replace(s, max_wait=0.0) if executors else s
