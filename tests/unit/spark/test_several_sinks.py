"""Several sinks per application: each batch goes to every sink, the checkpoint moves only when all
of them acknowledged it, each sink fails by its own policy, and a write that gives no answer within
its timeout is a negative acknowledgment.

Real Checkpointers over a MemoryLeaseTable, a ManualClock, fake sinks (test_micro_batcher's Env).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_micro_batcher import SHARDS, Env, FakeSink, esn, records

from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from kclpy_spark.spark.acks import DEAD_LETTERED, FAILED, WRITTEN, SinkFailedError
from kclpy_spark.spark.batch_life import Batch
from kclpy_spark.spark.lane import LaneState
from kclpy_spark.spark.micro_batcher import (
    BatcherSettings,
    DrainResult,
    MicroBatcher,
    SinkParkedError,
)
from kclpy_spark.spark.pieces import PendingState, Piece
from kclpy_spark.spark.sink_batch import SinkBatch, SinkRoute
from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory


class NamedSink(FakeSink):
    """A FakeSink whose tokens name it, so each sink can be shown to get its own."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {p.lease_key: f"{self.name}-{p.key.last}" for p in pieces}


class DeadLetters:
    def __init__(self) -> None:
        self.stored: list[tuple[SinkBatch, BaseException]] = []

    def write(self, batch: SinkBatch, error: BaseException) -> None:
        self.stored.append((batch, error))


class TwoSinks(Env):
    """Env whose batcher writes to two sinks, ``a`` then ``b``, each with its own policy."""

    def __init__(self, settings: BatcherSettings, **route_b: Any) -> None:
        self.a, self.b = NamedSink("a"), NamedSink("b")
        self.route_b = {"max_attempts": 2, "write_timeout": 5.0, **route_b}
        self.done: list[Batch] = []
        super().__init__(settings)

    def new_batcher(self, **kwargs: Any) -> MicroBatcher:
        routes = [
            SinkRoute("a", self.a, max_attempts=3, write_timeout=5.0),
            SinkRoute("b", self.b, **self.route_b),
        ]
        return MicroBatcher(
            routes,
            self.settings,
            clock=self.clock,
            sleep=self.sleeps.append,
            threaded=False,
            on_batch_done=self.done.append,
            **kwargs,
        )


def two_sinks(**route_b: Any) -> TwoSinks:
    return TwoSinks(BatcherSettings(max_records=3, max_wait=10.0), **route_b)


def test_each_batch_goes_to_every_sink_then_the_checkpoint_moves() -> None:
    env = two_sinks()
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 6))
    env.batcher.run_until_idle()
    for sink in (env.a, env.b):
        assert [b.rows for b in sink.written] == [3, 3]
        assert [b.attempt for b in sink.written] == [1, 1]
    assert [b.batch_id for b in env.a.written] == [b.batch_id for b in env.b.written]
    # each sink sees its own token (and only it)
    assert env.a.written[0].tokens == {SHARDS[0]: f"a-{esn(30)}"}
    assert env.b.written[0].tokens == {SHARDS[0]: f"b-{esn(30)}"}
    assert env.lease(SHARDS[0]).checkpoint == esn(60)
    assert [b.acks.answers if b.acks else None for b in env.done] == [
        {"a": WRITTEN, "b": WRITTEN}
    ] * 2
    assert env.batcher.status()["sinks"] == ["a", "b"]


def test_one_failing_sink_among_two_moves_no_checkpoint_and_parks_the_lease() -> None:
    env = two_sinks(max_attempts=2)
    lane = env.take(SHARDS[0])
    env.b.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert len(env.a.written) == 1 and len(env.a.attempts) == 1  # a answered: not asked again
    assert [attempt for _, attempt in env.b.attempts] == [1, 2]  # b's own max_attempts
    stored = env.lease(SHARDS[0])
    assert stored.checkpoint == TRIM_HORIZON and stored.pending_checkpoint == esn(30)
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    [batch] = env.done
    assert batch.state.value == "parked" and batch.acks is not None
    assert batch.acks.answers == {"a": WRITTEN, "b": FAILED}
    assert isinstance(batch.error, SinkFailedError) and batch.error.sink == "b"
    with pytest.raises(SinkParkedError, match="'b'"):
        env.deliver(SHARDS[0], records(4, 1))
    assert env.batcher.stats.parked_batches == 1 and env.batcher.stats.commits == 0


