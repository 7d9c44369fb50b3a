"""Ranges an executor reads: which records a read keeps, when a pinned read is over, the pin
check, the next range, and the JSON both ways (pure, table-driven)."""

from __future__ import annotations

import dataclasses

import pytest

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.ranges import (
    Pinned,
    RangeEnd,
    RangeMismatchError,
    ReadRange,
    check_pinned,
    next_range,
)


def at(seq: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), sub)


TRIM = ExtendedSequenceNumber("TRIM_HORIZON")
LATEST = ExtendedSequenceNumber("LATEST")


def rng(after: ExtendedSequenceNumber = TRIM, pinned: Pinned | None = None) -> ReadRange:
    return ReadRange("shard-0", "s", {"StreamName": "s"}, "shard-0", after, pinned=pinned)


PIN = Pinned(at(20, 1), at(30, 0), 7)
LAST_ONLY = Pinned(None, at(9), None)  # a piece re-formed from a pending checkpoint


@pytest.mark.parametrize(
    ("range_", "position", "last_kept", "kept"),
    [
        (rng(TRIM), at(1), None, True),  # a starting sentinel keeps everything
        (rng(LATEST), at(1), None, True),
        (rng(at(10)), at(10), None, False),  # the start itself was read before
        (rng(at(10, 2)), at(10, 2), None, False),
        (rng(at(10, 2)), at(10, 3), None, True),  # the rest of a KPL aggregate
        (rng(at(10)), at(11), None, True),
        (rng(at(10)), at(12), at(12), False),  # read twice after an expired iterator
        (rng(at(10)), at(13), at(12), True),
        (rng(TRIM, PIN), at(20, 0), None, False),  # before the pin's first sub-record
        (rng(TRIM, PIN), at(20, 1), None, True),
        (rng(TRIM, PIN), at(30, 0), None, True),
        (rng(TRIM, PIN), at(30, 1), None, False),  # after the pin's last
        (rng(at(25), PIN), at(21), None, True),  # the pin's ends rule, not the start
        (rng(at(5), LAST_ONLY), at(5), None, False),  # re-formed after a crash: the start
        (rng(at(5), LAST_ONLY), at(9), None, True),
        (rng(at(5), LAST_ONLY), at(9, 1), None, False),  # and its last record bound it
    ],
)
def test_which_records_a_read_keeps(
    range_: ReadRange,
    position: ExtendedSequenceNumber,
    last_kept: ExtendedSequenceNumber | None,
    kept: bool,
) -> None:
    assert range_.keeps(position, last_kept) is kept


@pytest.mark.parametrize(
    ("pinned", "position", "past"),
    [(None, at(99), False), (PIN, at(30, 0), False), (PIN, at(30, 1), True), (PIN, at(31), True)],
)
def test_a_pinned_read_is_over_past_its_last_record(
    pinned: Pinned | None, position: ExtendedSequenceNumber, past: bool
) -> None:
    assert rng(TRIM, pinned).past_pin(position) is past


def end(first: ExtendedSequenceNumber | None, last: ExtendedSequenceNumber | None, rows: int,
        **kw: object) -> RangeEnd:  # fmt: skip
    return RangeEnd("shard-0", first, last, rows, rows * 10, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("found", "ok"),
    [
        (end(at(20, 1), at(30), 7), True),
        (end(at(20, 1), at(30), 8), False),  # one more record between the ends
        (end(at(20, 1), at(29), 6), False),  # stopped short
        (end(at(21), at(30), 6), False),  # the first records trimmed away
        (end(None, None, 0), False),
    ],
)
def test_a_pinned_read_must_find_exactly_its_pin(found: RangeEnd, ok: bool) -> None:
    if ok:
        check_pinned(rng(TRIM, PIN), found)
    else:
        with pytest.raises(RangeMismatchError, match="read again gave") as raised:
            check_pinned(rng(TRIM, PIN), found)
        assert not raised.value.retriable


@pytest.mark.parametrize(
    ("found", "ok"),
    [
        (end(at(6), at(9), 3), True),  # how many is not known: the last record must match
        (end(at(6), at(8), 2), False),
        (end(None, None, 0), False),  # gone (trimmed)
    ],
)
def test_a_range_re_formed_after_a_crash_must_reach_its_last_record(
    found: RangeEnd, ok: bool
) -> None:
    if ok:
        check_pinned(rng(at(5), LAST_ONLY), found)
    else:
        with pytest.raises(RangeMismatchError):
            check_pinned(rng(at(5), LAST_ONLY), found)


