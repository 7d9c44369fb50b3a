"""ConsumerSet, the shard consumers of one worker: a late loss report never stops a newer tenure,
a hung processor call shows in readiness, and nothing per shard outlives what is alive (ended
tenures kept for status are bounded; a finished shard's metrics are forgotten)."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from test_consumer import FakeProbe, FakeSources, Recorder, batch, ended

from checkpoint.base.clock import ManualClock
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, InitialPosition
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime import consumer_set as consumers_module
from kclpy_spark.runtime.consumer_set import ConsumerSet
from kclpy_spark.runtime.metrics import WorkerMetrics


class Env:
    def __init__(self, processor: RecordProcessor | None = None, **cfg: Any) -> None:
        self.clock = ManualClock()
        self.table = MemoryLeaseTable()
        self.holder = LeaseHolder(self.table, "worker-a", self.clock, 1e9)
        self.cfg = WorkerConfig(stream_name="s", **cfg)
        self.metrics = WorkerMetrics(CoordinationCounters())
        self.processor = processor or Recorder()
        self.set = ConsumerSet(
            self.cfg,
            lambda: self.processor,
            holder=self.holder,
            table=self.table,
            clock=self.clock,
            sleep=self.clock.sleep,
            rng=random.Random(1),
            metrics=self.metrics,
            counters=CoordinationCounters(),
            on_shard_end=lambda: None,
            runs_no_more=self._runs_no_more,
        )
        self.stopped: set[str] = set()  # workers whose status records say they run no more

    async def _runs_no_more(self, worker: str) -> bool:
        return worker in self.stopped

    def start(self, key: str, script: list[Any]) -> Any:
        self.table.create_lease_if_absent(Lease(key, TRIM_HORIZON))
        lease = self.table.get_lease(key)
        assert lease is not None
        taken = self.table.take_lease(lease, "worker-a")
        assert taken is not None
        held = self.holder.add_taken(taken)
        context = SimpleNamespace(
            sources=FakeSources(script),
            probe=FakeProbe(),
            initial_position=InitialPosition.trim_horizon(),
        )
        self.set.start(held, context)  # type: ignore[arg-type]
        return held


class HeldUntil(Recorder):
    """A processor whose process_records returns only once ``release`` is set."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.entered = threading.Event()  # process_records runs (the processor's own making
        # and its initialize are calls too: a wait on call_started alone may see those)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.entered.set()
        assert self.release.wait(30.0)


def kpl_counts(env: Env) -> tuple[Callable[[str, int], None], Callable[[], list[str]]]:
    """The worker's report of KPL sub-records out of range (``Worker._out_of_range`` over the
    env's metrics and consumers), and the series it made in /metrics."""
    from kclpy_spark.runtime.worker import Worker

    report = Worker._out_of_range.__get__(SimpleNamespace(metrics=env.metrics, consumers=env.set))

    def series() -> list[str]:
        text = env.metrics.exposition().decode()
        return [x for x in text.splitlines() if x.startswith("kclpy_spark_kpl_subrecords_out")]

    return report, series


async def settle(until: Any, seconds: float = 30.0) -> None:
    """Wait for ``until()``: processor calls run on threads, so a count of loop turns was not
    enough on a loaded machine (seen in CI beside Spark-heavy tests); a generous deadline is."""
    deadline = time.monotonic() + seconds
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        await asyncio.sleep(0.001)


def test_a_loss_reported_for_an_earlier_tenure_does_not_stop_the_current_one() -> None:
    env = Env()
    key = "shardId-000000000000"

    async def go() -> None:
        old = env.start(key, [batch(10)])
        await settle(lambda: env.processor.seen)  # type: ignore[attr-defined]
        new = env.holder.add_taken(env.table.take_lease(env.table.get_lease(key), "worker-a"))  # type: ignore[arg-type]
        running = env.set.running[key].consumer
        running.tenure.held = new  # the consumer of the current tenure
        env.set.lost(key, old.token)  # late: about the tenure before
        await asyncio.sleep(0)
        assert not running.tenure.lost.is_set()
        env.set.lost(key, new.token)
        await settle(lambda: key not in env.set)
        assert env.holder.get_if_held(key) is None  # dropped under its own token

    asyncio.run(go())


