"""FanOutFetcher against a fake SubscribeToShard source with an injected clock and sleep: renewal
before the five minutes end, resume from the continuation number, backoff after a broken stream,
shard end with child shards, consumer registration. No mocks, no real waiting."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.base.errors import AccessError, ConfigError, map_aws_error
from checkpoint.sequence import AT_TIMESTAMP, TRIM_HORIZON, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.retrieval.fanout import MIN_RESUBSCRIBE_INTERVAL, FanOutFetcher, starting_position
from kclpy_spark.retrieval.kpl import Deaggregator
from kclpy_spark.retrieval.kpl_aggregate import UserRecord, aggregate
from kclpy_spark.retrieval.polling import FetchedBatch, PollingFetcher
from kclpy_spark.retrieval.stream_consumer import ConsumerRegistry, deregister_consumer

STREAM_ARN = "arn:aws:kinesis:us-east-1:000000000000:stream/s"
CONSUMER_ARN = STREAM_ARN + "/consumer/app:1"
EVENT_GAP = 5.0  # AWS sends an event at least every 5 seconds


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}}, "SubscribeToShard")


def record(seq: int, data: bytes = b"d") -> dict[str, Any]:
    return {
        "Data": data,
        "PartitionKey": "pk",
        "SequenceNumber": str(seq),
        "ApproximateArrivalTimestamp": datetime(2026, 1, 1, tzinfo=UTC),
    }


CHILDREN = [{"ShardId": "shardId-000000000001"}]


def event(records: list[dict[str, Any]], continuation: str | None, **extra: Any) -> dict[str, Any]:
    """An event; one that ends the shard (no continuation) names its children unless ``extra``
    says otherwise, as Kinesis does."""
    body = {"Records": records, "ContinuationSequenceNumber": continuation, "MillisBehindLatest": 0}
    if continuation is None:
        body["ChildShards"] = CHILDREN
    return {"SubscribeToShardEvent": {**body, **extra}}


class FakeEventStream:
    """One subscription: each event arrives EVENT_GAP seconds after the previous one."""

    def __init__(
        self,
        clock: FakeClock,
        events: Iterator[dict[str, Any]],
        error: Exception | None = None,
    ) -> None:
        self._clock = clock
        self._events = events
        self._error = error
        self.closed = False

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[dict[str, Any]]:
        for e in self._events:
            self._clock.now += EVENT_GAP
            yield e
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self.closed = True


def heartbeats(continuation: str) -> Iterator[dict[str, Any]]:
    while True:
        yield event([], continuation)


class FakeKinesis:
    """SubscribeToShard answers scripted per call; the control plane says the consumer exists."""

    def __init__(self, clock: FakeClock, script: list[FakeEventStream | Exception]) -> None:
        self._clock = clock
        self._script = script
        self.subscribes: list[tuple[float, dict[str, Any]]] = []
        self.streams: list[FakeEventStream] = []
        self.consumer_status = ["ACTIVE"]
        self.registered = 0
        self.get_records_calls = 0

    async def describe_stream_summary(self, **kw: Any) -> dict[str, Any]:
        return {"StreamDescriptionSummary": {"StreamARN": STREAM_ARN}}

    async def describe_stream_consumer(self, **kw: Any) -> dict[str, Any]:
        status = self.consumer_status.pop(0) if len(self.consumer_status) > 1 else "ACTIVE"
        if status == "MISSING":
            raise client_error("ResourceNotFoundException")
        return {"ConsumerDescription": {"ConsumerStatus": status, "ConsumerARN": CONSUMER_ARN}}

    async def register_stream_consumer(self, **kw: Any) -> dict[str, Any]:
        self.registered += 1
        return {"Consumer": {"ConsumerARN": CONSUMER_ARN, "ConsumerStatus": "CREATING"}}

    async def deregister_stream_consumer(self, **kw: Any) -> None:
        if self.registered == 0:
            raise client_error("ResourceNotFoundException")
        self.registered -= 1

    async def subscribe_to_shard(self, **kw: Any) -> dict[str, Any]:
        self.subscribes.append((self._clock.now, kw["StartingPosition"]))
        step = self._script.pop(0)
        if isinstance(step, Exception):
            raise step
        self.streams.append(step)
        return {"EventStream": step}

    async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        return {"ShardIterator": "it"}

    async def get_records(self, **kw: Any) -> dict[str, Any]:
        self.get_records_calls += 1
        return {"Records": [], "NextShardIterator": "next", "MillisBehindLatest": 0}


def fetcher(
    kinesis: FakeKinesis,
    clock: FakeClock,
    queue: asyncio.Queue[FetchedBatch],
    checkpoint: ExtendedSequenceNumber = TRIM_HORIZON,
    **kw: Any,
) -> FanOutFetcher:
    return FanOutFetcher(
        kinesis,
        {"StreamName": "s"},
        "shardId-000000000000",
        checkpoint,
        InitialPosition.trim_horizon(),
        queue,
        consumer_name="app",
        sleep=clock.sleep,
        clock=clock,
        **({"registry": ConsumerRegistry()} | kw),
    )


def drain(queue: asyncio.Queue[FetchedBatch]) -> list[FetchedBatch]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def test_renews_before_five_minutes_and_resumes_after_the_continuation_number() -> None:
    clock = FakeClock()
    first = iter([event([record(10), record(11)], "11"), *[event([], "15")] * 1000])
    end = event([record(20)], None, ChildShards=[{"ShardId": "shardId-000000000001"}])
    kinesis = FakeKinesis(
        clock,
        [
            FakeEventStream(clock, first),
            FakeEventStream(clock, iter([event([], "15"), end])),
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = fetcher(kinesis, clock, queue)
    asyncio.run(f.run())

    (t1, pos1), (t2, pos2) = kinesis.subscribes
    assert pos1 == {"Type": "TRIM_HORIZON"}
    assert pos2 == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "15"}
    # Renewed at the 290 s lifetime (not at AWS's 300 s cut), with no backoff in between.
    assert 290.0 <= t2 - t1 < 290.0 + EVENT_GAP
    assert f.renewals == 1 and f.subscriptions == 2
    assert all(s.closed for s in kinesis.streams)
    batches = drain(queue)
    # Empty events at the tip go out as empty batches (lag 0: caught up); the records once each.
    tip = [b for b in batches if not b.records and not b.shard_ended]
    assert tip and all(b.millis_behind_latest == 0 for b in tip)
    batches = [b for b in batches if b not in tip]
    assert [[r.sequence_number for r in b.records] for b in batches] == [["10", "11"], ["20"]]
    assert batches[-1].shard_ended and batches[-1].child_shards[0]["ShardId"].endswith("1")


def test_a_broken_stream_backs_off_then_resumes_from_the_last_record() -> None:
    clock = FakeClock()
    broken = FakeEventStream(
        clock, iter([event([record(7)], "7")]), error=client_error("InternalFailure")
    )
    kinesis = FakeKinesis(
        clock,
        [
            broken,
            client_error("ResourceInUseException"),  # the old subscription is not released yet
            FakeEventStream(clock, iter([event([record(8)], None)])),
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = fetcher(kinesis, clock, queue)
    asyncio.run(f.run())
    positions = [p for _, p in kinesis.subscribes]
    assert positions[1:] == [{"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "7"}] * 2
    # One shard-end check by GetRecords after the broken stream (the shard was still open).
    assert kinesis.get_records_calls == 1
    # Full-jitter backoffs: 0..1 s after the first failure, 0..2 s after the second.
    backoffs = [s for s in clock.sleeps if s not in (MIN_RESUBSCRIBE_INTERVAL,)]
    assert len(backoffs) >= 1 and all(0 <= s <= 2.0 for s in backoffs)
    times = [t for t, _ in kinesis.subscribes]
    assert all(b - a >= MIN_RESUBSCRIBE_INTERVAL for a, b in itertools.pairwise(times))
    assert [r.sequence_number for b in drain(queue) for r in b.records] == ["7", "8"]


def test_a_subscription_that_ends_at_once_is_renewed_5_s_after_it_was_answered() -> None:
    """AWS refuses a subscription within 5 s of an answered one (ResourceInUseException): one
    a second drew refusals, logged as warnings that look like two readers of the shard."""
    clock = FakeClock()
    kinesis = FakeKinesis(
        clock,
        [
            FakeEventStream(clock, iter([])),
            FakeEventStream(clock, iter([])),
            FakeEventStream(clock, iter([event([], None)])),
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    asyncio.run(fetcher(kinesis, clock, queue).run())
    times = [t for t, _ in kinesis.subscribes]
    assert [round(b - a, 6) for a, b in itertools.pairwise(times)] == [5.0, 5.0]
    assert drain(queue)[-1].shard_ended


def test_a_placeholder_continuation_never_moves_the_resume_point_back() -> None:
    clock = FakeClock()
    checkpoint = ExtendedSequenceNumber("500")
    kinesis = FakeKinesis(
        clock,
        [
            FakeEventStream(clock, iter([event([], "0"), event([], "500")])),
            FakeEventStream(clock, iter([event([], None)])),
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    asyncio.run(fetcher(kinesis, clock, queue, checkpoint).run())
    positions = [p for _, p in kinesis.subscribes]
    # Both subscriptions re-read the checkpointed record (AT: it may be a KPL aggregate with
    # sub-records left): no record arrived, and the placeholders never move the point back.
    expected = {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "500"}
    assert positions == [expected, expected]


def test_resumes_inside_an_aggregate_and_deaggregates() -> None:
    clock = FakeClock()
    blob = aggregate([UserRecord("a", b"0"), UserRecord("b", b"1"), UserRecord("c", b"2")])
    kinesis = FakeKinesis(
        clock, [FakeEventStream(clock, iter([event([record(900, blob), record(901)], None)]))]
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = fetcher(
        kinesis, clock, queue, ExtendedSequenceNumber("900", 1), deaggregator=Deaggregator()
    )
    asyncio.run(f.run())
    assert kinesis.subscribes[0][1] == {"Type": "AT_SEQUENCE_NUMBER", "SequenceNumber": "900"}
    got = [(r.sequence_number, r.sub_sequence_number) for b in drain(queue) for r in b.records]
    assert got == [("900", 2), ("901", 0)]


def test_access_denied_is_not_retried() -> None:
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [client_error("AccessDeniedException")])
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    with pytest.raises(AccessError):
        asyncio.run(fetcher(kinesis, clock, queue).run())


def test_registers_a_missing_consumer_waits_for_active_and_remembers_it() -> None:
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [])
    kinesis.consumer_status = ["MISSING", "CREATING", "CREATING", "ACTIVE"]
    registry = ConsumerRegistry()

    async def twice() -> list[str]:
        return list(
            await asyncio.gather(
                registry.ensure(kinesis, {"StreamName": "s"}, "app", sleep=clock.sleep),
                registry.ensure(kinesis, {"StreamName": "s"}, "app", sleep=clock.sleep),
            )
        )

    assert asyncio.run(twice()) == [CONSUMER_ARN, CONSUMER_ARN]
    assert kinesis.registered == 1
    assert asyncio.run(deregister_consumer(kinesis, {"StreamARN": STREAM_ARN}, "app")) is True
    assert asyncio.run(deregister_consumer(kinesis, {"StreamARN": STREAM_ARN}, "app")) is False


def test_the_stream_arn_is_asked_once_and_a_throttled_ask_is_retried() -> None:
    """DescribeStreamSummary allows 20 calls a second per account: every fetcher (re)start asked
    it, and a throttled answer ended the fetcher (counted toward parking its lease)."""
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [])
    asked: list[int] = []
    answer = kinesis.describe_stream_summary

    async def throttled_twice(**kw: Any) -> dict[str, Any]:
        asked.append(1)
        if len(asked) <= 2:
            raise client_error("LimitExceededException")
        return await answer(**kw)

    kinesis.describe_stream_summary = throttled_twice  # type: ignore[method-assign]
    registry = ConsumerRegistry()

    async def three_fetchers() -> list[str]:  # starting at once, as a worker's leases do
        return list(await asyncio.gather(*(
            registry.ensure(kinesis, {"StreamName": "s"}, "app", sleep=clock.sleep)
            for _ in range(3)
        )))  # fmt: skip

    assert asyncio.run(three_fetchers()) == [CONSUMER_ARN] * 3
    assert len(asked) == 3  # two throttled, one answer, then remembered


def test_a_stream_summary_without_its_arn_is_retried_not_a_crash() -> None:
    """A 200 of ``{}`` (a proxy's page) raised a bare KeyError out of the fetcher, which the
    consumer took for its own bug and parked the lease at once."""
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [])
    asked: list[int] = []
    answer = kinesis.describe_stream_summary

    async def empty_once(**kw: Any) -> dict[str, Any]:
        asked.append(1)
        return {} if len(asked) == 1 else await answer(**kw)

    kinesis.describe_stream_summary = empty_once  # type: ignore[method-assign]
    registry = ConsumerRegistry()
    got = asyncio.run(registry.ensure(kinesis, {"StreamName": "s"}, "app", sleep=clock.sleep))
    assert got == CONSUMER_ARN and len(asked) == 2


def test_starting_positions_follow_the_polling_rules() -> None:
    latest = InitialPosition.latest()
    assert starting_position(ExtendedSequenceNumber("5"), latest) == {
        "Type": "AT_SEQUENCE_NUMBER",
        "SequenceNumber": "5",
    }
    when = datetime(2026, 1, 1, tzinfo=UTC)
    at = InitialPosition.at_timestamp(when)
    assert starting_position(at.checkpoint, at) == {"Type": "AT_TIMESTAMP", "Timestamp": when}


@pytest.mark.parametrize(
    ("key", "value"),
    [("consumer_name", "c" * 200), ("application_name", "a" * 300), ("worker_id", "w" * 300)],
)
def test_a_long_name_in_an_error_line_is_cut_not_redacted(key: str, value: str) -> None:
    """The log's redactor hides runs of 40+ letters and digits (secrets): a long name in an
    error line is cut to 32 characters with its length, so the line still says what is wrong."""
    from kclpy_spark.config import WorkerConfig, check
    from kclpy_spark.logs import redact

    with pytest.raises(ConfigError) as raised:
        check(WorkerConfig(stream_name="s", **{key: value}))
    line = redact(str(raised.value))
    assert "[redacted]" not in line and f"({len(value)} characters)" in line, line


def test_a_read_timeout_on_the_event_stream_is_a_failure_not_a_renewal() -> None:
    """aiohttp's ServerTimeoutError (a stalled subscription's read timeout) is a TimeoutError:
    it was taken for the lifetime timer, so counted as a renewal, with no backoff, no failure
    for readiness and no check whether the shard ended."""
    import aiohttp

    clock = FakeClock()
    stalled = FakeEventStream(
        clock, iter([event([record(7)], "7")]), error=aiohttp.ServerTimeoutError("read timeout")
    )
    after = FakeEventStream(clock, iter([event([record(8)], None)]))
    kinesis = FakeKinesis(clock, [stalled, after])
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = fetcher(kinesis, clock, queue)
    asyncio.run(f.run())
    assert [r.sequence_number for b in drain(queue) for r in b.records] == ["7", "8"]
    assert f.renewals == 0
    assert kinesis.get_records_calls == 1  # the shard-end check after a broken stream


def test_a_stream_with_all_its_consumers_registered_is_one_error_not_retried_forever() -> None:
    """RegisterStreamConsumer answers LimitExceededException when the stream has its 20
    consumers: it was retried as throttling for ever, logged at INFO, and every fan-out fetcher
    of the stream waited before its first read while its leases were renewed."""
    from botocore.exceptions import ClientError

    from checkpoint.base.errors import RequestError
    from kclpy_spark.retrieval.stream_consumer import REGISTER_REFUSALS

    def refused(code: str, operation: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": code}}, operation)

    class Full:
        registers = 0

        async def describe_stream_consumer(self, **_: Any) -> dict[str, Any]:
            raise refused("ResourceNotFoundException", "DescribeStreamConsumer")

        async def register_stream_consumer(self, **_: Any) -> dict[str, Any]:
            self.registers += 1
            raise refused("LimitExceededException", "RegisterStreamConsumer")

    async def nap(_: float) -> None:
        pass

    control = Full()
    arn = {"StreamARN": "arn:aws:kinesis:us-east-1:000000000000:stream/s"}
    with pytest.raises(RequestError, match="20 registered consumers"):
        asyncio.run(ConsumerRegistry().ensure(control, arn, "app", sleep=nap))
    assert control.registers == REGISTER_REFUSALS


def test_a_full_page_read_after_a_broken_stream_is_not_the_tip_for_a_job() -> None:
    """The shard-end check reads one small GetRecords page: a full one at lag 0 may have more behind
    it (kinesis-mock says 0 on every page), as the polling path's full pages."""
    from datetime import UTC, datetime

    from kclpy_spark.retrieval.fanout import END_CHECK_LIMIT

    clock = FakeClock()

    class FullPage(FakeKinesis):
        async def get_records(self, **kw: Any) -> dict[str, Any]:
            self.get_records_calls += 1
            assert kw["Limit"] == END_CHECK_LIMIT  # not a whole page of up to 10 MB
            at = datetime.fromtimestamp(900.0, tz=UTC)
            rows = [
                {"Data": b"x", "PartitionKey": "k", "SequenceNumber": str(100 + i),
                 "ApproximateArrivalTimestamp": at}
                for i in range(END_CHECK_LIMIT)
            ]  # fmt: skip
            return {"Records": rows, "NextShardIterator": "next", "MillisBehindLatest": 0}

    broken = FakeEventStream(clock, iter([]), error=RuntimeError("the stream broke"))
    kinesis = FullPage(
        clock, [broken, FakeEventStream(clock, iter([event([record(99999)], None)]))]
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    asyncio.run(fetcher(kinesis, clock, queue).run())
    full = [b for b in drain(queue) if len(b.records) == END_CHECK_LIMIT]
    assert kinesis.get_records_calls == 1 and len(full) == 1 and full[0].page_full


# Found by a review of fan-out (each failed on the code before its fix).


class Enough(Exception):
    """Raised by the fake sleep once a loop has clearly not stopped."""


def bounded_sleep(clock: FakeClock, limit: int):
    async def sleep(seconds: float) -> None:
        if len(clock.sleeps) >= limit:
            raise Enough(f"still looping after {limit} sleeps")
        await clock.sleep(seconds)

    return sleep


def test_fanout_does_not_retry_forever_a_start_position_it_cannot_build() -> None:
    """A lease checkpointed at AT_TIMESTAMP (e.g. written by a Java KCL, which keeps the time in
    its config, not the lease) read by a worker configured TRIM_HORIZON: iterator_args raises
    ValueError. Polling lets it out (the consumer parks the lease with the traceback); fan-out
    builds StartingPosition inside its try, map_aws_error turns the ValueError (no AWS code) into
    a retriable DependencyError, and it resubscribes for ever with WARNINGs."""
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [])
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = FanOutFetcher(
        kinesis,
        {"StreamName": "s"},
        "shardId-000000000000",
        AT_TIMESTAMP,
        InitialPosition.trim_horizon(),
        queue,
        consumer_name="app",
        sleep=bounded_sleep(clock, 50),
        clock=clock,
        registry=ConsumerRegistry(),
    )
    # What polling does with the same lease:
    p = PollingFetcher(
        kinesis,
        {"StreamName": "s"},
        "shardId-000000000000",
        AT_TIMESTAMP,
        InitialPosition.trim_horizon(),
        asyncio.Queue(),
        sleep=clock.sleep,
    )
    with pytest.raises(ConfigError, match="AT_TIMESTAMP without a time"):  # one line: no bug
        asyncio.run(p.run())
    # Fan-out should surface it the same way, not loop.
    with pytest.raises(ConfigError, match="AT_TIMESTAMP without a time"):
        asyncio.run(f.run())


