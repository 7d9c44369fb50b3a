"""The Shard value (one entry of a ListShards answer) and hash-key-space coverage checks.

A ``Shard`` is built once, at the edge, from the boto3 shape::

    {"ShardId": "shardId-000000000004",
     "ParentShardId": "shardId-000000000001",          # optional
     "AdjacentParentShardId": "shardId-000000000002",  # optional, merges only
     "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1701..."},
     "SequenceNumberRange": {"StartingSequenceNumber": "4959...",
                             "EndingSequenceNumber": "4960..."}}   # absent while open

Everything after that works on validated values, so the graph rules never meet a missing key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from checkpoint.lease import MAX_HASH_KEY, HashKeyRange
from checkpoint.sequence import parse_sequence_number

FULL_HASH_RANGE = HashKeyRange(0, MAX_HASH_KEY)


@dataclass(frozen=True)
class Shard:
    """One shard of a stream, as ListShards describes it.

    ``ending_sequence_number`` is None while the shard is open (still written to); a closed shard
    has one, and its children (from a split or merge) list it as a parent.
    """

    shard_id: str
    parent_shard_id: str | None
    adjacent_parent_shard_id: str | None
    hash_key_range: HashKeyRange
    starting_sequence_number: str
    ending_sequence_number: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.shard_id, str) or not self.shard_id:
            raise ValueError(f"shard id must be a non-empty string, got {self.shard_id!r}")
        for name in ("parent_shard_id", "adjacent_parent_shard_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"shard {self.shard_id}: {name} must be a non-empty string")
        try:
            parse_sequence_number(self.starting_sequence_number)
            if self.ending_sequence_number is not None:
                parse_sequence_number(self.ending_sequence_number)
        except ValueError as exc:
            raise ValueError(f"shard {self.shard_id}: {exc}") from None

    @classmethod
    def from_api(cls, entry: Mapping[str, Any]) -> Shard:
        """Build from one element of ListShards' ``Shards`` list; ValueError naming the shard."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"a shard entry must be a mapping, got {type(entry).__name__}")
        shard_id = entry.get("ShardId")
        if not isinstance(shard_id, str) or not shard_id:
            raise ValueError(f"shard entry without a ShardId: {dict(entry)!r}")
        seq_range = _sub_mapping(entry, "SequenceNumberRange", shard_id)
        starting = seq_range.get("StartingSequenceNumber")
        if starting is None:
            raise ValueError(f"shard {shard_id}: SequenceNumberRange lacks StartingSequenceNumber")
        return cls(
            shard_id=shard_id,
            parent_shard_id=entry.get("ParentShardId"),
            adjacent_parent_shard_id=entry.get("AdjacentParentShardId"),
            hash_key_range=parse_hash_key_range(entry.get("HashKeyRange"), shard_id),
            starting_sequence_number=starting,
            ending_sequence_number=seq_range.get("EndingSequenceNumber"),
        )

    @property
    def is_open(self) -> bool:
        return self.ending_sequence_number is None

    # cached_property stores into the instance __dict__ and so works on a frozen dataclass; the
    # graph walk asks for these once per edge, which at 100k shards is worth not recomputing.
    @cached_property
    def parent_ids(self) -> tuple[str, ...]:
        """The parent and adjacent parent, minus the Nones (a split child has one, a merge two)."""
        return tuple(p for p in (self.parent_shard_id, self.adjacent_parent_shard_id) if p)

    @cached_property
    def starting_sequence_int(self) -> int:
        return int(self.starting_sequence_number)