def test_a_processor_call_past_the_stall_timeout_makes_the_view_hung(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The view says hung, and the log says it once per call (troubleshooting.md), however
    often the views are asked for."""
    release = threading.Event()
    env = Env(HeldUntil(release), processor_stall_timeout=60.0)
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(env.processor.entered.is_set)
        [view] = env.set.views()
        assert view.hung_for is None
        env.clock.advance(61.0)
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                [view] = env.set.views()
                assert view.hung_for is not None and view.hung_for >= 61.0
                env.clock.advance(1.0)
        said = [r for r in caplog.records if "has been running for" in r.getMessage()]
        assert len(said) == 1
        release.set()
        await settle(lambda: env.set.running[key].consumer.stats.call_started is None)
        [view] = env.set.views()
        assert view.hung_for is None
        env.set.running[key].consumer.request_shutdown()
        await settle(lambda: key not in env.set)

    try:
        asyncio.run(go())
    finally:
        release.set()


def test_ended_tenures_are_bounded_and_a_finished_shards_metrics_forgotten(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(consumers_module, "FINISHED_KEPT", 3)
    env = Env()
    keys = [f"shardId-{i:012d}" for i in range(6)]

    async def go() -> None:
        for key in keys:
            env.start(key, [batch(10), ended([])])
        await settle(lambda: not env.set.running)

    asyncio.run(go())
    assert len(env.set.finished) == 3 and set(env.set.finished) < set(keys)
    exported = env.metrics.registry.get_sample_value
    for key in keys:  # each was counted while it ran, and forgotten at SHARD_END
        labels = dict(zip(("stream", "shard"), env.metrics.shard(key), strict=True))
        assert exported("kclpy_spark_records_processed_total", labels) is None
        assert exported("kclpy_spark_behind_latest_seconds", labels) is None
    assert exported("kclpy_spark_records_processed_total", {"stream": "", "shard": "x"}) is None


async def eventually(until: Any, timeout: float = 10.0) -> None:
    """Until ``until()`` holds, letting threads (to_thread calls) run too."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not until():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the condition never held")
        await asyncio.sleep(0.01)


def _ask_handoff(env: Env, key: str) -> Any:
    """What another worker's steal does, and what our next renewal then reports."""
    lease = env.table.get_lease(key)
    assert lease is not None and env.table.initiate_handoff(lease, "worker-b") is not None
    (asked,) = env.holder.renew_all(wait=5).handoffs
    return asked


def test_a_handoff_lets_the_processor_checkpoint_then_passes_the_lease() -> None:
    env = Env()
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10), batch(11)])
        await eventually(lambda: "11" in env.processor.seen)
        env.set.hand_over(_ask_handoff(env, key), timeout=30.0)
        await eventually(lambda: not env.table.get_lease(key).handoff_pending)  # type: ignore[union-attr]
        await eventually(lambda: key not in env.set)

    asyncio.run(go())
    stored = env.table.get_lease(key)
    assert stored is not None and stored.lease_owner == "worker-b"
    assert stored.checkpoint.sequence_number == "11"  # the old owner's last checkpoint
    assert env.processor.calls[-2:] == ["shutdown_requested", "lease_lost"]
    assert env.processor.calls.count("lease_lost") == 1  # once, after shutdown_requested
    assert env.holder.get_if_held(key) is None
    kinds = [e["kind"] for e in env.metrics.events.recent(10)]
    assert "handed" in kinds


def test_a_handoff_to_a_worker_that_stopped_since_it_asked_is_released_instead() -> None:
    """The receiver stopped (a rolling deploy) after it asked: completed to it, the lease was
    owned by a worker that would never take it and waited out twice the failover time."""
    env = Env()
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await eventually(lambda: "10" in env.processor.seen)
        asked = _ask_handoff(env, key)
        env.stopped.add("worker-b")
        env.set.hand_over(asked, timeout=30.0)
        await eventually(lambda: not env.table.get_lease(key).handoff_pending)  # type: ignore[union-attr]
        await eventually(lambda: key not in env.set)

    asyncio.run(go())
    stored = env.table.get_lease(key)
    assert stored is not None and stored.lease_owner is None  # free: any live worker takes it
    assert stored.checkpoint.sequence_number == "10"
    assert env.processor.calls[-2:] == ["shutdown_requested", "lease_lost"]
    assert env.holder.get_if_held(key) is None