def test_a_sink_that_recovers_within_its_attempts_lets_the_checkpoint_move() -> None:
    env = two_sinks(max_attempts=3)
    env.take(SHARDS[0])
    env.b.fail = lambda batch: batch.attempt < 3
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert [attempt for _, attempt in env.a.attempts] == [1]
    assert [attempt for _, attempt in env.b.attempts] == [1, 2, 3]
    assert env.lease(SHARDS[0]).checkpoint == esn(30)
    assert env.batcher.stats.failed_attempts == 2


def test_the_first_sink_failing_for_good_leaves_the_second_unwritten() -> None:
    """The records come again later (parked lease), so the second sink would write them twice."""
    env = two_sinks()
    env.take(SHARDS[0])
    env.a.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert len(env.a.attempts) == 3 and env.b.attempts == []
    assert env.done[0].acks is not None and env.done[0].acks.waiting == ("b",)
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


def test_a_dead_lettering_sink_acknowledges_and_the_checkpoint_moves() -> None:
    dead = DeadLetters()
    env = two_sinks(max_attempts=1, dead_letter=dead)
    env.take(SHARDS[0])
    env.b.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert [b.rows for b, _ in dead.stored] == [3] and len(env.a.written) == 1
    assert dead.stored[0][0].tokens == {SHARDS[0]: f"b-{esn(30)}"}  # the failed sink's view
    assert env.lease(SHARDS[0]).checkpoint == esn(30)
    assert env.done[0].acks is not None
    assert env.done[0].acks.answers == {"a": WRITTEN, "b": DEAD_LETTERED}
    assert env.batcher.stats.dead_lettered_batches == 1
    assert (env.batcher.stats.batches, env.batcher.stats.rows) == (1, 3)  # a wrote it


def test_a_sink_whose_prepare_keeps_failing_is_dead_lettered_by_its_policy() -> None:
    """delta:'s prepare reads its table's log: an unreadable table parked every lease whatever
    its failure policy, and the healthy sink before it was not written either."""
    dead = DeadLetters()
    env = two_sinks(max_attempts=1, dead_letter=dead)
    env.take(SHARDS[0])

    def unreadable(pieces: Sequence[Piece]) -> Mapping[str, Any]:
        raise OSError("the table's log is unreadable")

    env.b.prepare = unreadable  # type: ignore[method-assign]
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert [b.rows for b, _ in dead.stored] == [3] and len(env.a.written) == 1
    assert isinstance(dead.stored[0][1], OSError) and not env.b.written
    assert dead.stored[0][0].tokens == {SHARDS[0]: None}  # b prepared nothing
    assert env.lease(SHARDS[0]).checkpoint == esn(30)
    assert env.done[0].acks is not None
    assert env.done[0].acks.answers == {"a": WRITTEN, "b": DEAD_LETTERED}


def test_a_sink_whose_prepare_keeps_failing_parks_without_a_dead_letter() -> None:
    env = two_sinks(max_attempts=1)
    lane = env.take(SHARDS[0])

    def unreadable(pieces: Sequence[Piece]) -> Mapping[str, Any]:
        raise OSError("the table's log is unreadable")

    env.b.prepare = unreadable  # type: ignore[method-assign]
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert env.batcher.lane_state(lane) is LaneState.PARKED and not env.a.written
    [batch] = env.done
    assert isinstance(batch.error, SinkFailedError) and batch.error.sink == "b"
    assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON


