"""How often a worker asks whether its streams still exist (DescribeStreamSummary, 20 calls a
second per account): every control round (each failover time, 10 s) on every worker was the whole
account's limit at 50 workers on 4 streams."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import AccessError, ResourceNotFoundError, ThrottledError
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.streams import StreamSet, presence_interval
from kclpy_spark.stream_spec import StreamSpec


class Lister:
    def __init__(self) -> None:
        self.calls = 0
        self.deleted = False

    def describe(self) -> tuple[str, float | None]:
        self.calls += 1
        if self.deleted:
            raise ResourceNotFoundError("gone")
        return "ACTIVE", None


def streams(clock: ManualClock, names: list[str], timeout: float = 300.0) -> tuple[Any, dict]:
    cfg = WorkerConfig(stream_name=names[0], missing_dependency_timeout=timeout)
    found: Any = StreamSet(
        cfg, lambda: (), table=None, kinesis_sync=None, kinesis_async=None,  # type: ignore[arg-type]
        counters=None, clock=clock, rng=random.Random(1),  # type: ignore[arg-type]
    )  # fmt: skip
    listers = {n: Lister() for n in names}
    found.contexts = {
        n: SimpleNamespace(label=n, lister=listers[n], created=None, gone_since=None,
                           checked_at=None, stream_key=None, recreated=False)
        for n in names
    }  # fmt: skip
    return found, listers


def two_streams(clock: ManualClock) -> Any:
    """A StreamSet of two configured streams, "a" and "b", none opened yet."""
    specs = (StreamSpec(stream_name="a"), StreamSpec(stream_name="b"))
    cfg = WorkerConfig(streams=specs, missing_dependency_timeout=300.0)
    return StreamSet(
        cfg, lambda: specs, table=None, kinesis_sync=None, kinesis_async=None,  # type: ignore[arg-type]
        counters=None, clock=clock, rng=random.Random(1),  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize(("timeout", "every"), [(300.0, 60.0), (6.0, 1.2), (1e6, 60.0)])
def test_the_interval_is_a_fifth_of_the_timeout_at_most_a_minute(
    timeout: float, every: float
) -> None:
    assert presence_interval(timeout) == pytest.approx(every)


def test_each_stream_is_asked_once_a_minute_not_every_round() -> None:
    clock = ManualClock()
    found, listers = streams(clock, ["a", "b", "c", "d"])
    for _ in range(60):  # ten minutes of control rounds, one every 10 s
        asyncio.run(found.check_present())
        clock.advance(10.0)
    assert {n: lister.calls for n, lister in listers.items()} == dict.fromkeys(listers, 10)


def test_a_deleted_stream_is_noticed_at_its_next_check_and_stays_missing_between() -> None:
    clock = ManualClock()
    found, listers = streams(clock, ["a"], timeout=300.0)
    asyncio.run(found.check_present())
    listers["a"].deleted = True
    clock.advance(30.0)
    assert asyncio.run(found.check_present()) == []  # not asked yet
    clock.advance(30.0)
    missing = asyncio.run(found.check_present())
    assert [c.label for c in missing] == ["a"] and found.gone() == {"a": clock.monotonic()}
    clock.advance(10.0)
    assert [c.label for c in asyncio.run(found.check_present())] == ["a"]  # still, unasked
    assert listers["a"].calls == 2


def test_a_recreated_stream_of_several_is_reopened_under_its_new_identity() -> None:
    """Several streams: a stream deleted and made again (the worker going on, its other streams
    alive) was consumed with the old stream's leases and checkpoints."""
    clock = ManualClock()
    found = two_streams(clock)
    lister = Lister()
    lister.describe = lambda: ("ACTIVE", 200.0)  # type: ignore[method-assign]
    old = SimpleNamespace(
        label="a",
        lister=lister,
        created=100.0,
        gone_since=None,
        checked_at=None,
        stream_key="000000000000:a:100",
        recreated=False,
    )
    other = SimpleNamespace(
        label="b",
        lister=Lister(),
        created=None,
        gone_since=None,
        checked_at=None,
        stream_key="000000000000:b:50",
        recreated=False,
    )
    found.contexts = {"a": old, "b": other}  # fmt: skip
    assert asyncio.run(found.check_present()) == [] and old.recreated and not other.recreated
    fresh = SimpleNamespace(label="a", stream_key="000000000000:a:200", recreated=False)

    async def reopen(spec: StreamSpec, multi: bool) -> Any:
        assert spec.label == "a" and multi
        return fresh

    found._open = reopen
    removed, added = asyncio.run(found.refresh())
    assert removed == [old] and added and found.contexts == {"a": fresh, "b": other}
    assert found.configured() == 2


