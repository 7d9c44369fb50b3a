"""SparkSinkProcessor driven as the ShardConsumer drives it (initialize, process_records,
shard_ended / lease_lost / shutdown_requested), over a threaded MicroBatcher and a fake sink."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    Record,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from kclpy_spark.spark.micro_batcher import (
    BatcherClosedError,
    BatcherSettings,
    DrainResult,
    MicroBatcher,
    SinkParkedError,
)
from kclpy_spark.spark.pieces import Piece
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sink_processor import SparkSinkProcessor, SparkSinkProcessorFactory

SHARD = "shardId-000000000000"


class Sink:
    def __init__(self) -> None:
        self.rows: list[str] = []
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set once a write has begun (after its prepare)

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def write(self, batch: SinkBatch) -> None:
        self.entered.set()
        assert self.gate.wait(10.0)
        if self.fail:
            raise RuntimeError("sink down")
        self.rows += batch.table.column("sequence_number").to_pylist()


class Consumer:
    """The parts of ShardConsumer the processor sees."""

    def __init__(self, processor: SparkSinkProcessor) -> None:
        self.table = MemoryLeaseTable()
        self.table.create_lease_if_absent(Lease(SHARD, TRIM_HORIZON))
        holder = LeaseHolder(self.table, "w", ManualClock(), 1e9)
        lease = self.table.get_lease(SHARD)
        assert lease is not None
        taken = self.table.take_lease(lease, "w")
        assert taken is not None
        held = holder.add_taken(taken)
        self.cp = Checkpointer(holder, SHARD, held.token, taken.checkpoint)
        self.processor = processor
        processor.initialize(InitializeInput(SHARD, "TRIM_HORIZON"))
        self.next = 1

    def deliver(self, count: int) -> None:
        recs = [Record(b"x", "k", str(i * 10)) for i in range(self.next, self.next + count)]
        self.next += count
        self.cp.set_largest_permitted(ExtendedSequenceNumber(recs[-1].sequence_number))
        self.processor.process_records(ProcessRecordsInput(recs, 0, self.cp))

    def checkpoint(self) -> ExtendedSequenceNumber:
        lease = self.table.get_lease(SHARD)
        assert lease is not None
        return lease.checkpoint


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def factory(sink: Sink) -> Iterator[SparkSinkProcessorFactory]:
    batcher = MicroBatcher(sink, BatcherSettings(max_records=1000, max_wait=3600.0))
    made = SparkSinkProcessorFactory(batcher, "stream", shutdown_timeout=5.0)
    try:
        yield made
    finally:
        made.close()


def consumer(factory: SparkSinkProcessorFactory) -> Consumer:
    processor = factory()
    assert isinstance(processor, SparkSinkProcessor)
    return Consumer(processor)


def test_shard_end_writes_everything_then_checkpoints_shard_end(
    factory: SparkSinkProcessorFactory, sink: Sink
) -> None:
    c = consumer(factory)
    c.deliver(3)
    c.deliver(2)
    assert sink.rows == [] and c.checkpoint() == TRIM_HORIZON  # below every limit: buffered
    c.cp.mark_shard_end()
    c.processor.shard_ended(ShardEndedInput(c.cp))
    assert sink.rows == [str(i * 10) for i in range(1, 6)]
    assert c.checkpoint() == SHARD_END
    assert factory.status()["lanes"] == {}  # a finished lease's lane is forgotten


def test_records_after_the_sink_closed_raise_instead_of_vanishing(
    factory: SparkSinkProcessorFactory, sink: Sink
) -> None:
    c = consumer(factory)
    c.deliver(2)
    factory.close()
    with pytest.raises(BatcherClosedError):
        c.deliver(1)
    c.cp.mark_shard_end()
    done = threading.Event()

    def end() -> None:
        c.processor.shard_ended(ShardEndedInput(c.cp))  # must not wait forever
        done.set()

    threading.Thread(target=end, daemon=True).start()
    assert done.wait(10.0)
    assert c.checkpoint() == TRIM_HORIZON  # nothing written: no SHARD_END


def test_shutdown_flushes_and_checkpoints_what_was_written(
    factory: SparkSinkProcessorFactory, sink: Sink
) -> None:
    c = consumer(factory)
    c.deliver(4)
    c.processor.shutdown_requested(ShutdownRequestedInput(c.cp))
    assert sink.rows == ["10", "20", "30", "40"] and c.checkpoint() == ExtendedSequenceNumber("40")


def two_records_behind_a_stuck_write(sink: Sink) -> tuple[SparkSinkProcessorFactory, Consumer]:
    """A factory whose shutdown timeout is 50 ms, and a consumer that delivered two records
    whose write waits for ``sink.gate``."""
    batcher = MicroBatcher(sink, BatcherSettings(max_records=1000, max_wait=3600.0))
    factory = SparkSinkProcessorFactory(batcher, "stream", shutdown_timeout=0.05)
    c = consumer(factory)
    sink.gate.clear()
    c.deliver(2)
    return factory, c


def test_shutdown_waits_only_so_long_for_a_stuck_write(sink: Sink) -> None:
    factory, c = two_records_behind_a_stuck_write(sink)
    try:
        c.processor.shutdown_requested(ShutdownRequestedInput(c.cp))  # returns: timed out
        assert c.checkpoint() == TRIM_HORIZON
        # The drain cut the batch; its write (after the pending checkpoint) may start only now.
        assert sink.entered.wait(10.0)
        lease = c.table.get_lease(SHARD)
        assert lease is not None and lease.pending_checkpoint == ExtendedSequenceNumber("20")
    finally:
        sink.gate.set()
        factory.close()
    assert c.checkpoint() == TRIM_HORIZON  # the lane was closed: the late write commits nothing


def test_a_caught_up_job_lease_waits_for_its_write_past_the_shutdown_timeout(
    sink: Sink,
) -> None:
    """``--until-caught-up``: nothing waits for the lease, so a first Spark write slower than
    ``shutdown_timeout`` is waited for (it failed the job: "not caught up")."""
    factory, c = two_records_behind_a_stuck_write(sink)
    try:
        done = threading.Event()

        def conclude() -> None:
            c.processor.shutdown_requested(ShutdownRequestedInput(c.cp, caught_up=True))
            done.set()

        threading.Thread(target=conclude, daemon=True).start()
        assert sink.entered.wait(10.0)
        assert not done.wait(0.5)  # ten times the shutdown timeout: still waiting
        sink.gate.set()
        assert done.wait(10.0)
        assert c.checkpoint() == ExtendedSequenceNumber("20")
    finally:
        sink.gate.set()
        factory.close()


def test_lease_lost_drops_the_buffered_records(
    factory: SparkSinkProcessorFactory, sink: Sink
) -> None:
    c = consumer(factory)
    c.deliver(3)
    c.processor.lease_lost(LeaseLostInput())
    assert factory.status()["lanes"] == {}
    c.deliver(1)  # late records for a lost lease are dropped, not an error
    assert sink.rows == [] and c.checkpoint() == TRIM_HORIZON


def test_a_batch_the_sink_gave_up_on_makes_process_records_raise(sink: Sink) -> None:
    batcher = MicroBatcher(
        sink,
        BatcherSettings(max_records=2, max_attempts=2, retry_base_delay=0.0),
        sleep=lambda s: None,
    )
    factory = SparkSinkProcessorFactory(batcher, "stream")
    try:
        c = consumer(factory)
        sink.fail = True
        c.deliver(2)
        lane = factory.batcher.status()["lanes"][SHARD]
        assert lane["state"] in {"active", "parked"}
        lanes = c.processor._lane
        assert lanes is not None
        assert batcher.drain(lanes, 10.0, final=False) is DrainResult.PARKED
        with pytest.raises(SinkParkedError):  # the consumer retries, then parks the lease
            c.deliver(1)
        assert c.checkpoint() == TRIM_HORIZON
        assert factory.status()["lanes"][SHARD]["state"] == "parked"
        # At shard end the consumer cannot park: shard_ended re-arms and tries again.
        sink.fail = False
        c.cp.mark_shard_end()
        c.processor.shard_ended(ShardEndedInput(c.cp))
        assert sink.rows == ["10", "20"] and c.checkpoint() == SHARD_END
    finally:
        factory.close()


def test_the_sink_needs_the_two_phase_checkpointer(factory: SparkSinkProcessorFactory) -> None:
    class Plain:
        def checkpoint(self, sequence_number: str | None = None, sub: int | None = None) -> None:
            return None

    processor = factory()
    processor.initialize(InitializeInput(SHARD, "TRIM_HORIZON"))
    with pytest.raises(TypeError, match="two-phase"):
        processor.process_records(ProcessRecordsInput([Record(b"x", "k", "1")], 0, Plain()))


def test_the_stream_column_names_the_lease_stream_in_multi_stream_mode() -> None:
    from kclpy_spark.spark.sink_processor import stream_of

    assert stream_of("123456789012:orders:1700000000:shardId-000000000001", "a,b") == "orders"
    assert stream_of("shardId-000000000001", "orders") == "orders"


def test_the_factory_shows_the_executor_reads_figures_in_its_metrics(sink: Sink) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from kclpy_spark.spark.executor_reads import ExecutorReads, ReadSettings
    from kclpy_spark.spark.range_tasks import AwsTarget

    reads = ExecutorReads(lambda: None, AwsTarget("us-east-1"), ReadSettings())
    reads.rounds, reads.stored.kept = 7, 2
    batcher = MicroBatcher(sink, BatcherSettings(max_records=1000, max_wait=3600.0))
    made = SparkSinkProcessorFactory(batcher, "stream", reads=reads)
    try:
        registry = CollectorRegistry()
        registry.register(made.metrics_collector())
        text = generate_latest(registry).decode()
    finally:
        made.close()
        reads.close()
    assert "kclpy_spark_sink_executor_read_jobs_total 7.0" in text
    assert "kclpy_spark_sink_executor_reads_stored 2.0" in text


def test_the_factory_says_where_a_leases_pending_pieces_begin() -> None:
    """For the retention check: the first piece of the lease in its stored pending state."""
    from checkpoint.lease import Lease
    from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
    from kclpy_spark.spark.pieces import InFlight, PendingState, PieceKey
    from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory

    key = "shardId-000000000000"
    first = PieceKey(key, ExtendedSequenceNumber("400"), ExtendedSequenceNumber("450"))
    second = PieceKey(key, ExtendedSequenceNumber("451"), ExtendedSequenceNumber("600"))
    other = PieceKey(
        "shardId-000000000001", ExtendedSequenceNumber("1"), ExtendedSequenceNumber("2")
    )
    state = PendingState((InFlight((other, first), None), InFlight((second,), None))).encode()
    lease = Lease(key, TRIM_HORIZON, pending_checkpoint=ExtendedSequenceNumber("600"),
                  pending_checkpoint_state=state)  # fmt: skip
    pending_first = SparkSinkProcessorFactory.pending_first
    assert pending_first(None, lease) == ExtendedSequenceNumber("400")  # type: ignore[arg-type]
    assert pending_first(None, Lease(key, TRIM_HORIZON)) is None  # type: ignore[arg-type]
    foreign = Lease(key, TRIM_HORIZON, pending_checkpoint=ExtendedSequenceNumber("600"),
                    pending_checkpoint_state=b"an amazon-kclpy app's own state")  # fmt: skip
    assert pending_first(None, foreign) is None  # type: ignore[arg-type]