def test_ensure_gives_up_or_reregisters_when_the_consumer_it_registered_disappears() -> None:
    """_register_and_wait: after its own RegisterStreamConsumer succeeded, every later
    ResourceNotFoundException is read as 'registered, not yet visible' and polled every 0.5 s
    without limit, log line or re-registration. If the consumer is deregistered in that window
    (another worker's shutdown deregister_consumer, an operator), ensure() never returns, and it
    holds the per-(stream, name) lock, so every fan-out fetcher of that stream in the process
    waits too."""
    clock = FakeClock()
    kinesis = FakeKinesis(clock, [])
    kinesis.consumer_status = ["MISSING"] * 10_000  # registered, then deleted before ACTIVE
    registry = ConsumerRegistry()
    with pytest.raises(Exception) as raised:
        asyncio.run(
            registry.ensure(kinesis, {"StreamName": "s"}, "app", sleep=bounded_sleep(clock, 200))
        )
    # Expected: a second registration (or a mapped error), not an endless silent poll.
    assert not isinstance(raised.value, Enough), (
        f"ensure() still polling after {len(clock.sleeps)} sleeps "
        f"({sum(clock.sleeps):.0f} s), registered {kinesis.registered} time(s)"
    )


class FiveSecondRule(FakeKinesis):
    """SubscribeToShard as documented: a call within 5 s of a successful call for the same
    consumer and shard answers ResourceInUseException."""

    def __init__(self, clock: FakeClock, script: list[Any]) -> None:
        super().__init__(clock, script)
        self.last_ok: float | None = None
        self.in_use = 0

    async def subscribe_to_shard(self, **kw: Any) -> dict[str, Any]:
        if self.last_ok is not None and self._clock.now - self.last_ok < 5.0:
            self.in_use += 1
            raise client_error("ResourceInUseException")
        resp = await super().subscribe_to_shard(**kw)
        self.last_ok = self._clock.now
        return resp