@dataclass(frozen=True)
class ChildShard:
    """One entry of GetRecords' ``ChildShards``: a shard that replaced the one just finished.

    The boto3 shape is ``{"ShardId", "ParentShards": [...], "HashKeyRange": {...}}``; it carries no
    sequence numbers. A split yields two entries with one parent each, a merge one entry with two.
    """

    shard_id: str
    parent_shard_ids: tuple[str, ...]
    hash_key_range: HashKeyRange

    @classmethod
    def from_api(cls, entry: Mapping[str, Any]) -> ChildShard:
        """ValueError naming the shard when the entry is malformed."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"a child shard entry must be a mapping, got {type(entry).__name__}")
        shard_id = entry.get("ShardId")
        if not isinstance(shard_id, str) or not shard_id:
            raise ValueError(f"child shard entry without a ShardId: {dict(entry)!r}")
        parents = entry.get("ParentShards", [])
        if not isinstance(parents, list | tuple) or not all(
            isinstance(p, str) and p for p in parents
        ):
            raise ValueError(f"child shard {shard_id}: ParentShards must be a list of shard ids")
        return cls(
            shard_id, tuple(parents), parse_hash_key_range(entry.get("HashKeyRange"), shard_id)
        )


def parse_hash_key_range(value: object, shard_id: str) -> HashKeyRange:
    """A boto3 ``HashKeyRange`` mapping as a HashKeyRange; ValueError naming ``shard_id``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"shard {shard_id}: missing or malformed HashKeyRange: {value!r}")
    start, end = value.get("StartingHashKey"), value.get("EndingHashKey")
    for name, key in (("StartingHashKey", start), ("EndingHashKey", end)):
        if not isinstance(key, str) or not key.isascii() or not key.isdigit():
            raise ValueError(f"shard {shard_id}: {name} must be decimal digits, got {key!r}")
    try:
        return HashKeyRange(int(start), int(end))  # type: ignore[arg-type]  # checked just above
    except ValueError as exc:
        raise ValueError(f"shard {shard_id}: {exc}") from None


def _sub_mapping(entry: Mapping[str, Any], key: str, shard_id: str) -> Mapping[str, Any]:
    value = entry.get(key)
    if not isinstance(value, Mapping):
        raise ValueError(f"shard {shard_id}: missing or malformed {key}: {value!r}")
    return value


def find_hash_range_holes(ranges: Iterable[HashKeyRange]) -> list[HashKeyRange]:
    """The parts of 0..2**128-1 that no range covers, in order (empty list = full coverage).

    Overlaps are tolerated and merged, as the KCL's lease auditor does: during a reshard a parent
    and its children can both hold leases for the same keys, and that is not a hole.
    """
    holes: list[HashKeyRange] = []
    covered_to = -1  # highest hash key covered so far by the ranges sorted by start
    for rng in sorted(ranges):
        if rng.start > covered_to + 1:
            holes.append(HashKeyRange(covered_to + 1, rng.start - 1))
        covered_to = max(covered_to, rng.end)
    if covered_to < MAX_HASH_KEY:
        holes.append(HashKeyRange(covered_to + 1, MAX_HASH_KEY))
    return holes


def find_hash_range_overlaps(ranges: Iterable[HashKeyRange]) -> list[HashKeyRange]:
    """The hash keys covered more than once, as merged ranges in order."""
    overlaps: list[HashKeyRange] = []
    covered_to = -1
    for rng in sorted(ranges):
        if rng.start <= covered_to:
            dup = HashKeyRange(rng.start, min(rng.end, covered_to))
            if overlaps and dup.start <= overlaps[-1].end + 1:
                last = overlaps.pop()
                dup = HashKeyRange(last.start, max(last.end, dup.end))
            overlaps.append(dup)
        covered_to = max(covered_to, rng.end)
    return overlaps


def is_exact_partition(ranges: Iterable[HashKeyRange]) -> bool:
    """True when the ranges cover 0..2**128-1 with no hole and no overlap.

    This is the KCL's test of an empty-table listing (each range must start one past the previous
    end): the shards open at one instant always partition the key space, so anything else means the
    listing raced a reshard and should be fetched again.
    """
    materialized = list(ranges)
    return not find_hash_range_holes(materialized) and not find_hash_range_overlaps(materialized)
