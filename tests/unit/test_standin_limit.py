"""The stand-in Kinesis endpoint of the benchmarks (bench/standin_server.py) honours GetRecords'
``Limit`` in a finite stream, as Kinesis does: reading on the executors asks each lease's share
of a round's budget, and served whole pages a range read more than Kinesis would give it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from standin_server import StandIn, synthetic_body


def _get(standin: StandIn, iterator: str, limit: int | None = None) -> dict[str, object]:
    request = {"ShardIterator": iterator, **({"Limit": limit} if limit else {})}
    chunks = standin.answer("Kinesis_20131202.GetRecords", json.dumps(request).encode())
    return json.loads(b"".join(chunks))  # type: ignore[no-any-return]


def _iterator(standin: StandIn, **asked: str) -> str:
    request = json.dumps({"ShardId": "shardId-000000000000", **asked}).encode()
    chunks = standin.answer("Kinesis_20131202.GetShardIterator", request)
    return str(json.loads(b"".join(chunks))["ShardIterator"])


def test_a_limit_below_a_page_is_honoured_and_the_next_read_goes_on_inside_the_page() -> None:
    standin = StandIn(synthetic_body(10, 50), shards=1, pages=2, read_limit=None)
    iterator, seen, lags = _iterator(standin, ShardIteratorType="TRIM_HORIZON"), [], []
    for limit in (4, 4, 4, 100, 3):
        answer = _get(standin, iterator, limit)
        lags.append(answer["MillisBehindLatest"])
        records = answer["Records"]
        assert isinstance(records, list) and len(records) <= limit
        seen += [r["SequenceNumber"] for r in records]
        iterator = str(answer["NextShardIterator"])
    # 4 + 4 + 2 (the page's end), then page 1 whole, then the tip
    assert len(seen) == 20 and seen == sorted(seen) and len(set(seen)) == 20
    assert lags[:3] == [1000, 1000, 1000]  # behind: a short answer with no lag is the tip
    assert standin.records == 20
    assert _get(standin, iterator, 3)["Records"] == []


def test_an_iterator_after_a_record_inside_a_page_starts_at_the_next_one() -> None:
    standin = StandIn(synthetic_body(10, 50), shards=1, pages=2, read_limit=None)
    first = _get(standin, _iterator(standin, ShardIteratorType="TRIM_HORIZON"), 5)["Records"]
    assert isinstance(first, list)
    after = _iterator(standin, ShardIteratorType="AFTER_SEQUENCE_NUMBER",
                      StartingSequenceNumber=first[-1]["SequenceNumber"])  # fmt: skip
    rest = _get(standin, after)["Records"]
    assert isinstance(rest, list) and len(rest) == 5
    assert rest[0]["SequenceNumber"] > first[-1]["SequenceNumber"]
