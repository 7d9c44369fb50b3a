"""ShardConsumer in the pure tier: a fake RecordSource and ShardProbe, a real memory lease table
and holder, a manual clock for every wait. Parking, retention, shard end (children first, a merge
child blocked on its other parent), failures of every step, and how each tenure ends."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import (
    DependencyError,
    KclpySparkError,
    RequestError,
    ResourceNotFoundError,
    ThrottledError,
)
from checkpoint.checkpointer import CheckpointError
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import HashKeyRange, Lease, LeaseState
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
)
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    Record,
    RecordProcessor,
    RedeliverFromCheckpoint,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN
from kclpy_spark.retrieval.source import FetchedBatch, FetchProgress, ReadElsewhere
from kclpy_spark.runtime.consumer import Outcome, ShardConsumer
from kclpy_spark.runtime.events import EventLog
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.shard_end import BLOCKED_RELEASE_EVERY
from kclpy_spark.spark.executor_reads import RangeReadError

SHARD = "shardId-000000000000"
OTHER = "shardId-000000000001"
CHILD = "shardId-000000000002"
OTHER_CHILD = "shardId-000000000003"
ATTEMPTS = 3


def records(*seqs: int) -> list[Record]:
    return [Record(f"r{s}".encode(), "k", str(s)) for s in seqs]


def batch(*seqs: int, lag: int = 0) -> FetchedBatch:
    return FetchedBatch(records(*seqs), lag)


def ended(children: list[dict[str, Any]]) -> FetchedBatch:
    return FetchedBatch([], 0, shard_ended=True, child_shards=children)


def child(shard: str, parents: list[str]) -> dict[str, Any]:
    return {
        "ShardId": shard,
        "ParentShards": parents,
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)},
    }


# "ok": the service answered, with nothing new; a callable runs first (e.g. moves the clock).
Script = list[FetchedBatch | Exception | str | Callable[[], None]]


class FakeSources:
    """A SourceFactory: each source plays the next script (batches; an exception stops it)."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.starts: list[tuple[ExtendedSequenceNumber, InitialPosition]] = []

    def __call__(
        self,
        shard_id: str,
        start: ExtendedSequenceNumber,
        position: InitialPosition,
        hash_range: HashKeyRange | None,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> Any:
        self.starts.append((start, position))
        script = self.scripts.pop(0) if self.scripts else []

        class Source:
            async def run(self) -> None:
                for item in script:
                    if isinstance(item, Exception):
                        raise item
                    if isinstance(item, str):
                        progress.ok()
                        continue
                    if callable(item):
                        item()
                        continue
                    await progress.put(queue, item)
                    if item.shard_ended:
                        return
                await asyncio.Event().wait()  # nothing more: a real source keeps polling

        return Source()


@dataclass
class FakeProbe:
    earliest: str | None = None
    gone: set[str] = field(default_factory=set)
    asked: list[str] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)  # raised by shard_exists first

    async def earliest_sequence_number(self, shard_id: str) -> str | None:
        return self.earliest

    async def shard_exists(self, shard_id: str) -> bool:
        self.asked.append(shard_id)
        if self.errors:
            raise self.errors.pop(0)
        return shard_id not in self.gone


class Recorder(RecordProcessor):
    """Checkpoints after each batch; ``fail`` decides which calls raise."""

    def __init__(self, fail: Callable[[str, object], bool] = lambda name, arg: False) -> None:
        self.calls: list[str] = []
        self.seen: list[str] = []
        self.fail = fail

    def _call(self, name: str, arg: object) -> None:
        self.calls.append(name)
        if self.fail(name, arg):
            raise RuntimeError(f"{name} failed")

    def initialize(self, initialize_input: InitializeInput) -> None:
        self._call("initialize", initialize_input)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self._call("process_records", process_records_input)
        self.seen += [r.sequence_number for r in process_records_input.records]
        process_records_input.checkpointer.checkpoint()

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        self.calls.append("lease_lost")

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        self.calls.append("shutdown_requested")


@dataclass
class Env:
    table: MemoryLeaseTable = field(default_factory=MemoryLeaseTable)
    clock: ManualClock = field(default_factory=ManualClock)
    probe: FakeProbe = field(default_factory=FakeProbe)
    processor: Recorder = field(default_factory=Recorder)

    def __post_init__(self) -> None:
        self.holder = LeaseHolder(self.table, "worker-a", self.clock, 1e9)
        self.cfg = WorkerConfig(
            stream_name="s", max_processing_attempts=ATTEMPTS, park_duration=60.0
        )
        self.events = EventLog("worker-a", self.clock.wall)
        self.metrics = WorkerMetrics(CoordinationCounters(), self.events)

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events.recent()]

    def lease(self, key: str = SHARD, **fields: Any) -> Lease:
        self.table.create_lease_if_absent(
            Lease(key, fields.pop("checkpoint", TRIM_HORIZON), **fields)
        )
        return self.stored(key)

    def stored(self, key: str = SHARD) -> Lease:
        lease = self.table.get_lease(key)
        assert lease is not None
        return lease

    def consumer(
        self,
        sources: FakeSources,
        *,
        factory: Callable[[], RecordProcessor] | None = None,
        position: InitialPosition | None = None,
    ) -> ShardConsumer:
        taken = self.table.take_lease(self.stored(), "worker-a")
        assert taken is not None
        return ShardConsumer(
            held=self.holder.add_taken(taken),
            holder=self.holder,
            table=self.table,
            processors=factory or (lambda: self.processor),
            sources=sources,
            probe=self.probe,
            cfg=self.cfg,
            clock=self.clock,
            sleep=self.clock.sleep,
            initial_position=position,
            metrics=self.metrics,
        )

    def run(
        self,
        consumer: ShardConsumer,
        until: Callable[[], bool] | None = None,
        then: Callable[[], None] | None = None,
    ) -> Outcome:
        """Run the consumer to its end; with ``until``, wait for it, then call ``then`` (by
        default: request shutdown)."""

        async def go() -> Outcome:
            task = asyncio.create_task(consumer.run())
            if until is not None:
                for _ in range(10_000):
                    if until() or task.done():
                        break
                    await asyncio.sleep(0)
                (then or consumer.request_shutdown)()
            return await asyncio.wait_for(task, 30)

        return asyncio.run(go())


def test_records_are_delivered_then_children_created_then_shard_end() -> None:
    env = Env()
    env.lease(hash_key_range=HashKeyRange(0, 2**128 - 1))
    split = [child(CHILD, [SHARD]), child(OTHER_CHILD, [SHARD])]
    outcome = env.run(env.consumer(FakeSources([batch(10, 20), batch(30), ended(split)])))
    assert outcome is Outcome.SHARD_END
    assert env.processor.seen == ["10", "20", "30"]
    assert env.processor.calls == [
        "initialize",
        "process_records",
        "process_records",
        "shard_ended",
    ]
    lease = env.stored()
    assert lease.checkpoint == SHARD_END and lease.lease_owner is None
    assert lease.child_shard_ids == frozenset({CHILD, OTHER_CHILD})
    assert env.stored(CHILD).checkpoint == TRIM_HORIZON  # the child leases exist
    assert env.stored(OTHER_CHILD).parent_shard_ids == frozenset({SHARD})
    assert env.kinds() == ["finished"]  # the status page's recent events


