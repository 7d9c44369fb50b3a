"""A shard ends only when the service says so unmistakably (#49 item 1).

A 200 answer of ``{}`` or an HTML page (botocore parses that to ``{"message": ...}``) has no next
iterator; before, the fetcher took that as SHARD_END and the open shard was never read again. Now
only an answer naming the children, or one ListShards confirms, ends a shard; anything else is a
malformed answer, asked again with the same iterator after a backoff. Scripted clients, virtual
time, no mocks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from checkpoint.base.errors import DependencyError, MalformedAnswerError
from checkpoint.sequence import TRIM_HORIZON, InitialPosition
from kclpy_spark.retrieval.polling import PollingFetcher
from kclpy_spark.retrieval.source import (
    FetchedBatch,
    FetchProgress,
    KinesisShardProbe,
    PageEnd,
    page_end,
)
from shard_sync.discovery import KinesisShardLister
from tests.unit.test_fanout import FakeClock, FakeEventStream, FakeKinesis, event, fetcher, record

CHILD = {"ShardId": "shardId-000000000001", "ParentShards": ["shardId-000000000000"]}
HTML = {"message": "<html><body>Service Unavailable</body></html>"}


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ({"Records": [], "NextShardIterator": "it"}, PageEnd.MORE),
        ({"Records": [], "NextShardIterator": "it", "ChildShards": []}, PageEnd.MORE),
        ({"Records": [], "NextShardIterator": None, "ChildShards": [CHILD]}, PageEnd.ENDED),
        ({"Records": [], "ChildShards": [CHILD, CHILD]}, PageEnd.ENDED),
        ({"Records": [], "NextShardIterator": None}, PageEnd.UNCONFIRMED),
        ({"Records": [], "NextShardIterator": None, "ChildShards": []}, PageEnd.UNCONFIRMED),
        ({"Records": [], "ChildShards": [{"HashKeyRange": {}}]}, PageEnd.UNCONFIRMED),
        ({"Records": [], "ChildShards": "shardId-1"}, PageEnd.UNCONFIRMED),
        ({}, PageEnd.MALFORMED),
        (HTML, PageEnd.MALFORMED),
        ({"NextShardIterator": "it"}, PageEnd.MALFORMED),
        ({"Records": None, "ChildShards": [CHILD]}, PageEnd.MALFORMED),
        ({"Records": [], "NextShardIterator": ""}, PageEnd.MALFORMED),
        ({"Records": [], "NextShardIterator": 7}, PageEnd.MALFORMED),
    ],
)
def test_page_end_of_get_records_answers(answer: dict[str, Any], verdict: PageEnd) -> None:
    assert page_end(answer) is verdict


def test_page_end_of_subscribe_to_shard_events() -> None:
    key = "ContinuationSequenceNumber"
    assert page_end({"Records": [], key: "5"}, key) is PageEnd.MORE
    assert page_end({"Records": [], key: None, "ChildShards": [CHILD]}, key) is PageEnd.ENDED
    assert page_end({"Records": [], key: None}, key) is PageEnd.UNCONFIRMED


def _page(seqs: list[int], next_iterator: str | None = "it", **extra: Any) -> dict[str, Any]:
    records = [
        {"Data": b"d", "PartitionKey": "k", "SequenceNumber": str(s),
         "ApproximateArrivalTimestamp": None}
        for s in seqs
    ]  # fmt: skip
    return {
        "Records": records,
        "NextShardIterator": next_iterator,
        "MillisBehindLatest": 0,
        **extra,
    }


class ScriptedShard:
    """GetRecords answers in order, and ListShards listing the shard open or closed."""

    def __init__(
        self, answers: list[dict[str, Any]], *, closed: bool = False, children: bool = True
    ) -> None:
        self.answers = answers
        self.closed = closed
        self.children = children
        self.iterator_calls = 0
        self.iterators_read: list[str] = []
        self.list_calls: list[dict[str, Any]] = []

    async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
        self.iterator_calls += 1
        return {"ShardIterator": f"it-{self.iterator_calls}"}

    async def get_records(self, ShardIterator: str, **_: Any) -> dict[str, Any]:
        self.iterators_read.append(ShardIterator)
        return self.answers.pop(0)

    async def list_shards(self, **kw: Any) -> dict[str, Any]:
        self.list_calls.append(kw)
        numbers = {"StartingSequenceNumber": "1"}
        if self.closed:
            numbers["EndingSequenceNumber"] = "99"
        other = {"ShardId": "shardId-000000000009", "SequenceNumberRange": {}}
        shards = [other, {"ShardId": "shardId-000000000000", "SequenceNumberRange": numbers}]
        if self.closed and self.children:
            child = {"ShardId": "shardId-000000000001", "ParentShardId": "shardId-000000000000",
                     "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}  # fmt: skip
            shards.append(child)
        return {"Shards": shards}


def _read(
    shard: ScriptedShard, on_sleep: Callable[[FetchProgress], None] = lambda _: None
) -> tuple[list[FetchedBatch], FetchProgress, list[float]]:
    """Run a fetcher over ``shard`` to its end; ``on_sleep`` sees the progress at each wait."""
    sleeps: list[float] = []
    progress = FetchProgress(lambda: 0.0)

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        on_sleep(progress)

    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    fetcher = PollingFetcher(
        shard, {"StreamName": "s"}, "shardId-000000000000", TRIM_HORIZON,
        InitialPosition.trim_horizon(), queue, sleep=sleep, clock=lambda: 0.0,
        rng=random.Random(3), progress=progress,
    )  # fmt: skip
    asyncio.run(fetcher.run())
    batches = []
    while not queue.empty():
        batches.append(queue.get_nowait())
    return batches, progress, sleeps


def test_empty_and_html_answers_are_asked_again_and_never_end_an_open_shard() -> None:
    shard = ScriptedShard(
        [
            _page([1, 2], "it-a"),
            {},
            HTML,
            _page([], None),  # no iterator, no children, and ListShards lists the shard open
            _page([], None, ChildShards=[]),
            _page([3], "it-b"),
            _page([4], None, ChildShards=[CHILD]),
        ]
    )
    batches, progress, sleeps = _read(shard)
    assert [[r.sequence_number for r in b.records] for b in batches] == [["1", "2"], ["3"], ["4"]]
    assert [b.shard_ended for b in batches] == [False, False, True]
    assert batches[-1].child_shards == [CHILD]
    # The iterator that got a malformed answer is read again (it reads the same place); no new
    # iterator is asked for (at LATEST a new one would skip what arrived meanwhile).
    assert shard.iterators_read == ["it-1", "it-a", "it-a", "it-a", "it-a", "it-a", "it-b"]
    assert shard.iterator_calls == 1
    # Each malformed answer was a failed call with a backoff; the answers without children
    # asked ListShards, which listed the shard open.
    assert len(sleeps) >= 4 and len(shard.list_calls) == 2
    assert progress.failures == 0  # reset by the good answers that followed


def test_an_end_without_children_counts_once_list_shards_shows_the_shard_closed() -> None:
    """An emulator's shard end without ChildShards: ListShards confirms it, and the children it
    lists go into the batch, so the shard-end step creates their leases (shard sync would not:
    the children of a leased parent are left to its shard end)."""
    shard = ScriptedShard([_page([1], None)], closed=True)
    batches, _, sleeps = _read(shard)
    assert [(len(b.records), b.shard_ended) for b in batches] == [(1, True)]
    assert batches[0].child_shards == [
        {"ShardId": "shardId-000000000001", "ParentShards": ["shardId-000000000000"],
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}
    ]  # fmt: skip
    assert shard.list_calls == [{"StreamName": "s"}] and not sleeps


def test_a_closed_shard_whose_children_are_not_listed_yet_is_asked_again() -> None:
    shard = ScriptedShard(
        [_page([1], None), _page([1], None, ChildShards=[CHILD])], closed=True, children=False
    )
    batches, _, sleeps = _read(shard)
    assert [(len(b.records), b.shard_ended, b.child_shards) for b in batches] == [
        (1, True, [CHILD])
    ]
    assert len(sleeps) == 1 and shard.iterators_read == ["it-1", "it-1"]


def test_failures_are_counted_while_the_answers_stay_malformed() -> None:
    shard = ScriptedShard([{}, {}, {}, _page([5], None, ChildShards=[CHILD])])
    seen: list[int] = []
    _read(shard, lambda progress: seen.append(progress.failures))
    assert seen[:3] == [1, 2, 3]  # the consumer's readiness sees a source that keeps failing


class PagedShards:
    """ListShards over two pages: the shard on the first (closed or open), its merge child on
    the second."""

    def __init__(self, ending: str | None) -> None:
        self.ending = ending
        self.calls: list[dict[str, Any]] = []

    async def list_shards(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(kw)
        if "NextToken" not in kw:
            numbers = {"StartingSequenceNumber": "1"}
            if self.ending:
                numbers["EndingSequenceNumber"] = self.ending
            shard = {"ShardId": "shardId-000000000007", "SequenceNumberRange": numbers}
            return {"Shards": [shard], "NextToken": "t"}
        child = {"ShardId": "shardId-000000000009", "ParentShardId": "shardId-000000000006",
                 "AdjacentParentShardId": "shardId-000000000007",
                 "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}  # fmt: skip
        return {"Shards": [child]}


MERGE_CHILD = {"ShardId": "shardId-000000000009",
               "ParentShards": ["shardId-000000000006", "shardId-000000000007"],
               "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}  # fmt: skip


@pytest.mark.parametrize(("ending", "children"), [("99", [MERGE_CHILD]), (None, None)])
def test_children_if_closed_pages_through_list_shards(ending: str | None, children: Any) -> None:
    client = PagedShards(ending)
    probe = KinesisShardProbe(client, {"StreamARN": "arn:aws:kinesis:us-east-1:1:stream/s"})
    assert asyncio.run(probe.children_if_closed("shardId-000000000007")) == children
    # The second page is asked by its token alone (ListShards refuses the stream beside it).
    assert client.calls == [{"StreamARN": "arn:aws:kinesis:us-east-1:1:stream/s"},
                            {"NextToken": "t"}]  # fmt: skip
    assert asyncio.run(probe.children_if_closed("shardId-000000000042")) is None


class OpenShardFanOut(FakeKinesis):
    """Fan-out whose ListShards lists the shard open."""

    async def list_shards(self, **kw: Any) -> dict[str, Any]:
        return {"Shards": [{"ShardId": "shardId-000000000000", "SequenceNumberRange": {}}]}


def test_a_fan_out_event_without_continuation_or_children_does_not_end_an_open_shard() -> None:
    clock = FakeClock()
    kinesis = OpenShardFanOut(
        clock,
        [
            FakeEventStream(
                clock, iter([event([record(7)], "7"), event([], None, ChildShards=[])])
            ),
            FakeEventStream(clock, iter([event([record(8)], None)])),  # a real end: children
        ],
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    asyncio.run(fetcher(kinesis, clock, queue).run())
    batches = []
    while not queue.empty():
        batches.append(queue.get_nowait())
    assert [([r.sequence_number for r in b.records], b.shard_ended) for b in batches] == [
        (["7"], False),
        (["8"], True),
    ]
    positions = [p for _, p in kinesis.subscribes]
    assert positions[1] == {"Type": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": "7"}


class Answers:
    """A boto3-shaped Kinesis client answering ``{}`` a number of times, then properly."""

    def __init__(self, bad: int) -> None:
        self.bad = bad
        self.calls = 0

    def _answer(self, good: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        return {} if self.calls <= self.bad else good

    def describe_stream_summary(self, **_: Any) -> dict[str, Any]:
        return self._answer({"StreamDescriptionSummary": {"StreamStatus": "ACTIVE"}})

    def list_shards(self, **_: Any) -> dict[str, Any]:
        shard = {"ShardId": "shardId-000000000000",
                 "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"},
                 "SequenceNumberRange": {"StartingSequenceNumber": "1"}}  # fmt: skip
        return self._answer({"Shards": [shard]})


def test_an_empty_list_shards_or_describe_answer_is_retried_not_read_as_no_shards() -> None:
    client = Answers(bad=2)
    lister = KinesisShardLister(client, stream_name="s", sleep=lambda _: None)
    with pytest.raises(MalformedAnswerError, match="without the stream's status"):
        lister.describe()
    with pytest.raises(MalformedAnswerError, match="without a Shards list"):
        lister._list_once(None)
    client = Answers(bad=3)
    lister = KinesisShardLister(client, stream_name="s", sleep=lambda _: None)
    assert [s.shard_id for s in lister.list_shards()] == ["shardId-000000000000"]
    assert client.calls == 5  # 3 malformed answers retried, then a describe and a listing


class NoIteratorFirst(ScriptedShard):
    """GetShardIterator answers ``{}`` twice (a proxy), then an iterator."""

    async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        self.iterator_calls += 1
        return {} if self.iterator_calls <= 2 else {"ShardIterator": "it-ok"}


def test_a_get_shard_iterator_answer_without_an_iterator_is_asked_again() -> None:
    """It was retried with the bare message 'ShardIterator' (a KeyError's)."""
    shard = NoIteratorFirst([_page([1], None, ChildShards=[CHILD])])
    batches, _, sleeps = _read(shard)
    assert shard.iterator_calls == 3 and shard.iterators_read == ["it-ok"]
    assert [b.shard_ended for b in batches] == [True] and len(sleeps) == 2


def test_the_shard_probe_takes_no_iterator_for_a_malformed_answer_not_an_empty_shard() -> None:
    """The retention check read GetShardIterator's ``{}`` as a shard holding nothing, and so
    skipped the aged-checkpoint check."""

    class Empty:
        async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
            return {}

    probe = KinesisShardProbe(Empty(), {"StreamName": "s"})
    with pytest.raises(DependencyError, match="without a ShardIterator"):
        asyncio.run(probe.earliest_sequence_number("shardId-000000000000"))


def test_the_shard_probe_spaces_its_reads_of_empty_pages_at_the_shards_limit() -> None:
    """Up to five GetRecords back to back at every tenure's start (then the consumer's own
    read): over the shard's 5 a second, shared with every other application on it."""

    class EmptyPagesBehind:
        calls = 0

        async def get_shard_iterator(self, **_: Any) -> dict[str, Any]:
            return {"ShardIterator": "it"}

        async def get_records(self, **_: Any) -> dict[str, Any]:
            self.calls += 1
            return {"Records": [], "NextShardIterator": "it", "MillisBehindLatest": 1000}

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    shard = EmptyPagesBehind()
    probe = KinesisShardProbe(shard, {"StreamName": "s"}, sleep=sleep)
    assert asyncio.run(probe.earliest_sequence_number("shardId-000000000000")) is None
    assert shard.calls == 5 and slept == [0.2] * 4
