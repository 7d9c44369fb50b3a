"""DynamoDB's sizing rules for items and capacity units, and the meter's totals."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint.stores.capacity import (
    CapacityMeter,
    Usage,
    item_size,
    read_units,
    split_units,
    write_units,
)


@pytest.mark.parametrize(
    ("item", "size"),
    [
        ({}, 0),
        ({"leaseKey": {"S": "shardId-0"}}, 8 + 9),
        ({"k": {"S": "é"}}, 1 + 2),  # UTF-8 bytes, not characters
        ({"n": {"N": "7"}}, 1 + 2),  # one digit: one byte per two digits, plus one
        ({"n": {"N": "12345"}}, 1 + 4),
        ({"n": {"N": "1200.00"}}, 1 + 2),  # leading and trailing zeros do not count
        ({"n": {"N": "-0.5"}}, 1 + 2),
        ({"b": {"B": b"abc"}}, 1 + 3),
        ({"t": {"BOOL": True}, "z": {"NULL": True}}, 2 + 2),
        ({"ss": {"SS": ["a", "bc"]}}, 2 + 3),
        ({"ns": {"NS": ["1", "22"]}}, 2 + 2 + 2),
        ({"bs": {"BS": [b"ab", b"c"]}}, 2 + 3),
        ({"l": {"L": [{"S": "ab"}, {"N": "1"}]}}, 1 + 3 + (1 + 2) + (1 + 2)),
        ({"m": {"M": {"ab": {"S": "c"}}}}, 1 + 3 + 1 + 2 + 1),
    ],
)
def test_item_size_follows_dynamodbs_rules(item: dict[str, Any], size: int) -> None:
    assert item_size(item) == size


def test_an_unknown_attribute_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown DynamoDB attribute type"):
        item_size({"x": {"Q": 1}})


@pytest.mark.parametrize(
    ("sizes", "consistent", "units"),
    [
        ([], True, 1.0),  # an absent item still costs a read
        ([0], True, 1.0),
        ([4096], True, 1.0),
        ([4097], True, 2.0),
        ([300] * 30, True, 3.0),  # a page: the sum, rounded once (9,000 bytes)
        ([300] * 30, False, 1.5),
        ([100], False, 0.5),
    ],
)
def test_read_units(sizes: list[int], consistent: bool, units: float) -> None:
    assert read_units(sizes, consistent=consistent) == units


@pytest.mark.parametrize(
    ("before", "after", "units"),
    [(0, 0, 1.0), (0, 300, 1.0), (1024, 1024, 1.0), (1025, 10, 2.0), (10, 3000, 3.0)],
)
def test_write_units_count_the_larger_item(before: int, after: int, units: float) -> None:
    assert write_units(before, after) == units


def test_meter_totals_reads_and_writes_apart() -> None:
    meter = CapacityMeter()
    meter.add_consumed("UpdateItem", {"ConsumedCapacity": {"CapacityUnits": 1.0}})
    meter.add_consumed("UpdateItem", {"ConsumedCapacity": {"CapacityUnits": 2.0}})
    meter.add_consumed("Scan", {"ConsumedCapacity": {"CapacityUnits": 3.0}})
    meter.add_consumed("GetItem", {})  # no capacity reported: a request, no units
    meter.add("PutItem", 1.0)
    assert meter.snapshot() == {
        "UpdateItem": Usage(2, 3.0),
        "Scan": Usage(1, 3.0),
        "GetItem": Usage(1, 0.0),
        "PutItem": Usage(1, 1.0),
    }
    assert split_units(meter.snapshot()) == (3.0, 4.0)