def test_a_replayed_piece_gets_back_each_sinks_own_token() -> None:
    env = two_sinks(max_attempts=1)
    env.take(SHARDS[0])
    env.b.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()  # a wrote, b failed: the pending checkpoint holds both tokens
    pending = env.lease(SHARDS[0]).pending_checkpoint_state
    state = PendingState.decode(pending)
    assert state is not None
    assert state.pieces[-1].token == {"by_sink": {"a": f"a-{esn(30)}", "b": f"b-{esn(30)}"}}
    # The lease moves (a crash): the new owner re-forms the piece with the stored tokens.
    env.table.evict_lease(env.lease(SHARDS[0]))
    env.b.fail = lambda batch: False
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.run_until_idle()
    assert env.b.written[-1].tokens == {SHARDS[0]: f"b-{esn(30)}"}
    assert env.a.written[-1].tokens == {SHARDS[0]: f"a-{esn(30)}"}
    assert env.a.written[-1].batch_id == env.a.written[0].batch_id  # same piece, same id
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_a_token_stored_under_another_list_of_sinks_is_not_passed_on() -> None:
    """A raw (one-sink) token given to one of several sinks, or an envelope given to one sink,
    would be misread (a Delta version of another sink): the sink gets None instead."""
    from kclpy_spark.spark.writer import _token_of

    route = SinkRoute("a", FakeSink(), 1, 1.0)
    assert _token_of(route, {"by_sink": {"a": 7, "b": 9}}, several=True) == 7
    assert _token_of(route, {"by_sink": {"b": 9}}, several=True) is None
    assert _token_of(route, 7, several=True) is None
    assert _token_of(route, {"by_sink": {"a": 7}}, several=False) is None
    assert _token_of(route, 7, several=False) == 7
    assert _token_of(route, {"version": 7}, several=False) == {"version": 7}  # a sink's own dict


def test_the_spark_job_tag_is_set_on_the_thread_that_writes() -> None:
    """Spark job tags are thread-local: the interrupter must tag the thread running the write."""
    tagged_on: list[int] = []
    wrote_on: list[int] = []

    class Interrupter:
        @contextmanager
        def tagged(self, tag: str) -> Iterator[None]:
            tagged_on.append(threading.get_ident())
            yield

        def interrupt(self, tag: str) -> None:
            return None

    env = two_sinks()
    env.batcher = env.new_batcher(interrupter=Interrupter())
    env.a.on_write = lambda batch: wrote_on.append(threading.get_ident())
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    # Each sink's prepare and write are tagged on the thread that runs them.
    assert wrote_on and wrote_on[0] in tagged_on and len(tagged_on) == 4


def test_a_write_with_no_answer_within_its_timeout_is_a_negative_acknowledgment() -> None:
    """The write of b never returns: after write_timeout (interrupt) and the grace after it, it
    counts as failed and is left running; the lease parks, nothing is checkpointed; the threads
    are bounded by the writers plus the writes still hung, and go back down when it returns."""
    release = threading.Event()
    env = two_sinks(max_attempts=1, write_timeout=1.0)  # 0.2 s failed calls due under load
    hung_calls: list[int] = []

    def hang(batch: SinkBatch) -> None:
        hung_calls.append(batch.attempt)
        release.wait(30.0)

    env.b.on_write = hang
    lane = env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    started = time.monotonic()
    try:
        env.batcher.step()
        assert time.monotonic() - started < 20.0  # not the 30 s the write would take
        assert env.batcher.lane_state(lane) is LaneState.PARKED
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
        assert "gave no answer" in str(env.done[0].error)
        assert hung_calls == [1]  # not submitted again while it may still run
        assert env.batcher.hung_writes == 1
        assert env.batcher.writes.write_threads <= 2  # one writer + the hung write
        # the next batch (another lease) is written on a fresh thread meanwhile
        env.take(SHARDS[1])
        env.b.on_write = lambda batch: None
        env.deliver(SHARDS[1], records(1, 3))
        env.batcher.run_until_idle()
        assert env.lease(SHARDS[1]).checkpoint == esn(30)
    finally:
        release.set()
    deadline = time.monotonic() + 10.0
    while env.batcher.hung_writes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert env.batcher.hung_writes == 0
    env.batcher.close(timeout=5.0)


def test_a_parked_batch_rearmed_at_shard_end_is_written_to_every_sink() -> None:
    env = two_sinks(max_attempts=1)
    lane = env.take(SHARDS[0])
    env.b.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    assert env.batcher.lane_state(lane) is LaneState.PARKED
    env.b.fail = lambda batch: False
    assert env.batcher.drain(lane, None, final=True) is DrainResult.DONE
    # a is asked again (a new batch: its idempotence absorbs it), b writes it once
    assert len(env.a.written) == 2 and len(env.b.written) == 1
    assert env.a.written[0].batch_id == env.a.written[1].batch_id == env.b.written[0].batch_id
    assert env.lease(SHARDS[0]).checkpoint == esn(30)


