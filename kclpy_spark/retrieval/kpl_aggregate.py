"""A KPL aggregator (what the KPL's ``addUserRecord`` batching writes): for tests and small
producers; the format is described in ``kpl``."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kclpy_spark.retrieval.kpl import MAGIC, partition_key_hash


@dataclass(frozen=True)
class UserRecord:
    """One record given to the aggregator (a KPL ``addUserRecord``)."""

    partition_key: str
    data: bytes
    explicit_hash_key: str | None = None
    tags: tuple[tuple[str, str], ...] = field(default=())


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(key: int, payload: bytes) -> bytes:
    return bytes((key,)) + _encode_varint(len(payload)) + payload


def aggregate_body(records: Sequence[UserRecord]) -> bytes:
    """The AggregatedRecord protobuf bytes for ``records``, laid out as the KPL writes them: key
    tables in order of first use, an explicit hash key index only where a key was given."""
    pk_index: dict[str, int] = {}
    ehk_index: dict[str, int] = {}
    encoded: list[bytes] = []
    for r in records:
        inner = b"\x08" + _encode_varint(pk_index.setdefault(r.partition_key, len(pk_index)))
        if r.explicit_hash_key is not None:
            index = ehk_index.setdefault(r.explicit_hash_key, len(ehk_index))
            inner += b"\x10" + _encode_varint(index)
        inner += _field(0x1A, r.data)
        for k, v in r.tags:
            inner += _field(0x22, _field(0x0A, k.encode()) + _field(0x12, v.encode()))
        encoded.append(_field(0x1A, inner))
    return b"".join(
        [_field(0x0A, k.encode("utf-8")) for k in pk_index]
        + [_field(0x12, k.encode("ascii")) for k in ehk_index]
        + encoded
    )


def aggregate(records: Sequence[UserRecord]) -> bytes:
    """One KPL aggregated record's data: magic, protobuf, MD5. (The KPL itself sends a lone user
    record unaggregated; this always aggregates, which consumers must accept too.)"""
    body = aggregate_body(records)
    return MAGIC + body + hashlib.md5(body).digest()


def put_entry(records: Sequence[UserRecord]) -> dict[str, Any]:
    """A PutRecords entry for ``records`` aggregated, routed as the KPL routes it: by the first
    user record's explicit hash key, or else the MD5 of its partition key."""
    if not records:
        raise ValueError("an aggregate needs at least one user record")
    first = records[0]
    hash_key = first.explicit_hash_key or str(partition_key_hash(first.partition_key))
    return {
        "Data": aggregate(records),
        "PartitionKey": first.partition_key,
        "ExplicitHashKey": hash_key,
    }