def test_whether_a_vanished_leases_shard_exists_is_asked_within_a_bound() -> None:
    """Asked under the lease's lock: the Kinesis client's own limits (30 s a try, three tries)
    held that lease's checkpoints for up to ~105 s."""
    import threading
    import time

    from botocore.exceptions import ClientError

    from checkpoint.lease import Lease
    from checkpoint.sequence import TRIM_HORIZON

    answer = threading.Event()

    class Kinesis:
        def __init__(self, fail: bool = False) -> None:
            self.fail = fail

        def get_shard_iterator(self, **request: Any) -> dict[str, str]:
            if self.fail:
                raise ClientError(
                    {"Error": {"Code": "ResourceNotFoundException"}}, "GetShardIterator"
                )
            answer.wait(60.0)  # a call that hangs
            return {"ShardIterator": "it"}

    def shards(kinesis: Any, failover: float = 2.0) -> Any:
        found: Any = StreamSet(
            WorkerConfig(stream_name="s", failover_time=failover), lambda: (), table=None,  # type: ignore[arg-type]
            kinesis_sync=kinesis, kinesis_async=None, counters=None,  # type: ignore[arg-type]
            clock=ManualClock(), rng=random.Random(1),
        )  # fmt: skip
        found.contexts = {
            "s": SimpleNamespace(
                owns=lambda lease: True, spec=SimpleNamespace(request={"StreamName": "s"})
            )
        }
        return found

    lease = Lease("shardId-000000000001", TRIM_HORIZON)
    began = time.monotonic()
    try:
        assert shards(Kinesis()).shard_exists(lease) is True  # no answer in time: taken as yes
        # The bound is a quarter of the failover time (0.5 s), with room for a test thread held
        # up under the suite's load: not the failover time, nor the client's own limits.
        assert time.monotonic() - began < 5.0
    finally:
        answer.set()
    # A bound of 5 s for an answer that comes at once (0.5 s was not always enough to start
    # the call's thread under load).
    assert shards(Kinesis(fail=True), failover=20.0).shard_exists(lease) is False


@pytest.mark.parametrize(
    ("error", "counted"),
    [
        (ResourceNotFoundError("no stream b"), True),
        (AccessError("AccessDenied: not allowed to describe b"), True),
        (ThrottledError("slow down"), False),  # passing: tried again, not counted
    ],
)
def test_a_stream_that_cannot_be_opened_for_good_counts_as_missing(
    error: Exception, counted: bool
) -> None:
    """Several streams, one refused for good (IAM covering only the others): it was retried and
    logged, but never counted as missing, so a worker none of whose streams opened stayed ready
    and never exited on missing_dependency_timeout."""
    clock = ManualClock()
    found = two_streams(clock)

    async def opened(spec: StreamSpec, multi: bool) -> Any:
        if spec.label == "b":
            raise error
        return SimpleNamespace(
            label="a", stream_key="000000000000:a:1", recreated=False, gone_since=None
        )

    found._open = opened
    asyncio.run(found.refresh(first=True))
    assert set(found.contexts) == {"a"}
    assert found.gone() == ({"b": clock.monotonic()} if counted else {})


def test_a_reset_naming_the_stream_by_name_lets_workers_naming_it_by_arn_start(
    monkeypatch: Any,
) -> None:
    """`reset` (a config naming the stream) recorded the new stream under its name; workers
    naming it by ARN read their ARN's record, still the old stream's, and refused to start
    however often the reset was run."""
    import argparse

    from checkpoint import coordination
    from checkpoint.lease import Lease
    from checkpoint.sequence import ExtendedSequenceNumber
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.ops import reset
    from kclpy_spark.runtime.streams import StreamRecreatedError, StreamSet
    from kclpy_spark.stream_spec import StreamSpec

    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/orders"
    clock = ManualClock()
    store = reset.open_store(WorkerConfig(stream_name="orders", lease_store="memory"))
    store.create_lease_if_absent(Lease("shardId-0", ExtendedSequenceNumber("5")))
    coordination.set_stream_created(store, arn, 100.0, now_wall=clock.wall())  # the old stream
    worker = SimpleNamespace(_table=store, _clock=clock)
    new_stream = SimpleNamespace(describe=lambda: ("ACTIVE", 200.0))
    by_arn = StreamSpec(stream_arn=arn)
    with pytest.raises(StreamRecreatedError):
        StreamSet._check_identity(worker, new_stream, by_arn)  # type: ignore[arg-type]
    cfg = WorkerConfig(stream_name="orders", lease_store="memory")
    args = argparse.Namespace(to="TRIM_HORIZON", shard=None, force=False, yes=True)
    monkeypatch.setattr(reset, "open_store", lambda cfg, writes_records=False: store)
    monkeypatch.setattr(reset, "_stream_lister", lambda cfg: new_stream)
    assert reset.reset_command(args, cfg) == 0
    assert StreamSet._check_identity(worker, new_stream, by_arn) == 200.0  # type: ignore[arg-type]
    assert coordination.stream_created(store, arn) == 200.0  # and the ARN's record follows