def test_a_handoff_is_forced_after_its_timeout_and_the_late_checkpoint_refused() -> None:
    release = threading.Event()
    outcomes: list[str] = []

    class Hung(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            self.calls.append("process_records")
            assert release.wait(30.0)
            try:
                process_records_input.checkpointer.checkpoint()
                outcomes.append("checkpointed")
            except Exception as exc:  # CheckpointError: the lease moved on
                outcomes.append(type(exc).__name__)

    env = Env(Hung())
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await eventually(lambda: "process_records" in env.processor.calls)
        env.set.hand_over(_ask_handoff(env, key), timeout=0.2)
        await eventually(lambda: not env.table.get_lease(key).handoff_pending)  # type: ignore[union-attr]
        release.set()
        await eventually(lambda: key not in env.set)

    try:
        asyncio.run(go())
    finally:
        release.set()
    stored = env.table.get_lease(key)
    assert stored is not None and stored.lease_owner == "worker-b"
    assert stored.checkpoint == TRIM_HORIZON
    assert outcomes == ["CheckpointError"]
    assert "lease_lost" in env.processor.calls


def test_the_read_throughput_is_measured_smoothed_and_written_at_renewal() -> None:
    env = Env()
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10), batch(11)])
        env.set.measure_throughput()  # the first look only sets the baseline
        # Counted once process_records returned (seen in it is too early: a race under load).
        await eventually(lambda: env.set.running[key].consumer.stats.batches >= 2)
        env.clock.advance(2.0)
        env.set.measure_throughput()
        env.holder.renew_all(wait=5)
        env.set.running[key].consumer.request_shutdown()
        await eventually(lambda: key not in env.set)

    asyncio.run(go())
    stored = env.table.get_lease(key)
    assert stored is not None and stored.throughput_kbps is not None
    delivered = env.set.finished[key].bytes
    assert delivered > 0
    assert stored.throughput_kbps == round(delivered / 1024 / 2.0, 3)
    # The records delivered ride on the same renewal (for `status`, no request of their own).
    assert stored.owner_figures is not None
    assert stored.owner_figures.records == env.set.finished[key].records > 0


def test_a_cancelled_consumer_whose_call_runs_on_keeps_its_lease_from_a_second_one() -> None:
    """A suspend whose grace ran out cancels a consumer in process_records, but its thread runs
    on: the key left the set at once, so the taker could start a second processor of the same
    shard beside the first call."""
    release = threading.Event()
    entered = threading.Event()

    class Slow(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            entered.set()
            release.wait(30.0)

    env = Env(Slow())
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(entered.is_set)
        await env.set.shutdown_all(0.05)  # the grace ran out: cancelled
        assert key not in env.set.running and key in env.set  # not taken here meanwhile
        assert env.set.views() == []
        env.clock.advance(env.cfg.processor_stall_timeout + 1)  # it hangs: /readyz says so
        [view] = env.set.views()
        assert view.shard_id == key and view.hung_for is not None
        env.start(key, [batch(11)])  # a path that takes without looking starts nothing beside it
        assert key not in env.set.running
        release.set()
        await settle(lambda: key not in env.set)  # the call returned: takeable again

    try:
        asyncio.run(go())
    finally:
        release.set()


def with_a_call_held(body: Callable[[Env, str, threading.Event], Awaitable[None]]) -> None:
    """``body(env, key, release)`` while the consumer of ``key`` is in ``process_records``,
    which returns once ``release`` is set."""
    release = threading.Event()
    env = Env(HeldUntil(release))
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(env.processor.entered.is_set)
        await body(env, key, release)

    try:
        asyncio.run(go())
    finally:
        release.set()


def test_a_consumer_cancelled_by_no_one_here_releases_its_lease() -> None:
    """A CancelledError nobody here asked for (a source's, a library's) ended the consumer's
    task as if ``shutdown_all`` had: no release, the lease renewed here unread for good."""

    async def body(env: Env, key: str, release: threading.Event) -> None:
        env.set.running[key].task.cancel()
        await settle(lambda: key not in env.set.running)
        for _ in range(20):  # not while its call runs on: another worker would run it too
            await asyncio.sleep(0.005)
        assert env.table.get_lease(key).lease_owner == "worker-a"  # type: ignore[union-attr]
        release.set()
        await settle(lambda: key not in env.set and not env.set._background)
        assert env.holder.get_if_held(key) is None
        assert env.table.get_lease(key).lease_owner is None  # type: ignore[union-attr]

    with_a_call_held(body)


def test_a_lease_to_hand_back_is_forgotten_however_its_consumer_ends() -> None:
    """A removed stream's consumer cancelled by a stop's grace (or failing) kept its key in
    the hand-back set for good: a later tenure of that lease ending at a handoff was released
    again in the background, racing the handoff."""

    async def body(env: Env, key: str, release: threading.Event) -> None:
        env.set.hand_back(SimpleNamespace(owns=lambda held: True))  # type: ignore[arg-type]
        assert env.set._hand_back == {key}
        await env.set.shutdown_all(0.05)  # the grace ran out: cancelled
        release.set()
        await settle(lambda: key not in env.set)
        assert env.set._hand_back == set()

    with_a_call_held(body)


def test_a_consumer_cancelled_by_the_grace_tells_its_processor_once_its_call_returns() -> None:
    """A suspend whose grace ran out cancelled the consumer: its processor never heard, and
    kept what it held until the process exited (a MultiLang child and its pipes, a Spark
    sink's lane with the reads it keeps)."""

    async def body(env: Env, key: str, release: threading.Event) -> None:
        await env.set.shutdown_all(0.05)  # the grace ran out: cancelled mid-call
        assert "lease_lost" not in env.processor.calls  # not while process_records runs
        release.set()
        await settle(lambda: "lease_lost" in env.processor.calls and not env.set._telling)
        assert env.processor.calls.count("lease_lost") == 1

    with_a_call_held(body)


def test_a_shard_whose_reads_went_silent_shows_no_lag_rather_than_its_last() -> None:
    """The lag gauge kept its last value (often 0) while reads failed or were throttled: a lag
    alert never fired while the shard fell behind. Past the stall time its series goes, until
    the next answer."""
    env = Env()
    key = "shardId-000000000000"

    def lag_series() -> list[str]:
        text = env.metrics.exposition().decode()
        return [x for x in text.splitlines() if x.startswith("kclpy_spark_behind_latest_seconds{")]

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(lambda: env.set.running[key].consumer.stats.batches >= 1)
        [view] = env.set.views()
        assert not view.stalled and len(lag_series()) == 1
        env.clock.advance(env.set.stall_after + 1)  # nothing since: every read failing
        [view] = env.set.views()
        assert view.stalled and lag_series() == []
        assert env.set.running[key].consumer.stats.millis_behind_latest is None
        env.set.running[key].consumer.request_shutdown()
        await settle(lambda: key not in env.set)

    asyncio.run(go())


def test_a_consumer_cancelled_while_its_call_waits_for_a_thread_leaves_at_once() -> None:
    """Every processor thread busy (a stuck sink), a suspend whose grace ran out: the queued
    call was dropped with its task and never ran, but the lease waited for it to end, kept out
    of this worker for good (and /readyz said a call hung)."""
    from checkpoint.base.threads import RetiringThreadPool

    env = Env()
    key = "shardId-000000000000"
    blocker = threading.Event()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(RetiringThreadPool(1, "test-processors"))
        busy = loop.run_in_executor(None, blocker.wait, 30.0)  # the one thread is taken
        env.start(key, [batch(10)])
        consumer = env.set.running[key].consumer
        await settle(lambda: consumer.stats.call_started is not None)  # initialize queued
        await env.set.shutdown_all(0.05)  # the grace ran out: the consumer task is cancelled
        await settle(lambda: key not in env.set, seconds=5.0)
        blocker.set()
        await busy
        await asyncio.sleep(0.1)
        assert env.processor.calls == []  # the dropped call never ran, even once a thread was free

    try:
        asyncio.run(go())
    finally:
        blocker.set()


def test_a_kpl_count_reported_after_its_tenure_ended_makes_no_series_again() -> None:
    """A page of KPL aggregates is split on a thread that outlives a tenure cancelled meanwhile
    (a lease lost or handed over): its late count made the shard's series again after the tenure
    removed it, one for good per such end (shards that ended never come back)."""
    env = Env()
    report, series = kpl_counts(env)
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [])
        await settle(lambda: key in env.set.running)
        report(key, 1)
        assert len(series()) == 1
        env.set.lost(key)
        await settle(lambda: key not in env.set)
        assert series() == []
        report(key, 2)  # late, from the thread
        assert series() == []

    asyncio.run(go())