@pytest.mark.parametrize(
    ("fail", "what"),
    [
        (lambda name, arg: name == "process_records", "process_records"),
        (lambda name, arg: name == "initialize", "initialize"),
    ],
)
def test_a_step_that_keeps_failing_parks_the_lease_and_skips_nothing(
    fail: Callable[[str, object], bool], what: str
) -> None:
    env = Env(processor=Recorder(fail))
    env.lease(checkpoint=ExtendedSequenceNumber("5"))
    consumer = env.consumer(FakeSources([batch(10, 20)]))
    assert env.run(consumer) is Outcome.PARKED
    lease = env.stored()
    assert lease.state(env.clock.wall()) is LeaseState.CLOSED and lease.lease_owner is None
    assert lease.checkpoint == ExtendedSequenceNumber("5")  # nothing skipped
    assert lease.closed_until == pytest.approx(env.clock.wall() + 60.0)
    assert env.processor.calls.count(what.split(" ")[0]) == ATTEMPTS
    assert env.processor.calls[-1] == "lease_lost"
    assert what in consumer.stats.park_reason
    assert env.kinds() == ["parked"] and what in env.events.recent()[0]["detail"]


def test_a_batch_retried_after_a_partial_checkpoint_starts_after_that_checkpoint() -> None:
    """A processor that checkpointed part of a batch, then raised: the retry offered the whole
    batch again, records the lease's checkpoint already covers (the KCL never does)."""

    class CheckpointsThenFails(Recorder):
        failed = False

        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            records = process_records_input.records
            self.calls.append("process_records")
            self.seen += [r.sequence_number for r in records]
            if not self.failed:
                self.failed = True
                process_records_input.checkpointer.checkpoint(records[0].sequence_number)
                raise RuntimeError("after a checkpoint")
            process_records_input.checkpointer.checkpoint()

    env = Env()
    env.lease()
    env.processor = CheckpointsThenFails()
    assert env.run(env.consumer(FakeSources([batch(10, 20, 30), ended([])]))) is Outcome.SHARD_END
    assert env.processor.seen == ["10", "20", "30", "20", "30"]