def test_sinks_need_distinct_names() -> None:
    sink = FakeSink()
    with pytest.raises(ValueError, match="distinct"):
        MicroBatcher([SinkRoute("x", sink, 1, 1.0), SinkRoute("x", sink, 1, 1.0)], threaded=False)


def test_hung_writes_are_capped_and_a_closing_sink_abandons_instead_of_failing() -> None:
    """At most 2 hung writes per writer: the next write is refused (a failure, no new thread).
    After close, a batch is abandoned, never dead-lettered or checkpointed for it."""
    release = threading.Event()
    dead = DeadLetters()
    # A second's timeout (and a second's grace): the writes that should answer or be picked up
    # in time do so under the suite's load too (0.05 s did not always).
    env = two_sinks(max_attempts=1, write_timeout=1.0, dead_letter=dead)
    env.b.on_write = lambda batch: release.wait(30.0) and None
    try:
        for n, shard in enumerate(SHARDS):
            env.take(shard)
            env.deliver(shard, records(1, 3))
            env.batcher.run_until_idle()
            assert env.batcher.hung_writes == n + 1
        assert env.batcher.writes.write_threads <= 3  # one writer + two hung
        # a third lease: refused at once, no third hung thread
        env.table.create_lease_if_absent(Lease("shardId-000000000009", TRIM_HORIZON))
        env.take("shardId-000000000009")
        env.deliver("shardId-000000000009", records(1, 3))
        env.batcher.run_until_idle()
        assert env.batcher.hung_writes == 2 and env.batcher.writes.write_threads <= 3
        # the worker's /readyz says so (the factory is what the worker asks)
        ready, why = SparkSinkProcessorFactory(env.batcher, "stream").readiness()
        assert not ready and "2 Spark sink write(s) hang" in why
        assert [type(error).__name__ for _, error in dead.stored] == ["WriteHungError"] * 2
        # every write is refused now, sink a's too (it parks: no dead-letter location)
        assert env.done[-1].state.value == "parked" and "hang already" in repr(env.done[-1].error)
    finally:
        release.set()
    assert wait_for_zero(lambda: env.batcher.hung_writes)
    assert SparkSinkProcessorFactory(env.batcher, "stream").readiness() == (True, "ready")
    # closing: a batch formed now is abandoned, not dead-lettered, not checkpointed
    before = len(dead.stored)
    env.b.on_write = lambda batch: None
    env.batcher._writer.close()
    env.table.create_lease_if_absent(Lease("shardId-000000000010", TRIM_HORIZON))
    env.take("shardId-000000000010")
    env.deliver("shardId-000000000010", records(1, 3))
    env.batcher.step()
    assert env.done[-1].state.value == "abandoned" and len(dead.stored) == before
    assert env.lease("shardId-000000000010").checkpoint == TRIM_HORIZON


