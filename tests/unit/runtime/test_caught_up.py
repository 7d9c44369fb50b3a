"""``until_caught_up`` (issue 18): when a shard is caught up, which leases a job still waits for,
and a consumer that ends at the tip with its records committed, or says why they are not."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest
from test_consumer import SHARD, Env, FakeSources, Recorder, batch

from checkpoint.lease import Lease
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import ProcessRecordsInput, Record
from kclpy_spark.retrieval.source import FetchedBatch
from kclpy_spark.runtime.caught_up import CaughtUp
from kclpy_spark.runtime.consumer import Outcome, ShardConsumer

STARTED = 1_000.0  # the job's start, wall seconds


def arrived(seq: int, at: float) -> Record:
    return Record(b"x", "k", str(seq), timestamp_millis=int(at * 1000))


@pytest.mark.parametrize(
    ("fetched", "caught_up"),
    [
        (FetchedBatch([], 0), True),  # an empty read at the tip
        (FetchedBatch([arrived(1, 900.0)], 0), True),  # the last record before the tip
        (FetchedBatch([arrived(1, 900.0)], 5_000), False),  # behind, all from before the start
        (FetchedBatch([arrived(1, 900.0), arrived(2, 1_000.0)], 5_000), True),  # past the start
        (FetchedBatch([arrived(1, 1_200.0), arrived(2, 900.0)], 5_000), False),  # the last counts
        (FetchedBatch([arrived(1, 900.0)], None), False),  # no lag reported, before the start
        # A full page at lag 0: more may wait behind it (kinesis-mock says 0 on every page).
        (FetchedBatch([arrived(1, 900.0)], 0, page_full=True), False),
        (FetchedBatch([arrived(1, 900.0), arrived(2, 1_000.0)], 0, page_full=True), True),
    ],
)
def test_when_a_shard_is_caught_up(fetched: FetchedBatch, caught_up: bool) -> None:
    assert CaughtUp(STARTED).reached(fetched) is caught_up


def lease(key: str, *parents: str, done: bool = False) -> Lease:
    return Lease(key, SHARD_END if done else TRIM_HORIZON, parent_shard_ids=frozenset(parents))


def test_every_open_lease_is_waited_for_until_done_or_failed() -> None:
    job = CaughtUp(STARTED)
    leases = [lease("a"), lease("b"), lease("old", done=True)]
    assert job.remaining(leases) == ["a", "b"]
    job.finished("a", None)
    job.finished("b", "not committed")
    assert job.remaining(leases) == []
    assert job.done == {"a"} and job.failed == {"b": "not committed"}


def test_children_of_a_shard_that_ended_before_the_start_are_read() -> None:
    job = CaughtUp(STARTED)
    leases = [lease("p", done=True), lease("c1", "p"), lease("c2", "p")]
    assert job.remaining(leases) == ["c1", "c2"]


def test_descendants_of_a_caught_up_shard_hold_nothing_from_before_the_start() -> None:
    job = CaughtUp(STARTED)
    assert job.remaining([lease("p"), lease("other")]) == ["other", "p"]  # the first scan
    job.finished("p", None)  # caught up, then split after the start
    leases = [lease("p"), lease("c1", "p"), lease("c2", "p"), lease("g", "c1", "c2"),
              lease("other")]  # fmt: skip
    assert job.remaining(leases) == ["other"]


def test_children_of_a_failed_shard_do_not_hold_the_job() -> None:
    job = CaughtUp(STARTED)
    job.remaining([lease("p")])
    job.finished("p", "not committed")
    assert job.remaining([lease("p"), lease("c1", "p")]) == []
    assert job.failed == {"p": "not committed"}


def test_a_child_at_the_start_whose_parent_was_caught_up_early_fails_loudly() -> None:
    """A shard closed before the start must reach SHARD_END; if it was taken as caught up
    instead, its children (there at the start) could never be read: the job says so."""
    job = CaughtUp(STARTED)
    leases = [lease("p"), lease("c1", "p")]
    assert job.remaining(leases) == ["c1", "p"]
    job.finished("p", None)
    assert job.remaining(leases) == []
    assert "its parent p was caught up before its end" in job.failed["c1"]


def test_a_child_at_the_start_whose_parent_failed_in_the_job_fails_instead_of_hanging() -> None:
    """#49 item 14: the parent parked (failed here) never reaches SHARD_END in this job, so its
    child, there at the start, could never be read: it stayed in ``remaining`` for ever."""
    job = CaughtUp(STARTED)
    leases = [lease("p"), lease("c1", "p")]
    assert job.remaining(leases) == ["c1", "p"]
    job.finished("p", "parked: process_records failed")
    assert job.remaining(leases) == []
    assert job.failed["c1"] == (
        "its parent p did not reach its end in this job (parked: process_records failed)"
    )


def test_a_child_whose_failed_parent_another_job_worker_finished_is_still_read() -> None:
    job = CaughtUp(STARTED)
    assert job.remaining([lease("p"), lease("c1", "p")]) == ["c1", "p"]
    job.finished("p", "parked here")
    # Another job worker took the parked parent later and read it to SHARD_END.
    assert job.remaining([lease("p", done=True), lease("c1", "p")]) == ["c1"]
    assert "c1" not in job.failed


def test_multi_stream_parents_are_found_within_their_stream() -> None:
    job = CaughtUp(STARTED)
    job.finished("1:s1:1:shardId-0", None)
    child = Lease("1:s2:1:shardId-1", TRIM_HORIZON, parent_shard_ids=frozenset({"shardId-0"}))
    assert job.remaining([child]) == ["1:s2:1:shardId-1"]  # s2's shardId-0 is not done


def run_job(env: Env, sources: FakeSources) -> tuple[Outcome, CaughtUp]:
    job = CaughtUp(STARTED)
    taken = env.table.take_lease(env.stored(), "worker-a")
    assert taken is not None
    consumer = ShardConsumer(
        held=env.holder.add_taken(taken), holder=env.holder, table=env.table,
        processors=lambda: env.processor, sources=sources, probe=env.probe, cfg=env.cfg,
        clock=env.clock, sleep=env.clock.sleep, metrics=env.metrics, caught_up=job,
    )  # fmt: skip
    return asyncio.run(asyncio.wait_for(consumer.run(), 30)), job


def test_a_consumer_stops_at_the_tip_with_everything_committed() -> None:
    env = Env()
    env.lease()
    outcome, job = run_job(env, FakeSources([batch(10, lag=900), batch(20, lag=0), batch(30)]))
    assert outcome is Outcome.CAUGHT_UP
    assert env.processor.seen == ["10", "20"]  # not 30: read after the tip
    assert env.processor.calls[-2:] == ["shutdown_requested", "lease_lost"]
    assert job.done == {SHARD} and not job.failed
    assert env.stored().checkpoint == ExtendedSequenceNumber("20")
    assert env.stored().lease_owner is None  # released; this worker does not take it again


def test_records_never_checkpointed_fail_the_job_with_the_reason() -> None:
    class NoCheckpoints(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            self.seen += [r.sequence_number for r in process_records_input.records]

    env = Env(processor=NoCheckpoints())
    env.lease()
    outcome, job = run_job(env, FakeSources([batch(10, lag=0)]))
    assert outcome is Outcome.CAUGHT_UP and not job.done
    assert "records up to 10 were delivered but the checkpoint is TRIM_HORIZON" in job.failed[SHARD]


def test_a_checkpoint_in_shutdown_requested_is_enough() -> None:
    class AtShutdown(Recorder):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            self.seen += [r.sequence_number for r in process_records_input.records]

        def shutdown_requested(self, shutdown_requested_input: Any) -> None:
            self.told_caught_up = shutdown_requested_input.caught_up  # no hurry: a job's end
            shutdown_requested_input.checkpointer.checkpoint()

    env = Env(processor=AtShutdown())
    env.lease()
    _, job = run_job(env, FakeSources([batch(10, 11, lag=0)]))
    assert job.done == {SHARD} and env.stored().checkpoint == ExtendedSequenceNumber("11")
    assert env.processor.told_caught_up is True


def test_an_idle_shard_is_caught_up_by_an_empty_read_at_the_tip() -> None:
    env = Env()
    env.lease()
    outcome, job = run_job(env, FakeSources([FetchedBatch([], 0)]))
    assert outcome is Outcome.CAUGHT_UP and job.done == {SHARD}
    assert env.processor.calls == ["initialize", "shutdown_requested", "lease_lost"]


def test_a_lease_parked_in_a_job_fails_it_instead_of_coming_back() -> None:
    env = Env(processor=Recorder(lambda name, arg: name == "process_records"))
    env.lease()
    outcome, job = run_job(env, FakeSources([batch(10, lag=5_000)]))
    assert outcome is Outcome.PARKED and not job.done
    assert job.failed[SHARD].startswith("parked: ") and "process_records" in job.failed[SHARD]
    assert job.remaining([env.stored()]) == []  # the job ends (exit 1), not after each reopen


class TwoPagesAtLagZero:
    """A full page then a short one, both saying lag 0 (as kinesis-mock does on every page)."""

    def __init__(self) -> None:
        self.pages = 0

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        return {"ShardIterator": "it"}

    async def get_records(self, **_: Any) -> dict[str, Any]:
        self.pages += 1
        if self.pages > 2:
            raise asyncio.CancelledError()
        first = 2 * self.pages - 1
        at = datetime.fromtimestamp(900.0, tz=UTC)
        rows = [
            {"Data": b"x", "PartitionKey": "k", "SequenceNumber": str(first + i),
             "ApproximateArrivalTimestamp": at}
            for i in range(3 - self.pages)
        ]  # fmt: skip
        return {"Records": rows, "NextShardIterator": "next", "MillisBehindLatest": 0}


def test_a_full_page_at_lag_zero_is_not_the_tip_for_a_job() -> None:
    """The driver path ended ``--until-caught-up`` leases on a full page with records unread."""
    from kclpy_spark.retrieval.polling import PollingFetcher

    async def nap(_: float) -> None:
        pass

    queue = asyncio.Queue[FetchedBatch]()
    fetcher = PollingFetcher(
        TwoPagesAtLagZero(), {"StreamName": "s"}, SHARD, TRIM_HORIZON, InitialPosition.latest(),
        queue, max_records=2, sleep=nap, clock=lambda: 0.0,
    )  # fmt: skip
    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(fetcher.run())
    full, short = queue.get_nowait(), queue.get_nowait()
    assert (len(full.records), full.page_full, len(short.records), short.page_full) == (
        2, True, 1, False,
    )  # fmt: skip
    job = CaughtUp(STARTED)
    assert not job.reached(full) and job.reached(short)
