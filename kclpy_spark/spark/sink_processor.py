"""The RecordProcessor that feeds a shared MicroBatcher: one instance per lease, one batcher per
worker. The checkpoint follows the last record *written*, never the last record read.

* ``process_records`` converts the records to Arrow (in the consumer's thread) and hands them to
  the batcher; it returns at once unless the batcher's buffer is full (backpressure). It raises
  ``SinkParkedError`` after the sink gave up on a batch of this lease, so the consumer parks the
  lease (visible in status; the records come again from the checkpoint when it reopens).
* ``no_records`` (a read at the tip with nothing new) raises ``SinkParkedError`` too: on a quiet
  stream the lease is parked as soon as the sink gives up, not at the next record.
* ``lease_lost`` drops the lease's unwritten records: the next owner reads them again.
* ``shard_ended`` waits until every record of the lease is written and checkpointed, then
  checkpoints SHARD_END (the children may start only then) and forgets the lane.
* After the worker closed the sink, ``process_records`` raises ``BatcherClosedError`` (records are
  not silently dropped).
* ``shutdown_requested`` flushes and waits (bounded) for the lease's records to be written.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from checkpoint.lease import Lease, stream_name_of
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from kclpy_spark.spark.lane import Lane, TwoPhaseCheckpointer
from kclpy_spark.spark.micro_batcher import (
    DrainResult,
    LaneClosedError,
    MicroBatcher,
    SinkParkedError,
)
from kclpy_spark.spark.pieces import PendingState, records_to_chunk

if TYPE_CHECKING:
    from collections.abc import Callable

    from kclpy_spark.runtime.streams import RecordSourcesFor
    from kclpy_spark.spark.executor_reads import ExecutorReads
    from kclpy_spark.spark.session import SparkSessionHolder

log = logging.getLogger(__name__)

# A cancelled read job is given this long to return before the worker says it is not ready: the
# interrupt reaches its tasks in seconds unless the JVM answers no more.
READ_CANCEL_GRACE = 60.0


def stream_of(lease_key: str, default: str) -> str:
    """The stream a lease belongs to: named in a multi-stream lease key, else the configured
    one."""
    return stream_name_of(lease_key) or default


class SparkSinkProcessor(RecordProcessor):
    def __init__(self, batcher: MicroBatcher, stream: str, shutdown_timeout: float) -> None:
        self._batcher = batcher
        self._stream = stream
        self._shutdown_timeout = shutdown_timeout
        self._shard_id = ""
        self._checkpoint: ExtendedSequenceNumber | None = None
        self._lane: Lane | None = None

    def initialize(self, initialize_input: InitializeInput) -> None:
        self._shard_id = initialize_input.shard_id
        seq = initialize_input.sequence_number
        if seq is not None:
            self._checkpoint = ExtendedSequenceNumber(seq, initialize_input.sub_sequence_number)

    def _open(self, checkpointer: Any) -> Lane:
        if self._lane is None:
            if not isinstance(checkpointer, TwoPhaseCheckpointer):
                raise TypeError(
                    "the Spark sink needs kclpy-spark's two-phase Checkpointer "
                    "(lease_key, prepare_checkpoint, pending_checkpoint, ...: spark/lane.py "
                    f"TwoPhaseCheckpointer), got {type(checkpointer)!r}"
                )
            cp = checkpointer
            self._stream = stream_of(cp.lease_key, self._stream)
            self._lane = self._batcher.open_lane(cp.lease_key, self._shard_id, cp, self._checkpoint)
        return self._lane

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        records = process_records_input.records
        lane = self._open(process_records_input.checkpointer)
        if not records:  # read on the executors: an announcement, or the lane was parked
            self._batcher.check(lane)
            return
        chunk = records_to_chunk(records, self._stream, self._shard_id)
        try:
            self._batcher.add(lane, chunk)
        except LaneClosedError:
            # The lease was lost while writing (the checkpoint commit said so): these records
            # are read again by the next owner from the checkpoint.
            log.info("lease %s: lane closed; dropping %d records", lane.lease_key, len(records))

    def no_records(self) -> None:
        if self._lane is not None:
            self._batcher.check(self._lane)

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        if self._lane is not None:
            self._batcher.close_lane(self._lane)

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        lane = self._lane
        if lane is not None:
            result = self._batcher.drain(lane, None, final=True)
            if result is DrainResult.PARKED:
                # The consumer counts this toward its failure budget and calls shard_ended again
                # after a backoff (draining re-arms the lane to try the failed batch again), or
                # parks the lease when the budget is spent.
                raise SinkParkedError(
                    f"lease {lane.lease_key}: a batch failed at shard end; retrying"
                )
            if result is not DrainResult.DONE:
                log.warning("lease %s: shard end drain: %s", lane.lease_key, result.value)
                return
        shard_ended_input.checkpointer.checkpoint()
        if lane is not None:  # finished: the lane is forgotten (a worker ends many shards)
            self._batcher.close_lane(lane)
            self._lane = None

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        lane = self._lane
        if lane is None:
            return
        # A job's caught-up lease: its batches end by their own rules (written, or failed
        # after their write deadlines and attempts); a first Spark write slower than the
        # stop's timeout failed the job.
        timeout = None if shutdown_requested_input.caught_up else self._shutdown_timeout
        result = self._batcher.drain(lane, timeout, final=False)
        if result is not DrainResult.DONE:
            log.warning(
                "lease %s: not everything was written before the hand-over (%s); the rest is "
                "read again from the checkpoint",
                lane.lease_key,
                result.value,
            )
        self._batcher.close_lane(lane)


class SparkSinkProcessorFactory:
    """A ``ProcessorFactory`` (callable with no argument) sharing one batcher; ``close()`` stops
    the batcher and, if it owns one, the Spark session."""

    def __init__(
        self,
        batcher: MicroBatcher,
        stream: str,
        *,
        shutdown_timeout: float = 15.0,
        on_close: list[Any] | None = None,
        session: SparkSessionHolder | None = None,
        record_sources: RecordSourcesFor | None = None,
        reads: ExecutorReads | None = None,
    ) -> None:
        """``session``: whose driver JVM figures the metrics show (none without it);
        ``record_sources``: given to ``run_worker`` when the records are read on the executors;
        ``reads``: those reads, whose figures the metrics show."""
        self.batcher = batcher
        self._stream = stream
        self._shutdown_timeout = shutdown_timeout
        self._on_close = on_close or []
        self._session = session
        self.record_sources = record_sources
        self._reads = reads

    def pending_first(self, lease: Lease) -> ExtendedSequenceNumber | None:
        """Where the pieces the lease's pending checkpoint ends begin (its stored state's first
        piece of the lease), for the retention check; None when the state names none."""
        state = PendingState.decode(lease.pending_checkpoint_state)
        pieces = [] if state is None else state.after(lease.lease_key, None)
        return pieces[0][0].first if pieces else None

    def __call__(self) -> RecordProcessor:
        return SparkSinkProcessor(self.batcher, self._stream, self._shutdown_timeout)

    def status(self) -> dict[str, Any]:
        return self.batcher.status()

    def sink_lanes(self) -> dict[str, dict[str, Any]]:
        """Each lane's figures by lease key (the worker's status record carries them)."""
        lanes: dict[str, dict[str, Any]] = self.status().get("lanes", {})
        return lanes

    def readiness(self) -> tuple[bool, str]:
        """Not ready while the sink refuses writes: as many writes hang as it allows."""
        hung, limit = self.batcher.hung_writes, self.batcher.writes.max_hung_writes
        if hung >= limit:
            return False, f"{hung} Spark sink write(s) hang (at most {limit}); writes are refused"
        stuck = None if self._reads is None else self._reads.hung_for()
        if stuck is not None and stuck > READ_CANCEL_GRACE:
            return False, (
                f"the read thread's call to Spark has not returned {stuck:.0f}s past its "
                "deadline; no lease is read"
            )
        return True, "ready"

    def metrics_collector(self) -> Any:
        """A Prometheus collector of the batcher's figures (the worker registers it)."""
        from kclpy_spark.spark.updates import BatcherStatsCollector

        heap, garbage = (
            (self._session.heap, self._session.jvm_garbage) if self._session else (None, None)
        )
        return BatcherStatsCollector(
            self.batcher.stats,
            lambda: self.batcher.hung_writes,
            heap=(lambda: heap.figures) if heap is not None else None,
            gc_runs=(lambda: garbage.collections) if garbage is not None else None,
            executor_reads=_read_figures(self._reads) if self._reads is not None else None,
        )

    def close(self) -> None:
        self.batcher.close()
        for closer in self._on_close:
            try:
                closer()
            except Exception:
                log.exception("closing the Spark sink: %r failed", closer)


def _read_figures(reads: ExecutorReads) -> Callable[[], tuple[int, int]]:
    """The metrics' view of the executor reads: read jobs run, reads still stored."""
    return lambda: (reads.rounds, reads.stored.kept)