class InstantStream(FakeEventStream):
    """Breaks before its first event (a reset connection)."""

    async def _gen(self):  # type: ignore[override]
        if self._error is not None:
            raise self._error
        for e in self._events:
            yield e


def test_a_broken_stream_is_not_resubscribed_inside_the_five_second_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MIN_RESUBSCRIBE_INTERVAL is 1 s; AWS refuses a new subscription for 5 s after a
    successful one. A connection reset right after subscribing yields ResourceInUseException
    WARNINGs ('resubscribing in ...'), each counted as a failed read."""
    clock = FakeClock()
    kinesis = FiveSecondRule(
        clock,
        [
            InstantStream(clock, iter([]), error=ConnectionResetError("reset")),
            FakeEventStream(clock, iter([event([record(8)], None)])),
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    f = fetcher(kinesis, clock, queue)
    with caplog.at_level(logging.WARNING):
        asyncio.run(f.run())
    in_use_warnings = [r for r in caplog.records if "ResourceInUse" in r.getMessage()]
    assert kinesis.in_use == 0 and not in_use_warnings, (
        f"{kinesis.in_use} ResourceInUseException answers, {len(in_use_warnings)} WARNING lines"
    )


def test_a_fetcher_started_again_waits_out_the_five_seconds_of_the_last_ones_subscription() -> None:
    """A lease's source started again (the processor failed, a rewind) is a new fetcher: it
    subscribed at once, within 5 s of the last one's answered subscription, and got
    ResourceInUseException answers, each a WARNING and a counted failure."""
    clock = FakeClock()
    kinesis = FiveSecondRule(clock, [
        InstantStream(clock, iter([event([record(8)], "9")] * 50)),  # events without a pause
        FakeEventStream(clock, iter([event([record(10)], None)])),
    ])  # fmt: skip
    registry = ConsumerRegistry()

    async def two_fetchers() -> None:
        queue: asyncio.Queue[FetchedBatch] = asyncio.Queue(maxsize=1)  # so that it yields
        first = asyncio.create_task(fetcher(kinesis, clock, queue, registry=registry).run())
        await queue.get()
        await queue.get()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        assert clock.now == 0.0
        clock.now += 1.0
        again = fetcher(kinesis, clock, queue, ExtendedSequenceNumber("8"), registry=registry)
        await asyncio.wait_for(asyncio.gather(again.run(), queue.get()), 10)

    asyncio.run(two_fetchers())
    assert kinesis.in_use == 0, f"{kinesis.in_use} ResourceInUseException answers"


def test_a_permanent_error_inside_the_event_stream_is_not_retried_forever() -> None:
    """botocore raises an in-stream exception event as EventStreamError, whose response has no
    HTTPStatusCode; map_aws_error then maps every code it does not list (KMSAccessDenied,
    KMSDisabled, KMSNotFound, InvalidArgument...) to a retriable DependencyError. The same code
    from GetRecords (HTTP 400) is a RequestError that polling raises (the lease gets parked);
    fan-out resubscribes for ever, one WARNING per attempt, lease renewed, shard unread."""
    from botocore.exceptions import EventStreamError

    in_stream = EventStreamError(
        {"Error": {"Code": "KMSAccessDeniedException", "Message": "denied"}}, "SubscribeToShard"
    )
    from_get_records = ClientError(
        {
            "Error": {"Code": "KMSAccessDeniedException", "Message": "denied"},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        },
        "GetRecords",
    )
    assert not map_aws_error(from_get_records, "x").retriable  # polling: raised
    clock = FakeClock()
    streams = [FakeEventStream(clock, iter([]), error=in_stream) for _ in range(100)]
    kinesis = FakeKinesis(clock, streams)
    f = FanOutFetcher(
        kinesis,
        {"StreamName": "s"},
        "shardId-000000000000",
        TRIM_HORIZON,
        InitialPosition.trim_horizon(),
        asyncio.Queue(),
        consumer_name="app",
        sleep=bounded_sleep(clock, 60),
        clock=clock,
        registry=ConsumerRegistry(),
    )
    with pytest.raises(Exception) as raised:
        asyncio.run(f.run())
    assert not isinstance(raised.value, Enough), (
        f"{len(kinesis.subscribes)} subscriptions, each ended by KMSAccessDeniedException"
    )


def test_the_registry_keeps_only_the_last_five_seconds_of_subscriptions() -> None:
    """Kept per consumer and shard for a daemon's weeks: one entry a shard ever subscribed would
    grow with every shard of every reshard; only those a wait may still need are kept."""
    registry = ConsumerRegistry()
    for i in range(1_000):
        registry.note_subscribed(CONSUMER_ARN, f"shardId-{i:012d}", float(i), 5.0)
    assert len(registry._subscribed) == 5  # answered within 5 s of the last
    assert registry.subscribed_at(CONSUMER_ARN, f"shardId-{999:012d}") == 999.0
    assert registry.subscribed_at(CONSUMER_ARN, f"shardId-{0:012d}") is None


def test_empty_events_behind_the_tip_go_out_with_their_lag() -> None:
    """As polling's: an empty event behind the tip was dropped, so the lag shown stayed where
    the last records left it and a processor asking to be called after every empty read (the
    KCL's callProcessRecordsEvenForEmptyRecordList) was not."""
    clock = FakeClock()
    events = iter([event([], "15", MillisBehindLatest=4_000), event([record(20)], None)])
    kinesis = FakeKinesis(clock, [FakeEventStream(clock, events)])
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    asyncio.run(fetcher(kinesis, clock, queue).run())
    batches = drain(queue)
    assert [(len(b.records), b.millis_behind_latest) for b in batches] == [(0, 4_000), (1, 0)]