def wait_for_zero(value: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while value() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not value()


_EXITS = """
import sys, threading, time
sys.path[:0] = [{repo!r}, {tests!r}]
from test_several_sinks import two_sinks
from test_micro_batcher import SHARDS, records
env = two_sinks(max_attempts=1, write_timeout=1.0)
env.b.on_write = lambda batch: time.sleep(3600)
env.take(SHARDS[0])
env.deliver(SHARDS[0], records(1, 3))
env.batcher.step()
assert env.batcher.hung_writes == 1
env.batcher.close(timeout=1.0)
print("closed", flush=True)
"""


def test_a_hung_write_does_not_keep_the_process_from_exiting() -> None:
    here = Path(__file__).resolve().parent
    code = _EXITS.format(repo=str(here.parents[2]), tests=str(here))
    # The hung write sleeps an hour: the process ends long before (or the run times out).
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "closed" in proc.stdout


def test_a_hung_prepare_of_one_of_two_sinks_is_not_tried_again() -> None:
    """With several sinks a prepare's failure is wrapped as that sink's: a hung one was tried
    again up to max_attempts, each try hanging another thread, though it may still run."""
    release = threading.Event()
    calls: list[int] = []
    a, b = FakeSink(), FakeSink()

    def stuck(pieces: Sequence[Piece]) -> Mapping[str, Any]:
        calls.append(1)
        release.wait(30.0)
        return {}

    b.prepare = stuck  # type: ignore[method-assign]
    env = Env(BatcherSettings(max_records=3, max_attempts=3, write_timeout=1.0,
                              retry_base_delay=0.0, retry_max_delay=0.0))  # fmt: skip
    env.batcher = MicroBatcher(
        [SinkRoute("a", a, 3, 1.0), SinkRoute("b", b, 3, 1.0)], env.settings,
        clock=env.clock, sleep=env.sleeps.append, threaded=False,
    )  # fmt: skip
    env.take(SHARDS[0])
    env.deliver(SHARDS[0], records(1, 3))
    try:
        stepping = threading.Thread(target=env.batcher.step)
        stepping.start()
        stepping.join(20.0)
        assert not stepping.is_alive()
        assert len(calls) == 1 and env.batcher._writer._side.threads.hung == 1
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON
    finally:
        release.set()
        env.batcher.close(timeout=5.0)


class _BrokenDeadLetters:
    def write(self, batch: SinkBatch, error: BaseException) -> None:
        raise OSError("dead-letter location unwritable (or: the worker is killed here)")


def test_a_re_formed_piece_gets_a_token_from_a_sink_whose_prepare_had_failed() -> None:
    """The sink whose prepare gave up stored no token in the pending state: the re-formed piece
    was written to it with none (delta: the next version at each attempt, so a write that timed
    out after it committed was committed again)."""
    env = two_sinks(max_attempts=1, dead_letter=_BrokenDeadLetters())
    env.take(SHARDS[0])
    real_prepare = env.b.prepare

    def unreadable(pieces: Sequence[Piece]) -> Mapping[str, Any]:
        raise OSError("the table's log is unreadable")

    env.b.prepare = unreadable  # type: ignore[method-assign]
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()  # a wrote; b unprepared, dead letter failed: parked, pending kept
    state = PendingState.decode(env.lease(SHARDS[0]).pending_checkpoint_state)
    assert state is not None
    # The lease moves; b is healthy again.
    env.table.evict_lease(env.lease(SHARDS[0]))
    env.b.prepare = real_prepare  # type: ignore[method-assign]
    env.batcher = env.new_batcher()
    env.take(SHARDS[0], worker="worker-b")
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.run_until_idle()
    assert env.b.written, "b never written"
    # b (a Delta sink, say) writes the re-formed piece with no version: not idempotent.
    assert env.b.written[-1].tokens[SHARDS[0]] is not None, env.b.written[-1].tokens


def test_each_sinks_attempts_failures_and_answers_are_metrics_labelled_with_its_name() -> None:
    """The sink-wide figures added every sink's together: which of two sinks kept failing (and
    was dead-lettered) could be read only from the logs."""
    import json

    from prometheus_client import CollectorRegistry, generate_latest

    from kclpy_spark.spark.updates import BatcherStatsCollector

    env = two_sinks(max_attempts=2, dead_letter=DeadLetters())
    env.take(SHARDS[0])
    env.b.fail = lambda batch: True
    env.deliver(SHARDS[0], records(1, 3))
    env.batcher.step()
    registry = CollectorRegistry()
    registry.register(BatcherStatsCollector(env.batcher.stats))
    exposed = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("kclpy_spark_sinks_") and "_created" not in line
    }
    assert {k: v for k, v in exposed.items() if "seconds" not in k} == {
        'kclpy_spark_sinks_write_attempts_total{sink="a"}': 1.0,
        'kclpy_spark_sinks_write_attempts_total{sink="b"}': 2.0,
        'kclpy_spark_sinks_failed_attempts_total{sink="a"}': 0.0,
        'kclpy_spark_sinks_failed_attempts_total{sink="b"}': 2.0,
        'kclpy_spark_sinks_batches_total{outcome="written",sink="a"}': 1.0,
        'kclpy_spark_sinks_batches_total{outcome="dead-lettered",sink="b"}': 1.0,
        # every sink and outcome from the start (a scrape never sees the figures grow)
        'kclpy_spark_sinks_batches_total{outcome="dead-lettered",sink="a"}': 0.0,
        'kclpy_spark_sinks_batches_total{outcome="failed",sink="a"}': 0.0,
        'kclpy_spark_sinks_batches_total{outcome="failed",sink="b"}': 0.0,
        'kclpy_spark_sinks_batches_total{outcome="written",sink="b"}': 0.0,
    }
    assert env.batcher.stats.failed_attempts == 2  # the sink-wide figure, as before
    json.dumps(env.batcher.status())  # the status page's copy holds plain values