def test_an_unpinned_read_is_not_checked() -> None:
    check_pinned(rng(), end(at(1), at(2), 2))


@pytest.mark.parametrize(
    ("found", "after", "iterator"),
    [
        (end(at(5), at(9), 3, next_iterator="it-1"), at(9), "it-1"),
        (end(None, None, 0, next_iterator="it-2"), LATEST, "it-2"),  # nothing: keep the start
    ],
)
def test_the_next_range_starts_after_what_was_found(
    found: RangeEnd, after: ExtendedSequenceNumber, iterator: str
) -> None:
    first = dataclasses.replace(rng(LATEST, PIN), max_records=123, delay=0.2)
    nxt = next_range(first, found)
    assert (nxt.after, nxt.iterator, nxt.pinned, nxt.max_records) == (after, iterator, None, 123)
    assert nxt.delay == 0.0  # the first range's wait was its own


@pytest.mark.parametrize(
    ("first", "last", "rows"),
    [
        (at(1), None, 1),
        (None, at(1), 1),
        (None, None, 2),
        (at(1), at(2), 0),
        (at(3), at(2), 2),
        (None, None, None),  # without a count, the last record is named
    ],
)
def test_a_pin_names_both_ends_or_none_in_order(
    first: ExtendedSequenceNumber | None, last: ExtendedSequenceNumber | None, rows: int | None
) -> None:
    with pytest.raises(ValueError, match="pin"):
        Pinned(first, last, rows)


def test_a_range_needs_budgets_and_a_start_before_the_end() -> None:
    with pytest.raises(ValueError, match="budgets"):
        dataclasses.replace(rng(), max_records=0)
    for bad in ({"max_seconds": 0.0}, {"max_seconds": float("nan")}, {"max_seconds": float("inf")},
                {"read_rate": float("inf")}, {"read_rate": float("nan")}, {"delay": -0.1},
                {"delay": float("nan")}, {"delay": float("inf")}):  # fmt: skip
        with pytest.raises(ValueError, match="finite budgets"):  # its JSON would carry null
            dataclasses.replace(rng(), **bad)
    with pytest.raises(ValueError, match="SHARD_END"):
        rng(ExtendedSequenceNumber("SHARD_END"))


@pytest.mark.parametrize(
    "range_",
    [
        rng(),
        rng(at(7, 3), PIN),
        rng(TRIM, Pinned(None, None, 0, shard_ended=True)),
        rng(at(2), LAST_ONLY),
        dataclasses.replace(
            rng(ExtendedSequenceNumber("AT_TIMESTAMP")),
            timestamp=1_700_000_000.5,
            hash_range=(0, 2**128 - 1),
            iterator="abc",
            kpl=False,
            stream_arg={"StreamARN": "arn:aws:kinesis:us-east-1:000000000000:stream/s"},
            delay=0.25,
        ),
    ],
)
def test_a_range_survives_its_json(range_: ReadRange) -> None:
    assert ReadRange.from_json(range_.to_json()) == range_


def test_an_end_survives_its_json() -> None:
    found = end(
        at(1, 2),
        at(3),
        4,
        millis_behind_latest=0,
        shard_ended=True,
        child_shards=({"ShardId": "shard-1", "ParentShards": ["shard-0"]},),
        next_iterator=None,
        calls=3,
        throttled=1,
        error="RangeMismatchError: x",
    )
    assert RangeEnd.from_json(found.to_json()) == found
    assert found.pin == Pinned(at(1, 2), at(3), 4, shard_ended=True)


def test_a_range_not_deaggregated_after_a_sub_record_has_a_window_for_the_whole_aggregate() -> None:
    """kpl = false after a checkpoint at sub-record 5 of aggregate 100: as (100, 0) it was at or
    before the checkpoint, dropped, and its sub-records 6 on never given. The reader widens its
    window to it once it sees the aggregate has sub-records after 5 (test_range_reader)."""
    import dataclasses

    part_way = dataclasses.replace(rng(ExtendedSequenceNumber("100", 5)), kpl=False)
    assert part_way.window().keeps((100, 0), None) is False  # until the reader knows
    whole = part_way.whole_window()
    assert whole is not None and whole.keeps((100, 0), None) and not whole.keeps((99, 0), None)
    assert rng(ExtendedSequenceNumber("100", 5)).whole_window() is None  # deaggregated
    assert dataclasses.replace(rng(ExtendedSequenceNumber("100")), kpl=False).whole_window() is None