def test_a_batch_wholly_checkpointed_before_its_processor_raised_is_not_offered_again() -> None:
    class CheckpointsAllThenFails(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            super().process_records(process_records_input)
            raise RuntimeError("after checkpointing everything")

    env = Env()
    env.lease()
    env.processor = CheckpointsAllThenFails()
    assert env.run(env.consumer(FakeSources([batch(10, 20), ended([])]))) is Outcome.SHARD_END
    assert env.processor.seen == ["10", "20"]


def test_a_processor_that_cannot_be_created_parks_the_lease() -> None:
    env = Env()
    env.lease()

    def factory() -> RecordProcessor:
        raise TypeError("__init__() missing 1 required positional argument: 'path'")

    consumer = env.consumer(FakeSources(), factory=factory)
    assert env.run(consumer) is Outcome.PARKED
    assert "creating the processor" in consumer.stats.park_reason
    assert env.stored().state(env.clock.wall()) is LeaseState.CLOSED


def test_a_refused_iterator_is_retried_then_parks() -> None:
    """A non-retriable read failure (e.g. GetShardIterator refused) counts and parks; it is not
    a release-and-retake loop."""
    env = Env()
    env.lease(checkpoint=AT_TIMESTAMP)
    refused = RequestError("GetShardIterator: InvalidArgumentException: timestamp in the future")
    sources = FakeSources(*[[refused]] * ATTEMPTS)
    consumer = env.consumer(sources, position=InitialPosition.at_timestamp(1_700_000_000.0))
    assert env.run(consumer) is Outcome.PARKED
    assert len(sources.starts) == ATTEMPTS
    assert "reading the shard" in consumer.stats.park_reason


def test_a_source_that_stops_is_restarted_after_the_last_record_delivered() -> None:
    env = Env()
    env.lease()
    gone = ResourceNotFoundError("GetRecords: the shard vanished for a moment")
    sources = FakeSources([batch(10, 20), gone], [batch(30), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    assert [start for start, _ in sources.starts] == [TRIM_HORIZON, ExtendedSequenceNumber("20")]
    assert env.processor.seen == ["10", "20", "30"]


@pytest.mark.parametrize(
    ("policy", "outcome", "restart"),
    [("fail", Outcome.PARKED, None), ("earliest", Outcome.SHARD_END, TRIM_HORIZON)],
)
def test_a_checkpoint_older_than_the_retention(
    policy: str, outcome: Outcome, restart: ExtendedSequenceNumber | None
) -> None:
    env = Env(probe=FakeProbe(earliest="500"))
    env.cfg = WorkerConfig(
        stream_name="s", max_processing_attempts=ATTEMPTS, aged_checkpoint_policy=policy
    )
    env.lease(checkpoint=ExtendedSequenceNumber("100"))
    sources = FakeSources([batch(500), ended([])])
    assert env.run(env.consumer(sources)) is outcome
    if restart is None:
        assert env.stored().state(env.clock.wall()) is LeaseState.CLOSED
        assert env.processor.calls == []  # parked before initialize: no processor was made
    else:
        assert sources.starts[0][0] == restart
        assert env.stored().checkpoint == SHARD_END


ESN_120 = ExtendedSequenceNumber("120")


def test_a_piece_pending_from_a_start_position_that_aged_out_is_dropped_by_the_policy() -> None:
    """A lease at TRIM_HORIZON wrote its first piece's pending checkpoint and its worker died;
    nobody took it within the retention: the piece's records were gone, and reading on the
    executors pinned to them failed every tenure (the retention check looked at sequence-number
    checkpoints only)."""
    env = Env(probe=FakeProbe(earliest="500"))
    env.cfg = WorkerConfig(
        stream_name="s", max_processing_attempts=ATTEMPTS, aged_checkpoint_policy="earliest"
    )
    pending_seen: list[ExtendedSequenceNumber | None] = []

    class Looks(Recorder):  # what the lease holds when the first records come
        def initialize(self, initialize_input: InitializeInput) -> None:
            pending_seen.append(env.stored().pending_checkpoint)
            super().initialize(initialize_input)

    env.processor = Looks()
    env.lease(pending_checkpoint=ExtendedSequenceNumber("120"))  # checkpoint TRIM_HORIZON
    sources = FakeSources([batch(500), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    assert pending_seen == [None] and env.processor.seen == ["500"]  # the piece was dropped
    assert sources.starts[0][0] == TRIM_HORIZON
    # Policy "latest" on a pinned LATEST lease: the pin goes too (it is older than the stream).
    latest = Env(probe=FakeProbe(earliest="500"))
    latest.cfg = WorkerConfig(
        stream_name="s", max_processing_attempts=ATTEMPTS, aged_checkpoint_policy="latest"
    )
    latest.lease(checkpoint=LATEST, start_timestamp=5.0, pending_checkpoint=ESN_120)
    latest_sources = FakeSources([batch(600), ended([])])
    assert latest.run(latest.consumer(latest_sources)) is Outcome.SHARD_END
    assert latest_sources.starts[0] == (LATEST, InitialPosition.latest())
    env.probe.earliest, pending_seen[:] = "100", []  # still in the stream: it stays
    env.table.delete_lease(env.stored())
    env.lease(pending_checkpoint=ExtendedSequenceNumber("120"))
    assert env.run(env.consumer(FakeSources([batch(110, 120), ended([])]))) is Outcome.SHARD_END
    assert pending_seen == [ExtendedSequenceNumber("120")]


def test_pieces_pending_whose_first_records_aged_out_are_dropped_by_the_policy() -> None:
    """A piece read from TRIM_HORIZON begins at the stream's oldest record: a takeover late by
    a little aged its head first. Its last record was compared: still in the stream, so the
    read pinned to the piece failed every tenure (re-formed on the driver: another piece)."""

    class Factory:  # the Spark sink's factory knows where its pending pieces begin
        def __init__(self, env: Env) -> None:
            self.env, self.pending_seen = env, []

        def __call__(self) -> RecordProcessor:
            self.pending_seen.append(self.env.stored().pending_checkpoint)
            return self.env.processor

        def pending_first(self, lease: Lease) -> ExtendedSequenceNumber | None:
            return ExtendedSequenceNumber("400")  # the pieces 400..600: their head aged out

    for knows in (True, False):
        env = Env(probe=FakeProbe(earliest="500"))
        env.cfg = WorkerConfig(
            stream_name="s", max_processing_attempts=ATTEMPTS, aged_checkpoint_policy="earliest"
        )
        env.lease(pending_checkpoint=ExtendedSequenceNumber("600"))
        factory = Factory(env)
        made = factory if knows else (lambda f=factory: f())  # type: ignore[misc]
        outcome = env.run(env.consumer(FakeSources([batch(500), ended([])]), factory=made))
        assert outcome is Outcome.SHARD_END
        # Told where they begin: dropped (read on from the oldest record); else the last
        # record (600) is still in the stream and the pieces stay to be re-formed.
        assert factory.pending_seen == [None if knows else ExtendedSequenceNumber("600")]


def test_a_merge_child_blocked_on_its_other_parent_keeps_the_lease_and_never_skips_it() -> None:
    """Issue 14, finding 6: SHARD_END used to be checkpointed without the child's lease."""
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([batch(10), ended([child(CHILD, [SHARD, OTHER])])]))

    async def go() -> Outcome:
        task = asyncio.create_task(consumer.run())
        while not env.probe.asked:  # asked whether the other parent still exists: blocked
            await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        # Blocked: no child, no SHARD_END, and the lease still ours.
        assert env.table.get_lease(CHILD) is None
        assert env.stored().checkpoint == ExtendedSequenceNumber("10")
        assert env.stored().lease_owner == "worker-a"
        # Shard sync creates the other parent's lease: the child follows, then SHARD_END.
        env.table.create_lease_if_absent(Lease(OTHER, TRIM_HORIZON))
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(go()) is Outcome.SHARD_END
    assert env.stored(CHILD).parent_shard_ids == frozenset({SHARD, OTHER})
    assert env.stored().checkpoint == SHARD_END


def test_a_child_reads_nothing_until_every_parent_lease_is_at_shard_end() -> None:
    """Parents first, the child's side: no test failed when the wait returned at once."""
    env = Env()
    env.lease(OTHER, checkpoint=ExtendedSequenceNumber("10"))  # the parent, still being read
    env.lease(parent_shard_ids=frozenset({OTHER}))  # the child
    sources = FakeSources([batch(20), ended([])])
    consumer = env.consumer(sources)

    async def go() -> Outcome:
        task = asyncio.create_task(consumer.run())
        for _ in range(200):  # the clock moves with each wait: many polls of the parent
            await asyncio.sleep(0)
        assert env.processor.calls == [] and sources.starts == []  # not even initialize
        parent = env.stored(OTHER)
        assert env.table.update_lease(parent.checkpointed(SHARD_END)) is not None
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(go()) is Outcome.SHARD_END
    assert env.processor.calls[0] == "initialize" and env.processor.seen == ["20"]
    assert env.clock.monotonic() >= 2 * env.cfg.parent_shard_poll_interval  # it did wait


def test_a_merge_parent_that_aged_out_of_the_stream_does_not_block_the_child() -> None:
    env = Env(probe=FakeProbe(gone={OTHER}))
    env.lease()
    assert env.run(
        env.consumer(FakeSources([batch(10), ended([child(CHILD, [SHARD, OTHER])])]))
    ) is (Outcome.SHARD_END)
    assert env.table.get_lease(CHILD) is not None
    assert env.stored().checkpoint == SHARD_END


def test_a_long_blocked_merge_releases_the_lease_for_another_worker() -> None:
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([batch(10), ended([child(CHILD, [SHARD, OTHER])])]))
    assert env.run(consumer) is Outcome.RELEASED
    assert len(env.probe.asked) == BLOCKED_RELEASE_EVERY
    lease = env.stored()
    assert lease.lease_owner is None and lease.checkpoint == ExtendedSequenceNumber("10")
    assert env.table.get_lease(CHILD) is None
    assert env.processor.calls[-1] == "lease_lost"


def test_an_unexpected_failure_parks_the_lease_and_tells_the_processor() -> None:
    """Issue 14, finding 8: a consumer task that raised dropped its lease silently."""
    env = Env()
    env.lease()

    class Broken(FakeSources):
        def __call__(self, *args: Any) -> Any:
            raise TypeError("a bug in the consumer's own code")

    consumer = env.consumer(Broken())
    assert env.run(consumer) is Outcome.PARKED
    assert "TypeError" in consumer.stats.park_reason
    assert env.stored().state(env.clock.wall()) is LeaseState.CLOSED
    assert env.processor.calls == ["initialize", "lease_lost"]


def test_a_lost_lease_stops_the_consumer_and_tells_the_processor() -> None:
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([batch(10)]))
    outcome = env.run(consumer, until=lambda: bool(env.processor.seen), then=consumer.lease_lost)
    assert outcome is Outcome.LEASE_LOST
    assert env.processor.calls[-1] == "lease_lost"
    assert env.kinds() == ["lost"]


def test_shutdown_asks_the_processor_to_checkpoint_then_says_the_lease_is_gone() -> None:
    """As the KCL: shutdownRequested, then leaseLost (a processor's
    clean-up in lease_lost never ran on SIGTERM, a suspend or a hand-off)."""
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([batch(10)]))
    assert env.run(consumer, until=lambda: bool(env.processor.seen)) is Outcome.SHUTDOWN
    assert env.processor.calls[-2:] == ["shutdown_requested", "lease_lost"]


def test_an_at_timestamp_lease_starts_at_its_own_stored_time() -> None:
    env = Env()
    env.lease(checkpoint=AT_TIMESTAMP, start_timestamp=1_700_000_123.0)
    sources = FakeSources([ended([])])
    configured = InitialPosition.at_timestamp(1_600_000_000.0)
    env.run(env.consumer(sources, position=configured))
    assert sources.starts == [(AT_TIMESTAMP, InitialPosition.at_timestamp(1_700_000_123.0))]


# --- review fixes: shard end, failures in a row, LATEST restarts, hung calls, tasks -------------


class NoShardEnd(Recorder):
    """shard_ended that never checkpoints SHARD_END (or raises, with ``raises``)."""

    def __init__(self, raises: bool = False) -> None:
        super().__init__()
        self.raises = raises

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        if self.raises:
            raise RuntimeError("the sink is down")


@pytest.mark.parametrize("raises", [False, True])
def test_a_shard_end_the_processor_never_completes_parks_instead_of_looping(raises: bool) -> None:
    """It was retried forever: the lease renewed, the children never started, and the worker
    said "ready" the whole time."""
    env = Env(processor=NoShardEnd(raises))
    env.lease()
    consumer = env.consumer(FakeSources([batch(10), ended([])]))
    assert env.run(consumer) is Outcome.PARKED
    assert env.processor.calls.count("shard_ended") == ATTEMPTS
    assert "shard_ended" in consumer.stats.park_reason
    lease = env.stored()
    assert lease.checkpoint == ExtendedSequenceNumber("10") and lease.lease_owner is None


class EndsThenRaises(Recorder):
    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        shard_ended_input.checkpointer.checkpoint()
        raise RuntimeError("closing a file after the SHARD_END checkpoint failed")


def test_shard_ended_that_raises_after_checkpointing_shard_end_still_finishes_the_shard() -> None:
    """It counted as a failure: shard_ended was called three times, then the lease was to be
    parked, which a finished lease refuses, so it stayed owned and lease_lost followed."""
    env = Env(processor=EndsThenRaises())
    env.lease()
    assert env.run(env.consumer(FakeSources([batch(10), ended([])]))) is Outcome.SHARD_END
    assert env.processor.calls.count("shard_ended") == 1
    assert "lease_lost" not in env.processor.calls
    lease = env.stored()
    assert lease.checkpoint == SHARD_END and lease.lease_owner is None


def test_child_leases_the_table_refuses_count_as_shard_end_failures_not_read_failures() -> None:
    env = Env()
    env.lease()
    original = env.table.create_lease_if_absent

    def refuse(lease: Lease) -> Any:
        if lease.lease_key == CHILD:
            raise KclpySparkError("the table refused the child lease")
        return original(lease)

    env.table.create_lease_if_absent = refuse  # type: ignore[method-assign]
    sources = FakeSources([batch(10), ended([child(CHILD, [SHARD])])])
    consumer = env.consumer(sources)
    assert env.run(consumer) is Outcome.PARKED
    assert len(sources.starts) == 1  # the shard was not read again for it
    assert "child leases" in consumer.stats.park_reason
    assert env.stored().checkpoint == ExtendedSequenceNumber("10")  # no SHARD_END


def test_a_throttled_parent_lookup_during_a_blocked_merge_is_waited_out_not_counted() -> None:
    env = Env(probe=FakeProbe(gone={OTHER}, errors=[ThrottledError("slow down")] * 5))
    env.lease()
    consumer = env.consumer(FakeSources([batch(10), ended([child(CHILD, [SHARD, OTHER])])]))
    assert env.run(consumer) is Outcome.SHARD_END
    assert consumer.stats.failures == 0
    assert env.stored(CHILD).parent_shard_ids == frozenset({SHARD, OTHER})


def test_a_failed_release_after_shard_end_still_ends_the_shard() -> None:
    """SHARD_END is stored: a release that fails afterwards used to end as a lost lease, telling
    the processor lease_lost after shard_ended."""
    env = Env()
    env.lease()

    def broken_evict(lease: Lease) -> Lease | None:
        raise DependencyError("the table did not answer")

    env.table.evict_lease = broken_evict  # type: ignore[method-assign]
    consumer = env.consumer(FakeSources([batch(10), ended([])]))
    assert env.run(consumer) is Outcome.SHARD_END
    assert env.processor.calls[-1] == "shard_ended"
    assert env.stored().checkpoint == SHARD_END


def test_rare_read_failures_with_answers_in_between_never_add_up_to_a_park() -> None:
    """The budget counts failures in a row: a read that kept getting answers for a while after
    the last failure starts it again (an idle shard with an error every few days used to be
    parked)."""
    env = Env()
    env.lease()
    flaky = ResourceNotFoundError("GetRecords: a passing error")
    hours_later: Script = ["ok", lambda: env.clock.advance(3600.0), "ok", flaky]
    sources = FakeSources(*[hours_later] * (ATTEMPTS * 3), [batch(10), ended([])])
    consumer = env.consumer(sources)
    assert env.run(consumer) is Outcome.SHARD_END
    assert consumer.stats.failures == ATTEMPTS * 3
    assert env.processor.seen == ["10"]


@pytest.mark.parametrize("processor", ["Recorder", "GivesUpWhileIdle", "EmptyListsToo"])
def test_a_read_that_answers_once_then_fails_each_time_still_parks(processor: str) -> None:
    """Also when its one answer is an empty read at the tip that a processor is called after
    (IdleAware, or asking for empty lists): that call's success started the count again."""
    env = Env(processor=globals()[processor]())  # classes defined further down
    env.lease()
    flaky = ResourceNotFoundError("GetRecords: fails right after its first answer")
    sources = FakeSources(*[[FetchedBatch([], 0), flaky]] * (ATTEMPTS + 2))
    consumer = env.consumer(sources)
    assert env.run(consumer) is Outcome.PARKED
    assert len(sources.starts) == ATTEMPTS


def test_a_read_on_the_executors_that_fails_each_time_still_parks() -> None:
    """read_on = executors: each relay announces the lease before its read fails. The
    announcement reaching the processor is no answer from the shard: it used to count as a
    success, so the failures never went past one and the lease was read again forever."""
    env = Env()
    env.lease()
    failing = RangeReadError("shard shardId-000000000000: AccessDeniedException")
    sources = FakeSources(*[[FetchedBatch([], None, announce=True), failing]] * (ATTEMPTS + 2))
    consumer = env.consumer(sources)
    assert env.run(consumer) is Outcome.PARKED
    assert len(sources.starts) == ATTEMPTS


def test_reads_on_the_executors_between_failures_keep_the_failures_from_adding_up() -> None:
    """A read job lost now and then (an executor lost every 30 s, say) failed every lease of
    the round, and reads between them never reset the count (only records delivered did):
    after ``max_processing_attempts`` such failures every lease of the worker parked."""
    env = Env()
    env.lease()
    failing = RangeReadError("shard shardId-000000000000: the read job failed: an executor lost")
    read = FetchedBatch([], 100, elsewhere=ReadElsewhere(50, 500, "20"))
    script = [FetchedBatch([], None, announce=True), read, lambda: env.clock.advance(30.0),
              read, failing]  # fmt: skip
    sources = FakeSources(*[list(script) for _ in range(ATTEMPTS * 3)],
                          [FetchedBatch([], None, announce=True), ended([])])  # fmt: skip
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END


def test_a_cluster_outage_failing_every_read_job_whole_never_parks_a_lease() -> None:
    """A read job that failed whole (executors lost, the cluster down for minutes) was posted
    to every lease of the round as a counted failure: within a few minutes every lease of the
    worker parked, though no shard was at fault. Now each waits a backoff and reads again."""
    from kclpy_spark.spark.executor_reads import ReadJobFailedError

    env = Env()
    env.lease()
    down = ReadJobFailedError("shard shardId-000000000000: the read job failed: no executors")
    outage = [[FetchedBatch([], None, announce=True), down]] * (ATTEMPTS * 3)
    sources = FakeSources(*outage, [FetchedBatch([], None, announce=True), ended([])])
    consumer = env.consumer(sources)
    assert env.run(consumer) is Outcome.SHARD_END
    assert consumer.stats.failures == 0 and len(sources.starts) == ATTEMPTS * 3 + 1


def test_a_latest_read_restarted_before_delivering_resumes_at_its_start_time() -> None:
    """A new LATEST iterator after a failed first read skipped what was written in between."""
    env = Env()
    env.lease(checkpoint=LATEST)
    env.clock.advance(1000.0)
    started = env.clock.wall()
    gone = ResourceNotFoundError("GetRecords: the shard vanished for a moment")
    sources = FakeSources([gone], [gone], [batch(10), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    since = InitialPosition.at_timestamp(started - LATEST_RESTART_MARGIN)
    assert [s for s, _ in sources.starts] == [LATEST, AT_TIMESTAMP, AT_TIMESTAMP]
    assert [p for _, p in sources.starts[1:]] == [since, since]
    assert env.processor.seen == ["10"]


def test_where_a_latest_read_began_is_stored_for_the_next_tenure() -> None:
    """Parked (or crashed, or handed over) before its first delivery, a LATEST lease used to
    start at a new LATEST in its next tenure, skipping everything in between."""
    env = Env(processor=Recorder(lambda name, arg: name == "process_records"))
    env.lease(checkpoint=LATEST)
    env.clock.advance(1000.0)
    started = env.clock.wall()
    assert env.run(env.consumer(FakeSources([batch(10)]))) is Outcome.PARKED
    lease = env.stored()
    # Beside LATEST, not as the AT_TIMESTAMP sentinel: a Java KCL worker under LATEST reads that
    # sentinel with its own configured time, which it does not have (it failed for good).
    assert lease.checkpoint == LATEST
    assert lease.start_timestamp == started - LATEST_RESTART_MARGIN
    env.clock.advance(120.0)  # the park is over: the next tenure starts where the first began
    env.processor = Recorder()
    sources = FakeSources([batch(10), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    assert sources.starts == [
        (AT_TIMESTAMP, InitialPosition.at_timestamp(started - LATEST_RESTART_MARGIN))
    ]
    assert env.processor.seen == ["10"]


def test_a_latest_read_pinned_only_after_retries_reads_from_the_pin() -> None:
    """The pin's write was throttled for tens of seconds (retried); the source, made only then,
    asked LATEST at that time: what arrived after the pin was skipped, though the lease said the
    read covered it."""
    from checkpoint.base.errors import ThrottledError

    class ThrottlesThePin(MemoryLeaseTable):
        left = 8

        def update_lease(self, lease: Lease) -> Lease | None:
            if lease.start_timestamp is not None and self.left:
                self.left -= 1
                raise ThrottledError("throttled")
            return super().update_lease(lease)

    env = Env(table=ThrottlesThePin())
    env.holder.table = env.table
    env.lease(checkpoint=LATEST)
    pinned = env.clock.wall() - LATEST_RESTART_MARGIN  # where the read begins, as stored

    class Made(FakeSources):  # when the source is made, and the pin stored by then
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            made.append((env.clock.wall(), env.stored().start_timestamp))
            return super().__call__(*args, **kwargs)

    made: list[tuple[float, float | None]] = []
    sources = Made([batch(10)])
    env.run(env.consumer(sources), until=lambda: env.processor.seen == ["10"])
    [(at, stored)] = made
    assert stored == pinned and at - pinned > 2 * LATEST_RESTART_MARGIN  # retried that long
    assert sources.starts == [(AT_TIMESTAMP, InitialPosition.at_timestamp(pinned))]


def test_an_idle_latest_lease_stays_one_a_java_kcl_worker_can_start() -> None:
    """A LATEST lease read once and left idle was stored at the AT_TIMESTAMP sentinel: a Java
    KCL worker configured LATEST (a rollback, a mixed fleet) builds that iterator from its own
    configured time, none under LATEST, and failed on the shard for good."""
    from checkpoint.stores.dynamo_codec import START_TIMESTAMP, progress_changes
    from kclpy_spark.retrieval.source import FetchedBatch

    env = Env()
    env.lease(checkpoint=LATEST)
    consumer = env.consumer(FakeSources([FetchedBatch([], 0)]))  # at the tip, nothing new
    outcome = env.run(consumer, until=lambda: consumer.stats.millis_behind_latest == 0)
    assert outcome is Outcome.SHUTDOWN
    sets, _ = progress_changes(env.stored())
    assert sets["checkpoint"] == {"S": "LATEST"} and START_TIMESTAMP in sets


def test_a_latest_read_pinned_after_its_first_records_arrived_is_pinned_at_them() -> None:
    """A host clock more than the margin ahead of Kinesis's pinned the first LATEST read after
    records it then delivered: a restart before the first checkpoint (from the pin) skipped
    them. The first records' arrival (Kinesis's clock) moves the pin back before delivery."""

    class Keeps(Recorder):  # delivers, never checkpoints
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            self.seen += [r.sequence_number for r in process_records_input.records]

    env = Env(processor=Keeps())
    env.lease(checkpoint=LATEST)
    env.clock.advance(1000.0)
    pinned = env.clock.wall() - LATEST_RESTART_MARGIN
    early = int((pinned - 20.0) * 1000)  # arrived 20 s before the host's pin
    first = FetchedBatch([Record(b"r", "k", "10", timestamp_millis=early)], 0)
    consumer = env.consumer(FakeSources([first]))
    assert env.run(consumer, until=lambda: env.processor.seen == ["10"]) is Outcome.SHUTDOWN
    stored = env.stored()
    assert stored.checkpoint == LATEST and stored.start_timestamp == early / 1000
    on_time = Env(processor=Keeps())  # arrived after the pin: the pin stays
    on_time.lease(checkpoint=LATEST)
    later = Record(b"r", "k", "10", timestamp_millis=int((on_time.clock.wall() + 1.0) * 1000))
    consumer = on_time.consumer(FakeSources([FetchedBatch([later], 0)]))
    assert on_time.run(consumer, until=lambda: on_time.processor.seen == ["10"])
    assert on_time.stored().start_timestamp == on_time.clock.wall() - LATEST_RESTART_MARGIN


def test_a_checkpoint_before_any_delivery_keeps_the_stored_latest_start() -> None:
    class CheckpointsAtShutdown(Recorder):
        def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
            super().shutdown_requested(shutdown_requested_input)
            shutdown_requested_input.checkpointer.checkpoint()  # nothing delivered yet

    env = Env(processor=CheckpointsAtShutdown())
    env.lease(checkpoint=LATEST)
    sources = FakeSources([])
    consumer = env.consumer(sources)
    outcome = env.run(consumer, until=lambda: env.stored().start_timestamp is not None)
    assert outcome is Outcome.SHUTDOWN
    assert env.processor.calls[-2:] == ["shutdown_requested", "lease_lost"]
    stored = env.stored()
    assert stored.checkpoint == LATEST and stored.start_timestamp is not None  # the pin stays


def test_a_processor_call_is_timed_while_it_runs() -> None:
    import threading

    env = Env()
    env.lease()
    release = threading.Event()
    entered = threading.Event()

    class Slow(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            entered.set()
            assert release.wait(10.0)
            super().process_records(process_records_input)

    env.processor = Slow()
    consumer = env.consumer(FakeSources([batch(10), ended([])]))
    seen: list[float | None] = []

    async def go() -> Outcome:
        task = asyncio.create_task(consumer.run())
        while not entered.is_set():
            await asyncio.sleep(0.001)
        seen.append(consumer.stats.call_started)
        env.clock.advance(1000.0)
        release.set()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(go()) is Outcome.SHARD_END
    assert seen[0] is not None and consumer.stats.call_started is None


def test_a_lease_lost_call_is_timed_while_it_runs() -> None:
    """A lease_lost that never returned left the consumer 'running', untimed: the worker never
    showed it as hung, and never took the lease again."""
    import threading

    env = Env()
    env.lease()
    release = threading.Event()
    entered = threading.Event()

    class SlowToLetGo(Recorder):
        def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
            entered.set()
            assert release.wait(10.0)
            super().lease_lost(lease_lost_input)

    env.processor = SlowToLetGo()
    consumer = env.consumer(FakeSources([batch(10)]))
    seen: list[float | None] = []

    async def go() -> Outcome:
        task = asyncio.create_task(consumer.run())
        while not env.processor.seen:
            await asyncio.sleep(0.001)
        consumer.lease_lost()
        while not entered.is_set():
            await asyncio.sleep(0.001)
        seen.append(consumer.stats.call_started)
        release.set()
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(go()) is Outcome.LEASE_LOST
    assert seen[0] is not None and consumer.stats.call_started is None


def test_a_tenure_that_ends_while_waiting_for_records_leaves_no_task_behind() -> None:
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([batch(10)]))  # then the source waits forever
    left: list[set[asyncio.Task[Any]]] = []

    async def go() -> Outcome:
        task = asyncio.create_task(consumer.run())
        while not env.processor.seen:
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)  # the consumer waits on its queue now
        consumer.lease_lost()
        outcome = await asyncio.wait_for(task, 30)
        for _ in range(5):
            await asyncio.sleep(0)
        left.append(asyncio.all_tasks() - {asyncio.current_task()})  # type: ignore[arg-type]
        return outcome

    assert asyncio.run(go()) is Outcome.LEASE_LOST
    assert left == [set()]


class GivesUpWhileIdle(Recorder):
    """An IdleAware processor whose sink gave up after the first batch: ``no_records`` raises
    (the Spark sink's processor raises SinkParkedError there)."""

    def no_records(self) -> None:
        self.calls.append("no_records")
        if "process_records" in self.calls:
            raise RuntimeError("the sink gave up on a batch of this lease")


def test_an_idle_aware_processor_parks_its_lease_on_a_quiet_stream() -> None:
    """#49 item 8: after the sink gave up, the lease was parked only at the next record; on a
    quiet stream never, and /readyz stayed 200. Empty reads at the tip now ask the processor."""
    env = Env(processor=GivesUpWhileIdle())
    env.lease()
    quiet = [FetchedBatch([], 0)] * (ATTEMPTS + 2)
    consumer = env.consumer(FakeSources([FetchedBatch([], 0), batch(10), *quiet]))
    assert env.run(consumer) is Outcome.PARKED
    assert env.processor.calls.count("no_records") == 1 + ATTEMPTS  # once fine, then failing
    assert "no_records failed" in consumer.stats.park_reason
    assert env.stored().state(env.clock.wall()) is LeaseState.CLOSED


def test_a_plain_processor_is_not_called_for_empty_reads() -> None:
    env = Env()
    env.lease()
    consumer = env.consumer(FakeSources([FetchedBatch([], 0), batch(10), FetchedBatch([], 0)]))
    env.run(consumer, until=lambda: env.processor.seen == ["10"])
    assert env.processor.calls == [
        "initialize",
        "process_records",
        "shutdown_requested",
        "lease_lost",
    ]


class EmptyListsToo(Recorder):
    """Asks for the KCL's callProcessRecordsEvenForEmptyRecordList; records the lag it is told."""

    call_process_records_even_for_empty_record_list = True

    def __init__(self, fail: Callable[[str, object], bool] = lambda name, arg: False) -> None:
        super().__init__(fail)
        self.lags: list[tuple[int, int]] = []  # (records, millis behind) of each call

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.lags.append(
            (len(process_records_input.records), process_records_input.millis_behind_latest)
        )
        super().process_records(process_records_input)


def test_a_processor_asking_for_empty_lists_is_called_after_each_empty_read() -> None:
    """The KCL's callProcessRecordsEvenForEmptyRecordList: process_records with no records after
    an empty read at the tip (the only empty reads a source passes on); its checkpoint() stays
    at the last record delivered."""
    env = Env(processor=EmptyListsToo())
    env.lease()
    script: Script = [FetchedBatch([], 0), batch(10, lag=40), FetchedBatch([], 0)]
    consumer = env.consumer(FakeSources(script))
    env.run(consumer, until=lambda: len(env.processor.lags) == 3)
    assert env.processor.lags == [(0, 0), (1, 40), (0, 0)]
    assert env.stored().checkpoint == ExtendedSequenceNumber("10")


def test_rare_failures_of_empty_list_calls_never_add_up_to_a_park() -> None:
    """A successful empty call did not start the count again: one failure in three quiet reads
    parked the lease after max_processing_attempts of them, "in a row"."""
    calls = iter(range(10**6))
    env = Env(processor=EmptyListsToo(fail=lambda name, arg: next(calls) % 3 == 2))
    env.lease()
    quiet = [FetchedBatch([], 0)] * (ATTEMPTS * 4)
    consumer = env.consumer(FakeSources(quiet))
    outcome = env.run(consumer, until=lambda: len(env.processor.lags) >= ATTEMPTS * 4)
    assert outcome is Outcome.SHUTDOWN and not consumer.stats.park_reason


def test_no_empty_list_at_the_shard_end() -> None:
    """As the KCL: a read that ends the shard with no records goes to shard_ended only."""
    env = Env(processor=EmptyListsToo())
    env.lease()
    consumer = env.consumer(FakeSources([batch(10), ended([])]))
    assert env.run(consumer) is Outcome.SHARD_END
    assert env.processor.lags == [(1, 0)]
    assert "shard_ended" in env.processor.calls


def test_an_empty_list_call_that_keeps_failing_parks_the_lease() -> None:
    env = Env(processor=EmptyListsToo(fail=lambda name, arg: name == "process_records"))
    env.lease()
    consumer = env.consumer(FakeSources([FetchedBatch([], 0)] * (ATTEMPTS + 1)))
    assert env.run(consumer) is Outcome.PARKED
    assert env.processor.calls.count("process_records") == ATTEMPTS
    assert "process_records failed" in consumer.stats.park_reason


def test_records_read_elsewhere_are_counted_for_the_lease_not_delivered() -> None:
    """read_on = executors: the records go to the sink on the executors; the lease's figures
    (status, /metrics) still count them."""
    env = Env()
    env.lease()
    read = FetchedBatch([], 500, elsewhere=ReadElsewhere(3, 600, "30"))
    more = FetchedBatch([], 0, elsewhere=ReadElsewhere(2, 400, "50"))
    consumer = env.consumer(FakeSources([FetchedBatch([], None, announce=True), read, more]))
    env.run(consumer, until=lambda: consumer.stats.records == 5)
    stats = consumer.stats
    assert (stats.records, stats.bytes, stats.last_delivered) == (5, 1000, "50")
    labels = dict(zip(("stream", "shard"), env.metrics.shard(SHARD), strict=True))
    sample = env.metrics.registry.get_sample_value
    assert sample("kclpy_spark_records_processed_total", labels) == 5
    assert sample("kclpy_spark_bytes_processed_total", labels) == 1000
    assert env.processor.seen == []  # nothing delivered through this process


def test_kpl_sub_records_skipped_on_the_executors_are_counted_and_logged_here(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/guarantees.md: such a skip is logged and counted, never silent. Read on the
    executors, its line went to the executor's log only and the metric stayed 0."""
    env = Env()
    env.lease()
    skipped = FetchedBatch([], 0, elsewhere=ReadElsewhere(0, 0, None, out_of_range=4))
    consumer = env.consumer(FakeSources([FetchedBatch([], None, announce=True), skipped]))
    labels = dict(zip(("stream", "shard"), env.metrics.shard(SHARD), strict=True))
    sample = env.metrics.registry.get_sample_value
    name = "kclpy_spark_kpl_subrecords_out_of_range_total"
    with caplog.at_level(logging.WARNING, logger="kclpy_spark.runtime.consumer"):
        env.run(consumer, until=lambda: sample(name, labels) is not None)
    assert sample(name, labels) == 4 and consumer.stats.records == 0
    assert any("4 KPL sub-record(s)" in r.getMessage() for r in caplog.records)


class Exits(Recorder):
    """process_records calls sys.exit(0) (a user's way to give up on a batch)."""

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.calls.append("process_records")
        raise SystemExit(0)


def test_sys_exit_in_process_records_is_a_failure_not_the_daemons_end() -> None:
    """#49's poor list: SystemExit(0) from process_records (run in a thread, re-raised on the
    loop) ended the whole daemon with exit status 0, which a supervisor does not restart."""
    env = Env(processor=Exits())
    env.lease()
    consumer = env.consumer(FakeSources([batch(10)]))
    assert env.run(consumer) is Outcome.PARKED
    assert env.processor.calls.count("process_records") == ATTEMPTS
    assert "SystemExit(0)" in consumer.stats.park_reason


class CancelledInside(Recorder):
    """process_records meets a cancelled future of its own (a pool shut down with
    ``cancel_futures``, a producer library's future): CancelledError, plain or async."""

    def __init__(self, use_async: bool) -> None:
        super().__init__()
        self.use_async = use_async

    def process_records(self, process_records_input: ProcessRecordsInput) -> Any:
        self.calls.append("process_records")
        if not self.use_async:
            future: concurrent.futures.Future[None] = concurrent.futures.Future()
            future.cancel()
            future.result()  # concurrent.futures.CancelledError: an Exception, in a thread

        async def awaits_a_cancelled_task() -> None:
            task = asyncio.get_running_loop().create_task(asyncio.sleep(10))
            task.cancel()
            await task  # asyncio.CancelledError, though nobody cancelled the consumer

        return awaits_a_cancelled_task()


@pytest.mark.parametrize("use_async", [False, True])
def test_a_cancelled_error_of_the_processors_own_is_a_failed_call(use_async: bool) -> None:
    """It ended the consumer's task as a cancel of the worker's: no outcome, no lease_lost, no
    release, and the lease renewed here for good with nobody reading it."""
    env = Env(processor=CancelledInside(use_async))
    env.lease()
    consumer = env.consumer(FakeSources([batch(10)]))
    assert env.run(consumer) is Outcome.PARKED
    assert env.processor.calls.count("process_records") == ATTEMPTS
    assert "CancelledError" in consumer.stats.park_reason


def test_keyboard_interrupt_on_the_loop_is_not_taken_for_the_processors() -> None:
    """In a thread only user code can raise KeyboardInterrupt (a failed call); on the event loop
    it may be the user's Ctrl-C in an embedding program, and must go on stopping it."""
    import asyncio as aio

    from kclpy_spark.runtime.tenure import ProcessorExitError, call_processor

    def in_thread(_: object) -> None:
        raise KeyboardInterrupt

    async def on_loop(_: object) -> None:
        raise KeyboardInterrupt

    with pytest.raises(ProcessorExitError, match="KeyboardInterrupt"):
        aio.run(call_processor(in_thread, None, lambda _: None))
    with pytest.raises(KeyboardInterrupt):
        aio.run(call_processor(on_loop, None, lambda _: None))


def test_a_reads_silence_counts_from_when_reading_began_not_from_the_consumers_start() -> None:
    """The time spent waiting for the parents (or initializing) counted as a silent read: once
    processing, /readyz said "no successful read lately" until the first answer came."""
    env = Env()
    env.lease()
    silence: list[float] = []
    consumer = env.consumer(FakeSources([lambda: silence.append(consumer.progress.silent_for())]))
    env.clock.advance(600.0)  # built long ago: the parents took ten minutes to end
    env.run(consumer, until=lambda: bool(silence))
    assert silence == [0.0]


BOGUS = "99999999999999999999999999999999999999999999"  # no record of this lease


class Foreign(Recorder):
    """Checkpoints a sequence number it never got (one of another shard, say)."""

    errors: list[str]

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        try:
            shard_ended_input.checkpointer.checkpoint(BOGUS)
        except CheckpointError as exc:
            self.errors.append(exc.value)
        shard_ended_input.checkpointer.checkpoint()  # then the right one


def test_a_sequence_number_never_delivered_is_refused_at_shard_end() -> None:
    """A tenure that delivered nothing at a closed shard's end: SHARD_END was the upper bound,
    so any sequence number passed and was stored; every later tenure then started at it
    (Kinesis refuses it) and the children never started."""
    env = Env(processor=Foreign())
    env.processor.errors = []
    env.lease(checkpoint=ExtendedSequenceNumber("100"))  # resumed right at the shard's end
    outcome = env.run(env.consumer(FakeSources([ended([])])))
    assert outcome is Outcome.SHARD_END
    assert env.processor.errors == ["IllegalArgumentException"]


class OnlyForeign(Recorder):
    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        shard_ended_input.checkpointer.checkpoint(BOGUS)


def test_a_foreign_checkpoint_at_shard_end_is_not_stored_and_the_lease_parks() -> None:
    """Stored, a sequence number of no record of this shard was the lease's checkpoint: every
    later tenure started AT_SEQUENCE_NUMBER there (Kinesis refuses it) and the children never
    started. Refused, the processor's shard_ended failed: the lease parks at its checkpoint."""
    env = Env(processor=OnlyForeign())
    env.lease(checkpoint=ExtendedSequenceNumber("100"))
    outcome = env.run(env.consumer(FakeSources([ended([])])))
    assert outcome is Outcome.PARKED
    assert env.stored().checkpoint == ExtendedSequenceNumber("100")


def test_after_a_delivery_a_sequence_number_never_delivered_is_refused_at_shard_end() -> None:
    env = Env(processor=Foreign())
    env.processor.errors = []
    env.lease(checkpoint=ExtendedSequenceNumber("100"))
    outcome = env.run(env.consumer(FakeSources([batch(110), ended([])])))
    assert outcome is Outcome.SHARD_END
    assert env.processor.errors == ["IllegalArgumentException"]


class LosesItsBuffer(Recorder):
    """Keeps records in memory and checkpoints what it flushed every ``every`` batches and at
    shard end; ``lose_at`` (a record, or "shard_ended") makes it lose its buffer once and say so
    (a MultiLang child that died holding records it had not checkpointed)."""

    def __init__(self, every: int, lose_at: str) -> None:
        super().__init__()
        self.every, self.lose_at = every, lose_at
        self.buffer: list[str] = []
        self.flushed: list[str] = []
        self.batches = 0

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        seqs = [r.sequence_number for r in process_records_input.records]
        self.calls.append("process_records")
        if self.lose_at in seqs:
            self.lose_at, self.buffer = "", []
            raise RedeliverFromCheckpoint("the child died holding records")
        self.buffer += seqs
        self.batches += 1
        if self.batches % self.every == 0:
            self.flushed += self.buffer
            self.buffer = []
            process_records_input.checkpointer.checkpoint()

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        self.calls.append("shard_ended")
        if self.lose_at == "shard_ended":
            self.lose_at, self.buffer = "", []
            raise RedeliverFromCheckpoint("the child died holding records")
        self.flushed += self.buffer
        self.buffer = []
        shard_ended_input.checkpointer.checkpoint()


@pytest.mark.parametrize(
    ("every", "lose_at", "again_from"),
    [
        (2, "40", ExtendedSequenceNumber("20")),  # 10, 20 flushed; 30 held, lost at 40
        (5, "30", TRIM_HORIZON),  # nothing checkpointed yet: from the lease's start
        (2, "shard_ended", ExtendedSequenceNumber("40")),  # 50 held when the shard ended
    ],
)
def test_a_processor_that_lost_what_it_held_gets_it_again_from_the_checkpoint(
    every: int, lose_at: str, again_from: ExtendedSequenceNumber
) -> None:
    """A MultiLang child killed while it held records it had not checkpointed was replaced by
    one started at the checkpoint and given only the batches after: the records between were
    never flushed, and the next checkpoint (or SHARD_END) went past them."""
    env = Env(processor=LosesItsBuffer(every, lose_at))
    env.lease()
    first = [batch(10), batch(20), batch(30), batch(40), batch(50), ended([])]
    rest = {ExtendedSequenceNumber("20"): [batch(30), batch(40), batch(50), ended([])],
            TRIM_HORIZON: first, ExtendedSequenceNumber("40"): [batch(50), ended([])]}  # fmt: skip
    sources = FakeSources(first, rest[again_from])
    outcome = env.run(env.consumer(sources))
    assert outcome is Outcome.SHARD_END, env.processor.calls
    assert [start for start, _ in sources.starts] == [TRIM_HORIZON, again_from]
    assert sorted(env.processor.flushed, key=int) == ["10", "20", "30", "40", "50"]
    assert env.stored().checkpoint == SHARD_END


def test_the_processor_is_made_on_a_processor_thread_not_the_event_loop() -> None:
    """``Class()`` ran on the loop: an ``__init__`` connecting to a host that does not answer
    held every lease's renewal with it."""
    import threading

    made_on: list[threading.Thread] = []
    env = Env()
    env.lease()

    def factory() -> RecordProcessor:
        made_on.append(threading.current_thread())
        return env.processor

    consumer = env.consumer(FakeSources([batch(10), ended([])]), factory=factory)
    assert env.run(consumer) is Outcome.SHARD_END
    assert made_on and made_on[0] is not threading.main_thread()


def test_a_batch_that_loses_the_processors_records_every_time_still_parks_the_lease() -> None:
    """A batch that kills a buffering MultiLang child every time: each rewind delivered the
    earlier batches again, whose success started the failure count afresh, so the lease was read
    again and again (a new child each time) and never parked."""

    class DiesAt30(LosesItsBuffer):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            if "30" in [r.sequence_number for r in process_records_input.records]:
                self.calls.append("process_records")
                self.buffer = []
                raise RedeliverFromCheckpoint("the child died holding records")
            super().process_records(process_records_input)

    env = Env(processor=DiesAt30(every=100, lose_at=""))
    env.lease()
    rounds = 4 * ATTEMPTS
    sources = FakeSources(*[[batch(10), batch(20), batch(30)] for _ in range(rounds)])
    outcome = env.run(env.consumer(sources), until=lambda: len(sources.starts) > rounds)
    assert outcome is Outcome.PARKED
    assert len(sources.starts) == ATTEMPTS  # read from the checkpoint once per failure
    assert env.stored().checkpoint == TRIM_HORIZON  # nothing passed the lost records


def test_a_processor_that_checkpointed_shard_end_before_it_said_it_lost_records_is_done() -> None:
    """SHARD_END was stored, then the processor said it lost what it held (a child that died
    after its checkpoint): the consumer read the whole finished shard again, its children
    perhaps already running."""

    class FlushesThenLoses(LosesItsBuffer):
        def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
            super().shard_ended(shard_ended_input)
            raise RedeliverFromCheckpoint("the child died after its checkpoint")

    env = Env(processor=FlushesThenLoses(every=5, lose_at=""))
    env.lease()
    sources = FakeSources([batch(10), batch(20), ended([])], [batch(10), batch(20), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    assert len(sources.starts) == 1 and env.processor.flushed == ["10", "20"]
    assert env.stored().checkpoint == SHARD_END


def test_a_second_loss_at_an_earlier_batch_keeps_the_first_ones_limit() -> None:
    """Lost at 40, then (reading again) at 20: the limit moved back to 20, so 30's success
    started the count afresh, and a batch that loses the records every time never parked."""

    class Alternates(LosesItsBuffer):
        def __init__(self) -> None:
            super().__init__(every=100, lose_at="")
            self.losses = ["40", "20", "40", "20", "40", "20"]

        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            seqs = [r.sequence_number for r in process_records_input.records]
            if self.losses and self.losses[0] in seqs:
                self.losses.pop(0)
                self.calls.append("process_records")
                raise RedeliverFromCheckpoint("the child died holding records")
            super().process_records(process_records_input)

    env = Env(processor=Alternates())
    env.lease()
    script = [batch(10), batch(20), batch(30), batch(40)]
    sources = FakeSources(*[list(script) for _ in range(4 * ATTEMPTS)])
    outcome = env.run(env.consumer(sources), until=lambda: len(sources.starts) > 4 * ATTEMPTS)
    assert outcome is Outcome.PARKED and len(sources.starts) == ATTEMPTS


class FlushesAtShutdown(LosesItsBuffer):
    """LosesItsBuffer that flushes and checkpoints in shutdown_requested (as the sample does)."""

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        self.calls.append("shutdown_requested")
        self.flushed += self.buffer
        self.buffer = []
        shutdown_requested_input.checkpointer.checkpoint()


@pytest.mark.parametrize(
    ("lose_at", "checkpoint"),
    [("40", ExtendedSequenceNumber("20")), ("shard_ended", ExtendedSequenceNumber("40"))],
)
def test_a_shutdown_during_the_backoff_after_a_loss_never_checkpoints_what_was_lost(
    lose_at: str, checkpoint: ExtendedSequenceNumber
) -> None:
    """The processor lost what it held (30 at 40; 50 at the shard's end) and a shutdown came
    during the backoff before the rewind: shutdown_requested's checkpoint() recorded the lost
    batch's end (40), or SHARD_END, and those records were never read again."""
    env = Env(processor=FlushesAtShutdown(2, lose_at))
    env.lease()
    consumer = env.consumer(FakeSources(
        [batch(10), batch(20), batch(30), batch(40), batch(50), ended([])],
    ))  # fmt: skip

    async def shut_down_then_sleep(seconds: float) -> None:
        consumer.request_shutdown()
        await asyncio.sleep(10)  # the shutdown ends the wait

    consumer.tenure._sleep = shut_down_then_sleep
    assert env.run(consumer) is Outcome.SHUTDOWN
    assert "shutdown_requested" in env.processor.calls
    assert env.stored().checkpoint == checkpoint


def test_a_processor_that_lost_what_it_held_at_an_empty_read_gets_it_again() -> None:
    """``no_records`` raising RedeliverFromCheckpoint was counted as a failure only: reading
    went on after the lost records and the next checkpoint went past them."""

    class LosesWhileIdle(LosesItsBuffer):
        def no_records(self) -> None:
            self.calls.append("no_records")
            if self.buffer and self.lose_at == "idle":
                self.lose_at, self.buffer = "", []
                raise RedeliverFromCheckpoint("the child died holding records")

    env = Env(processor=LosesWhileIdle(every=100, lose_at="idle"))
    env.lease()
    first = [batch(10), batch(20), FetchedBatch([], 0), batch(30), ended([])]
    sources = FakeSources(first, [batch(10), batch(20), batch(30), ended([])])
    assert env.run(env.consumer(sources)) is Outcome.SHARD_END
    assert [start for start, _ in sources.starts] == [TRIM_HORIZON, TRIM_HORIZON]
    assert sorted(env.processor.flushed, key=int) == ["10", "20", "30"]
    assert env.stored().checkpoint == SHARD_END


def test_a_processor_that_says_it_lost_records_in_initialize_is_tried_again() -> None:
    """Nothing was delivered yet: it reached the consumer's last resort and parked the lease at
    once (as a bug in the consumer) instead of counting one failure."""

    class FailsToStartOnce(Recorder):
        def initialize(self, initialize_input: InitializeInput) -> None:
            super().initialize(initialize_input)
            if self.calls.count("initialize") == 1:
                raise RedeliverFromCheckpoint("the child died starting")

    env = Env(processor=FailsToStartOnce())
    env.lease()
    assert env.run(env.consumer(FakeSources([batch(10), ended([])]))) is Outcome.SHARD_END
    assert env.processor.calls.count("initialize") == 2
    assert env.stored().checkpoint == SHARD_END