def test_a_kpl_count_reported_while_its_ended_tenure_drains_makes_no_series_again() -> None:
    """A lease whose call still runs after its tenure ended counted as here, so a late count
    made the series again after the tenure removed it."""
    release = threading.Event()
    env = Env(HeldUntil(release), processor_stall_timeout=60.0)
    key = "shardId-000000000000"
    report, series = kpl_counts(env)

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(env.processor.entered.is_set)
        await env.set.shutdown_all(0.05)  # grace ran out: the consumer task is cancelled
        await settle(lambda: key not in env.set.running)
        assert key in env.set  # draining: the tenure ended, its series forgotten
        assert series() == []
        report(key, 3)  # late, from the fetch thread of the ended tenure
        release.set()
        await settle(lambda: key not in env.set)
        assert series() == [], series()

    try:
        asyncio.run(go())
    finally:
        release.set()


def test_a_lease_gone_between_renewals_is_told_once_and_reported() -> None:
    """A loss first seen by a write (a checkpoint's conditional write lost, a write refused as
    expired) stopped the consumer without a word: no lost-lease line, not counted in
    leases_lost. The keys told are returned once, for the worker to count and log."""
    env = Env()
    key = "shardId-000000000000"

    async def go() -> None:
        env.start(key, [batch(10)])
        await settle(lambda: env.processor.seen)  # type: ignore[attr-defined]
        assert env.set.lost_unless_held({key}) == []
        assert env.set.lost_unless_held(set()) == [key]
        assert env.set.lost_unless_held(set()) == []  # told already: not again
        await settle(lambda: key not in env.set)

    asyncio.run(go())
