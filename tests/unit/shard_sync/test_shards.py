"""The Shard and ChildShard values built from boto3 entries, and hash-key-space coverage checks."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint.lease import MAX_HASH_KEY, HashKeyRange
from shard_sync.shards import (
    FULL_HASH_RANGE,
    ChildShard,
    Shard,
    find_hash_range_holes,
    find_hash_range_overlaps,
    is_exact_partition,
)

M = MAX_HASH_KEY
# Real Kinesis sequence numbers are 56 digits: far past 64-bit integers.
START = "49590338271490256608559692538361571095921575989136588898"
END = "49590338271490256608559692540925702759324208523137515618"


def entry(**overrides: Any) -> dict[str, Any]:
    """A closed merge child in the boto3 ListShards shape; ``None`` removes a key."""
    base: dict[str, Any] = {
        "ShardId": "shardId-000000000002",
        "ParentShardId": "shardId-000000000000",
        "AdjacentParentShardId": "shardId-000000000001",
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(M)},
        "SequenceNumberRange": {"StartingSequenceNumber": START, "EndingSequenceNumber": END},
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_from_api_reads_every_field() -> None:
    shard = Shard.from_api(entry())
    assert shard == Shard(
        shard_id="shardId-000000000002",
        parent_shard_id="shardId-000000000000",
        adjacent_parent_shard_id="shardId-000000000001",
        hash_key_range=FULL_HASH_RANGE,
        starting_sequence_number=START,
        ending_sequence_number=END,
    )
    assert not shard.is_open
    assert shard.parent_ids == ("shardId-000000000000", "shardId-000000000001")
    assert shard.starting_sequence_int == int(START)


@pytest.mark.parametrize(
    ("parent", "adjacent", "expected"),
    [
        (None, None, ()),
        ("shardId-a", None, ("shardId-a",)),
        (None, "shardId-b", ("shardId-b",)),
        ("shardId-a", "shardId-b", ("shardId-a", "shardId-b")),
    ],
)
def test_parent_ids_skip_missing_parents(
    parent: str | None, adjacent: str | None, expected: tuple[str, ...]
) -> None:
    shard = Shard.from_api(entry(ParentShardId=parent, AdjacentParentShardId=adjacent))
    assert shard.parent_ids == expected


def test_open_shard_has_no_ending_sequence_number() -> None:
    shard = Shard.from_api(entry(SequenceNumberRange={"StartingSequenceNumber": START}))
    assert shard.is_open
    assert shard.ending_sequence_number is None


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (entry(ShardId=None), "without a ShardId"),
        (entry(ShardId=""), "without a ShardId"),
        (entry(SequenceNumberRange=None), "shardId-000000000002: missing or malformed Sequence"),
        (entry(SequenceNumberRange={}), "shardId-000000000002: .*StartingSequenceNumber"),
        (entry(SequenceNumberRange={"StartingSequenceNumber": "12a"}), "shardId-000000000002"),
        (
            entry(
                SequenceNumberRange={"StartingSequenceNumber": "1", "EndingSequenceNumber": "-5"}
            ),
            "shardId-000000000002",
        ),
        (entry(SequenceNumberRange={"StartingSequenceNumber": 12}), "shardId-000000000002"),
        (entry(HashKeyRange=None), "shardId-000000000002: missing or malformed HashKeyRange"),
        (entry(HashKeyRange={"StartingHashKey": "0"}), "shardId-000000000002: EndingHashKey"),
        (
            entry(HashKeyRange={"StartingHashKey": "x", "EndingHashKey": "1"}),
            "shardId-000000000002: StartingHashKey",
        ),
        (
            entry(HashKeyRange={"StartingHashKey": "-1", "EndingHashKey": "1"}),
            "shardId-000000000002",
        ),
        (
            entry(HashKeyRange={"StartingHashKey": "0", "EndingHashKey": str(M + 1)}),
            "shardId-000000000002: bad hash key range",
        ),
        (
            entry(HashKeyRange={"StartingHashKey": "9", "EndingHashKey": "3"}),
            "shardId-000000000002: bad hash key range",
        ),
        (entry(ParentShardId=7), "shardId-000000000002: parent_shard_id"),
        (entry(AdjacentParentShardId=""), "shardId-000000000002: adjacent_parent_shard_id"),
    ],
)
def test_malformed_entries_raise_value_error_naming_the_shard(
    bad: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Shard.from_api(bad)


def test_non_mapping_entry_is_rejected() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        Shard.from_api(["shardId-1"])  # type: ignore[arg-type]


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(ValueError, match="shardId-x"):
        Shard("shardId-x", None, None, FULL_HASH_RANGE, "not-a-number")


def test_child_shard_from_api() -> None:
    kid = ChildShard.from_api(
        {
            "ShardId": "shardId-3",
            "ParentShards": ["shardId-1", "shardId-2"],
            "HashKeyRange": {"StartingHashKey": "5", "EndingHashKey": "10"},
        }
    )
    assert kid == ChildShard("shardId-3", ("shardId-1", "shardId-2"), HashKeyRange(5, 10))
    no_parents = ChildShard.from_api(
        {"ShardId": "shardId-3", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"}}
    )
    assert no_parents.parent_shard_ids == ()


@pytest.mark.parametrize(
    ("ranges", "holes"),
    [
        ([(0, M)], []),
        ([], [(0, M)]),
        ([(0, 99), (100, M)], []),
        ([(100, M), (0, 99)], []),  # any order
        ([(0, 99), (150, M)], [(100, 149)]),
        ([(10, 99), (100, M - 5)], [(0, 9), (M - 4, M)]),
        ([(0, 199), (100, 299), (300, M)], []),  # overlaps are not holes
        ([(0, 500), (100, 200), (501, M)], []),  # a range inside another
        ([(0, 0), (2, 2), (4, M)], [(1, 1), (3, 3)]),
    ],
)
def test_find_hash_range_holes(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> None:
    found = find_hash_range_holes(HashKeyRange(*r) for r in ranges)
    assert found == [HashKeyRange(*h) for h in holes]


@pytest.mark.parametrize(
    ("ranges", "overlaps", "exact"),
    [
        ([(0, M)], [], True),
        ([(0, 99), (100, M)], [], True),
        ([(0, 99), (150, M)], [], False),  # a hole
        ([(0, 199), (100, 299), (300, M)], [(100, 199)], False),
        ([(0, 500), (100, 200), (150, 250), (501, M)], [(100, 250)], False),
        ([(0, M), (0, M)], [(0, M)], False),  # a shard listed twice
        ([], [], False),
    ],
)
def test_overlaps_and_exact_partition(
    ranges: list[tuple[int, int]], overlaps: list[tuple[int, int]], exact: bool
) -> None:
    values = [HashKeyRange(*r) for r in ranges]
    assert find_hash_range_overlaps(values) == [HashKeyRange(*o) for o in overlaps]
    assert is_exact_partition(iter(values)) is exact
