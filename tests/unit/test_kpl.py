"""KPL deaggregation, pure: round trips through the aggregator, sub-sequence numbers, resuming
inside an aggregate, hash-range filtering, corrupt aggregates (never an exception)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from typing import Any

import pytest

from checkpoint.lease import MAX_HASH_KEY, HashKeyRange
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.processor import Record
from kclpy_spark.retrieval.kpl import (
    MAGIC,
    CorruptPolicy,
    Deaggregator,
    KplCounters,
    deaggregate,
    partition_key_hash,
    skip_through,
)
from kclpy_spark.retrieval.kpl_aggregate import UserRecord, aggregate, aggregate_body, put_entry
from kclpy_spark.retrieval.polling import FetchedBatch, PollingFetcher

HALF = 2**127

# Made by awslabs' aws-kinesis-agg 1.2.3 (AggRecord.add_user_record + get_contents) from the input:
# our decoder reads the reference aggregator's bytes, and our aggregator writes the same bytes.
GOLDEN_INPUT = [
    UserRecord("alpha", b"one"),
    UserRecord("beta", b"two", "170141183460469231731687303715884105728"),
    UserRecord("alpha", b""),
    UserRecord("gamma", b"\x00\xff" * 100, "5"),
]
GOLDEN_HEX = (
    "f3899ac20a05616c7068610a04626574610a0567616d6d6112273137303134313138333436303436393233313733"
    "313638373330333731353838343130353732381201351a0708001a036f6e651a09080110001a0374776f1a040800"
    "1a001acf01080210011ac801" + "00ff" * 100 + "86175a54b017d3a2a6e9e2e951249257"
)


def agg_record(
    users: list[UserRecord], seq: str = "100", millis: int = 1_700_000_000_000
) -> Record:
    return Record(aggregate(users), users[0].partition_key if users else "k", seq, 0, millis)


def plain(seq: str, data: bytes = b"plain") -> Record:
    return Record(data, "pk", seq, 0, 5)


def with_digest(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


def keys_by_half(n: int) -> tuple[list[str], list[str]]:
    """Partition keys whose MD5 hash falls in the lower / upper half of the hash space."""
    low = [k for k in (f"key-{i}" for i in range(200)) if partition_key_hash(k) < HALF][:n]
    high = [k for k in (f"key-{i}" for i in range(200)) if partition_key_hash(k) >= HALF][:n]
    return low, high


def summary(records: list[Record]) -> list[tuple[str, int, str, bytes]]:
    return [
        (r.sequence_number, r.sub_sequence_number, r.partition_key, r.binary_data) for r in records
    ]


# --- format -------------------------------------------------------------------------------------


def test_reads_the_reference_aggregators_bytes_and_writes_the_same() -> None:
    golden = bytes.fromhex(GOLDEN_HEX)
    assert aggregate(GOLDEN_INPUT) == golden
    out = deaggregate([Record(golden, "alpha", "7", 0, 9)], hash_range=None, after=None)
    assert summary(out) == [("7", i, u.partition_key, u.data) for i, u in enumerate(GOLDEN_INPUT)]
    assert all(r.timestamp_millis == 9 for r in out)


@pytest.mark.parametrize(
    ("count", "size", "keys"),
    [
        (1, 10, 1),
        (5, 0, 2),
        (100, 100, 50),
        (300, 3, 200),  # partition key indexes above 127: two-byte varints
        (3, 20_000, 3),  # data longer than 16383 bytes: three-byte lengths
    ],
)
def test_round_trip_gives_each_user_record_its_index_as_sub_sequence_number(
    count: int, size: int, keys: int
) -> None:
    rng = random.Random(count)
    users = [UserRecord(f"pk-{i % keys}", rng.randbytes(size)) for i in range(count)]
    out = deaggregate([agg_record(users, "4242")], hash_range=None, after=None)
    assert summary(out) == [("4242", i, u.partition_key, u.data) for i, u in enumerate(users)]


def test_plain_records_pass_through_unchanged_and_in_order() -> None:
    users = [UserRecord("a", b"1"), UserRecord("b", b"2")]
    records = [plain("1"), agg_record(users, "2"), plain("3", MAGIC[:3] + b"x"), plain("4", b"")]
    counters = KplCounters()
    out = deaggregate(records, hash_range=None, after=None, counters=counters)
    assert out[0] is records[0] and out[3] is records[2] and out[4] is records[3]
    assert [(r.sequence_number, r.sub_sequence_number) for r in out] == [
        ("1", 0),
        ("2", 0),
        ("2", 1),
        ("3", 0),
        ("4", 0),
    ]
    assert counters == KplCounters(aggregates=1, sub_records=2)


def test_an_aggregate_of_no_records_yields_none() -> None:
    """A key table and no records (an empty one, 20 bytes, is a plain record: below)."""
    counters = KplCounters()
    empty = Record(with_digest(b"\x0a\x01a"), "pk", "100")
    out = deaggregate([empty, plain("101")], hash_range=None, after=None, counters=counters)
    assert summary(out) == [("101", 0, "pk", b"plain")]
    assert counters.aggregates == 1 and counters.sub_records == 0 and counters.corrupt == 0


def test_tags_and_unknown_fields_are_skipped() -> None:
    users = [UserRecord("a", b"x", tags=(("t", "v"),)), UserRecord("b", b"y", "12")]
    body = aggregate_body(users) + b"\x78\x96\x01"  # field 15 (varint 150): unknown
    out = deaggregate([Record(with_digest(body), "a", "1")], hash_range=None, after=None)
    assert summary(out) == [("1", 0, "a", b"x"), ("1", 1, "b", b"y")]


def test_put_entry_routes_by_the_first_user_records_hash_key() -> None:
    entry = put_entry([UserRecord("a", b"x"), UserRecord("b", b"y")])
    assert entry["PartitionKey"] == "a"
    assert entry["ExplicitHashKey"] == str(partition_key_hash("a"))
    assert put_entry([UserRecord("a", b"x", "77")])["ExplicitHashKey"] == "77"
    with pytest.raises(ValueError):
        put_entry([])


# --- resuming inside an aggregate ---------------------------------------------------------------


def test_resume_skips_sub_records_at_or_before_the_checkpoint() -> None:
    users = [UserRecord(f"k{i}", bytes([i])) for i in range(6)]
    records = [agg_record(users, "500"), plain("501")]
    counters = KplCounters()
    out = deaggregate(
        records,
        hash_range=None,
        after=ExtendedSequenceNumber("500", 2),
        counters=counters,
    )
    assert [(r.sequence_number, r.sub_sequence_number) for r in out] == [
        ("500", 3),
        ("500", 4),
        ("500", 5),
        ("501", 0),
    ]
    assert counters.skipped_resumed == 3


def test_resume_at_the_last_sub_record_delivers_nothing_of_that_aggregate() -> None:
    users = [UserRecord("a", b"1"), UserRecord("a", b"2")]
    out = deaggregate(
        [agg_record(users, "9")], hash_range=None, after=ExtendedSequenceNumber("9", 1)
    )
    assert out == []


@pytest.mark.parametrize("after", [None, TRIM_HORIZON])
def test_no_checkpoint_or_a_sentinel_skips_nothing(after: ExtendedSequenceNumber | None) -> None:
    out = deaggregate([agg_record([UserRecord("a", b"1")], "9")], hash_range=None, after=after)
    assert len(out) == 1


def test_skip_through_drops_plain_records_up_to_the_checkpoint() -> None:
    records = [plain("10"), plain("11"), plain("12")]
    assert skip_through(records, ExtendedSequenceNumber("11")) == records[2:]
    assert skip_through(records, ExtendedSequenceNumber("11", 4)) == records[2:]
    assert skip_through(records, None) is records


def test_an_aggregate_checkpointed_part_way_is_given_whole_when_not_deaggregated() -> None:
    """kpl_deaggregation = false after a worker that deaggregated (a Java KCL, or this one with
    it on) checkpointed at sub-record 5 of 10: the aggregate counted as (S, 0), at or before the
    checkpoint, and was dropped; sub-records 6 to 9 were never given, whole or split. One
    checkpointed at its last sub-record is done: not given again (a checkpoint at it would then
    be refused as going back, and the lease stalled)."""
    users = [UserRecord(f"k{i}", f"v{i}".encode()) for i in range(10)]
    aggregate, later = agg_record(users, "100"), plain("101")
    part_way = ExtendedSequenceNumber("100", 5)
    assert skip_through([aggregate, later], part_way, whole=True) == [aggregate, later]
    assert skip_through([aggregate, later], part_way) == [later]  # split: deaggregate's own
    done = ExtendedSequenceNumber("100", 9)
    assert skip_through([aggregate, later], done, whole=True) == [later]
    assert skip_through([aggregate, later], ExtendedSequenceNumber("100"), whole=True) == [later]
    assert skip_through([plain("100"), later], part_way, whole=True) == [later]


# --- hash-range filtering -----------------------------------------------------------------------


def test_an_aggregate_with_a_sub_record_outside_the_range_is_skipped_whole() -> None:
    """As the KCL (AggregatorUtil.deaggregate): the KPL puts every user record of an aggregate
    that reached the wrong shard again, each to its own shard; delivering its in-range ones
    from here too delivered them twice."""
    users = [
        UserRecord("a", b"in-low", str(HALF - 1)),
        UserRecord("b", b"out", str(HALF)),
        UserRecord("c", b"in-zero", "0"),
        UserRecord("d", b"out-max", str(MAX_HASH_KEY)),
    ]
    counters = KplCounters()
    routed_well = [UserRecord("e", b"in", "7"), UserRecord("f", b"in-too", str(HALF - 2))]
    out = deaggregate(
        [agg_record(users, "3"), agg_record(routed_well, "4")],
        hash_range=HashKeyRange(0, HALF - 1),
        after=None,
        counters=counters,
    )
    assert [(r.sequence_number, r.sub_sequence_number, r.binary_data) for r in out] == [
        ("4", 0, b"in"),
        ("4", 1, b"in-too"),
    ]
    assert counters.skipped_out_of_range == 4 and counters.sub_records == 2


def test_skipped_sub_records_are_logged_once_an_aggregate_and_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 14, finding 10: the KCL's rule, but never silent: a WARNING naming the shard, the
    aggregate's sequence number, how many were skipped and the first one's hash key, and a count
    for the metric. One line an aggregate: a line a sub-record flooded the log (983 lines for
    one record of a producer aggregating across shards)."""
    users = [
        UserRecord("a", b"in", "0"),
        UserRecord("b", b"out", str(HALF)),
        UserRecord("c", b"out-too", str(MAX_HASH_KEY)),
    ]
    reported: list[int] = []
    deagg = Deaggregator(
        HashKeyRange(0, HALF - 1), shard_id="shardId-000000000007", on_out_of_range=reported.append
    )
    caplog.set_level(logging.WARNING, logger="kclpy_spark.retrieval.kpl")
    out = deagg([agg_record(users, "77")], None)
    assert out == []  # skipped whole
    assert reported == [3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "shardId-000000000007" in warnings[0] and "2 of the 3" in warnings[0]
    assert " 77 " in warnings[0] and f"the first, 1, has explicit hash key {HALF}" in warnings[0]


def test_without_an_explicit_key_the_partition_key_md5_decides() -> None:
    low, high = keys_by_half(3)
    upper = HashKeyRange(HALF, MAX_HASH_KEY)
    highs = [UserRecord(k, k.encode()) for k in high]
    out = deaggregate([agg_record(highs)], hash_range=upper, after=None)
    assert [r.partition_key for r in out] == high
    assert [r.sub_sequence_number for r in out] == [0, 1, 2]
    mixed = [UserRecord(k, k.encode()) for k in (*high, low[0])]
    assert deaggregate([agg_record(mixed)], hash_range=upper, after=None) == []


def test_an_explicit_key_wins_over_the_partition_key() -> None:
    low, high = keys_by_half(1)
    upper = HashKeyRange(HALF, MAX_HASH_KEY)
    kept = [UserRecord(low[0], b"kept", str(HALF + 5))]
    out = deaggregate([agg_record(kept)], hash_range=upper, after=None)
    assert [r.binary_data for r in out] == [b"kept"]
    gone = [UserRecord(high[0], b"gone", "1")]
    assert deaggregate([agg_record(gone)], hash_range=upper, after=None) == []


@pytest.mark.parametrize("hash_range", [None, HashKeyRange(0, MAX_HASH_KEY)])
def test_no_range_or_the_full_range_filters_nothing(hash_range: HashKeyRange | None) -> None:
    low, high = keys_by_half(2)
    users = [UserRecord(k, b"") for k in low + high]
    assert len(deaggregate([agg_record(users)], hash_range=hash_range, after=None)) == 4


def test_plain_records_are_never_filtered_by_hash_range() -> None:
    _, high = keys_by_half(1)
    record = Record(b"x", high[0], "1")
    assert deaggregate([record], hash_range=HashKeyRange(0, 10), after=None) == [record]


# --- corrupt aggregates -------------------------------------------------------------------------


def corrupt_variants() -> dict[str, bytes]:
    good = aggregate([UserRecord("a", b"1"), UserRecord("b", b"2")])
    body = good[4:-16]
    return {
        "bad md5": good[:-1] + bytes([good[-1] ^ 1]),
        "truncated protobuf": with_digest(body[:-2]),
        "index outside table": with_digest(b"\x0a\x01a" + b"\x1a\x05\x08\x05\x1a\x01x"),
        "missing data": with_digest(b"\x0a\x01a" + b"\x1a\x02\x08\x00"),
        "wrong wire type": with_digest(b"\x08\x01"),
        "bad ehk": with_digest(b"\x0a\x01a\x12\x02zz" + b"\x1a\x07\x08\x00\x10\x00\x1a\x01x"),
        "group wire type": with_digest(b"\x0a\x01a\x7b"),
    }


@pytest.mark.parametrize("name", sorted(corrupt_variants()))
def test_a_corrupt_aggregate_is_delivered_whole_with_a_warning(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    blob = corrupt_variants()[name]
    raw = Record(blob, "a", "77", 0, 1)
    counters = KplCounters()
    with caplog.at_level(logging.WARNING, logger="kclpy_spark.retrieval.kpl"):
        out = deaggregate(
            [raw, plain("78")],
            hash_range=HashKeyRange(0, HALF),
            after=None,
            counters=counters,
        )
    assert out[0] is raw and out[0].sub_sequence_number == 0
    assert [r.sequence_number for r in out] == ["77", "78"]
    assert counters.corrupt == 1 and counters.aggregates == 0
    assert any("77" in m and "not a valid aggregate" in m for m in caplog.messages)


@pytest.mark.parametrize(
    "blob",
    [MAGIC, MAGIC + b"\x00" * 5, MAGIC + hashlib.md5(b"").digest(), MAGIC + b"\x01" * 16],
    ids=["magic alone", "5 bytes after", "an empty aggregate", "16 bytes after"],
)
def test_magic_bytes_with_no_more_than_a_digest_after_them_are_a_plain_record(
    blob: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """As the KCL's deaggregation: not an aggregate (no warning, not counted), delivered whole
    whatever the corrupt-record policy (an empty aggregate was dropped)."""
    raw = Record(blob, "a", "77")
    deagg = Deaggregator(policy=CorruptPolicy.DROP)
    with caplog.at_level(logging.WARNING, logger="kclpy_spark.retrieval.kpl"):
        assert deagg([raw, plain("78")], None) == [raw, plain("78")]
    assert deagg.counters.corrupt == 0 and deagg.counters.aggregates == 0 and not caplog.messages


def test_the_drop_policy_delivers_nothing_of_a_corrupt_aggregate() -> None:
    raw = Record(corrupt_variants()["bad md5"], "a", "77")
    deagg = Deaggregator(policy=CorruptPolicy.DROP)
    assert deagg([raw, plain("78")], None) == [plain("78")]
    assert deagg.counters.corrupt == 1


def test_an_aggregate_is_delivered_whole_or_not_at_all() -> None:
    # The second record's index is bad: nothing of the aggregate is split out, the raw one goes.
    body = b"\x0a\x01a" + b"\x1a\x05\x08\x00\x1a\x01x" + b"\x1a\x05\x08\x09\x1a\x01y"
    raw = Record(with_digest(body), "a", "5")
    assert deaggregate([raw], hash_range=None, after=None) == [raw]


def test_mutated_aggregates_never_raise() -> None:
    rng = random.Random(8)
    users = [UserRecord(f"k{i % 3}", rng.randbytes(rng.randrange(0, 300)), None) for i in range(9)]
    users.append(UserRecord("e", b"z", "123"))
    body = aggregate_body(users)
    for _ in range(2000):
        mutated = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        if rng.random() < 0.3:
            mutated = mutated[: rng.randrange(len(mutated))]
        blob = with_digest(bytes(mutated))
        out = deaggregate([Record(blob, "k", "1")], hash_range=HashKeyRange(0, HALF), after=None)
        assert all(isinstance(r, Record) for r in out)


def test_a_deaggregator_keeps_running_totals() -> None:
    deagg = Deaggregator(hash_range=HashKeyRange(0, HALF - 1))
    users = [UserRecord("a", b"1", "1"), UserRecord("b", b"2", str(HALF))]
    deagg([agg_record(users, "1")], None)
    deagg([agg_record(users, "2"), plain("3")], ExtendedSequenceNumber("1", 5))
    assert deagg.counters == KplCounters(aggregates=2, sub_records=0, skipped_out_of_range=4)


# --- wiring: the polling fetcher deaggregates and resumes inside an aggregate ---------------------


class ScriptedKinesis:
    """GetShardIterator / GetRecords answers in order (no network)."""

    def __init__(self, pages: list[dict[str, object]]) -> None:
        self.pages = pages
        self.iterator_requests: list[dict[str, object]] = []

    async def get_shard_iterator(self, **kw: object) -> dict[str, object]:
        self.iterator_requests.append(kw)
        return {"ShardIterator": "it"}

    async def get_records(self, **kw: object) -> dict[str, object]:
        return self.pages.pop(0)


def test_polling_fetcher_deaggregates_from_a_sub_sequence_checkpoint() -> None:
    blob = aggregate([UserRecord(f"k{i}", bytes([i])) for i in range(5)])
    entry = {"PartitionKey": "k0", "ApproximateArrivalTimestamp": None}
    kinesis = ScriptedKinesis(
        [
            {
                "Records": [
                    {**entry, "Data": blob, "SequenceNumber": "70"},
                    {**entry, "Data": b"p", "SequenceNumber": "71"},
                ],
                "NextShardIterator": "next",
                "MillisBehindLatest": 0,
            },
            {"Records": [], "NextShardIterator": None, "ChildShards": [{"ShardId": "s-1"}]},
        ]
    )
    queue: asyncio.Queue[FetchedBatch] = asyncio.Queue()
    deagg = Deaggregator()

    async def no_sleep(_: float) -> None:
        return None

    fetcher = PollingFetcher(
        kinesis,
        {"StreamName": "s"},
        "shardId-000000000000",
        ExtendedSequenceNumber("70", 2),
        InitialPosition.trim_horizon(),
        queue,
        sleep=no_sleep,
        deaggregator=deagg,
    )
    asyncio.run(fetcher.run())
    assert kinesis.iterator_requests[0]["ShardIteratorType"] == "AT_SEQUENCE_NUMBER"
    first, last = queue.get_nowait(), queue.get_nowait()
    assert [(r.sequence_number, r.sub_sequence_number) for r in first.records] == [
        ("70", 3),
        ("70", 4),
        ("71", 0),
    ]
    assert last.shard_ended and not last.records
    assert deagg.counters == KplCounters(aggregates=1, sub_records=5, skipped_resumed=3)


def test_a_page_of_aggregates_is_split_off_the_event_loop_and_a_plain_page_on_it() -> None:
    """Splitting a page of large aggregates took a quarter of a second and more on the event loop,
    which every other shard's reads and the worker's lease calls wait for."""
    import threading

    from kclpy_spark.retrieval.source import RecordFilter

    threads: list[threading.Thread] = []

    class Watched(Deaggregator):
        def __call__(self, records: list[Record], after: Any) -> list[Record]:
            threads.append(threading.current_thread())
            return super().__call__(records, after)

    loop_thread: list[threading.Thread] = []

    async def both() -> tuple[list[Record], list[Record]]:
        loop_thread.append(threading.current_thread())
        split = RecordFilter(TRIM_HORIZON, Watched())
        aggregated = await split.on_loop_or_thread([agg_record(GOLDEN_INPUT)])
        plain_page = await split.on_loop_or_thread([plain("200")])
        return aggregated, plain_page

    aggregated, plain_page = asyncio.run(both())
    assert [r.binary_data for r in aggregated] == [u.data for u in GOLDEN_INPUT]
    assert [r.sequence_number for r in plain_page] == ["200"]
    assert threads[0] is not loop_thread[0] and threads[1] is loop_thread[0]
