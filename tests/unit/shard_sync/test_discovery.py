"""The ListShards adapter's answers it must not trust, and the garbage probe (a boto3-shaped
client scripted per call; no network)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.base.errors import MalformedAnswerError, ThrottledError
from shard_sync.discovery import MAX_LIST_PAGES, KinesisShardLister


def entry(n: int, start: str = "1") -> dict[str, Any]:
    return {
        "ShardId": f"shardId-{n:012d}",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"},
        "SequenceNumberRange": {"StartingSequenceNumber": start},
    }


class Pages:
    """ListShards answering ``pages`` in turn (the last one again once they run out)."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages
        self.calls = 0

    def list_shards(self, **_: Any) -> dict[str, Any]:
        self.calls += 1
        return self.pages[min(self.calls, len(self.pages)) - 1]


def lister(client: Any) -> KinesisShardLister:
    return KinesisShardLister(client, stream_name="s", sleep=lambda _: None)


def test_a_next_token_that_never_ends_is_a_malformed_answer_not_an_endless_listing() -> None:
    """A NextToken given again listed for ever (the retry policy's deadline is only looked at
    between attempts)."""
    client = Pages([{"Shards": [entry(0)], "NextToken": "t1"}, {"Shards": [], "NextToken": "t1"}])
    with pytest.raises(MalformedAnswerError, match="NextToken given twice"):
        lister(client)._list_once(None)
    assert client.calls == 2


def test_a_listing_of_new_tokens_for_ever_ends_at_the_page_limit() -> None:
    class Endless:
        calls = 0

        def list_shards(self, **_: Any) -> dict[str, Any]:
            self.calls += 1
            return {"Shards": [], "NextToken": f"t{self.calls}"}

    client = Endless()
    with pytest.raises(MalformedAnswerError, match=f"more than {MAX_LIST_PAGES} pages"):
        lister(client)._list_once(None)
    assert client.calls == MAX_LIST_PAGES


@pytest.mark.parametrize(
    ("shards", "message"),
    [
        ([{"ShardId": "shardId-000000000001"}], "cannot read.*SequenceNumberRange"),
        (["shardId-000000000001"], "cannot read.*mapping"),
        ([entry(1), entry(1, start="7")], "shardId-000000000001 listed twice, differently"),
    ],
)
def test_a_shard_the_listing_cannot_read_is_a_malformed_answer(
    shards: list[Any], message: str
) -> None:
    """It raised ValueError, which the worker's shard-sync round did not catch: with several
    streams, the streams after it got no sync or cleanup, and health never showed it."""
    with pytest.raises(MalformedAnswerError, match=message) as raised:
        lister(Pages([{"Shards": shards}]))._list_once(None)
    assert raised.value.retriable


def test_a_shard_listed_twice_alike_is_listed_once() -> None:
    client = Pages([{"Shards": [entry(0)], "NextToken": "t1"}, {"Shards": [entry(0), entry(1)]}])
    assert [s.shard_id for s in lister(client)._list_once(None)] == [
        "shardId-000000000000",
        "shardId-000000000001",
    ]


class Iterators:
    def __init__(self, error: str | None) -> None:
        self.error = error
        self.asked: list[dict[str, Any]] = []

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        self.asked.append(kwargs)
        if self.error:
            raise ClientError({"Error": {"Code": self.error, "Message": "x"}}, "GetShardIterator")
        return {"ShardIterator": "it"}


def test_a_shard_is_gone_only_when_kinesis_says_not_found() -> None:
    gone = Iterators("ResourceNotFoundException")
    assert lister(gone).shard_gone("shardId-000000000007") is True
    assert gone.asked == [{"StreamName": "s", "ShardId": "shardId-000000000007",
                           "ShardIteratorType": "TRIM_HORIZON"}]  # fmt: skip
    assert lister(Iterators(None)).shard_gone("shardId-000000000007") is False
    with pytest.raises(ThrottledError):
        lister(Iterators("ProvisionedThroughputExceededException")).shard_gone("shardId-1")
