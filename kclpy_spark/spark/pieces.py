"""The units a micro-batch is made of, their stable ids, and the Arrow form of records.

A *piece* is one lease's contiguous range of records in one batch: (lease key, first position,
last position), both ends included. A batch is one or more pieces (of distinct leases).

Ids are pure functions of the pieces, so the same ranges give the same ids after a crash or on
another worker:

* ``piece_id``: ``"p"`` + 32 hex digits of SHA-256 over the piece's key. Idempotent sinks name
  their output after it.
* ``batch_id_of``: the first 8 bytes of SHA-256 over the sorted piece keys, as a non-negative
  63-bit int (what Spark's foreachBatch passes as ``batch_id``). It is stable, not increasing:
  Delta's ``txnVersion`` idiom needs increasing versions, so use ``DeltaSink`` for Delta.

The pending checkpoint written before a batch is attempted carries a small JSON state: for each of
the lease's pieces in flight, its batch's pieces (so a restarted worker can re-form the identical
batch) and this lease's sink token in it (e.g. the Delta version the piece commits with).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.processor import Record

SCHEMA = pa.schema(
    [
        pa.field("stream", pa.string(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("sequence_number", pa.string(), nullable=False),
        pa.field("sub_sequence_number", pa.int64(), nullable=False),
        pa.field("partition_key", pa.string(), nullable=False),
        pa.field("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
    ]
)
_SEQ = SCHEMA.get_field_index("sequence_number")
_SUB = SCHEMA.get_field_index("sub_sequence_number")
STATE_FORMAT = "kclpy-spark-sink/1"  # one piece in flight
STATE_FORMAT_2 = "kclpy-spark-sink/2"  # several (pipelined batches)


@dataclass(frozen=True, order=True)
class PieceKey:
    """What identifies a piece: its lease and its first and last positions (included)."""

    lease_key: str
    first: ExtendedSequenceNumber
    last: ExtendedSequenceNumber

    def as_json(self) -> list[Any]:
        return [
            self.lease_key,
            self.first.sequence_number,
            self.first.sub_sequence_number,
            self.last.sequence_number,
            self.last.sub_sequence_number,
        ]

    @classmethod
    def from_json(cls, value: Sequence[Any]) -> PieceKey:
        lease, fseq, fsub, lseq, lsub = value
        return cls(
            str(lease),
            ExtendedSequenceNumber(str(fseq), int(fsub)),
            ExtendedSequenceNumber(str(lseq), int(lsub)),
        )

    @functools.cached_property
    def piece_id(self) -> str:
        """Worked out once (a sink names a piece's files after it several times a write)."""
        text = json.dumps(self.as_json(), separators=(",", ":"))
        return "p" + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Piece:
    """One lease's records in one batch: ``key`` plus where they are and how many."""

    key: PieceKey
    shard_id: str
    rows: int

    @property
    def lease_key(self) -> str:
        return self.key.lease_key

    @property
    def piece_id(self) -> str:
        return self.key.piece_id


def batch_id_of(keys: Sequence[PieceKey]) -> int:
    """The stable 63-bit id of a batch made of these pieces (order does not matter)."""
    text = json.dumps([k.as_json() for k in sorted(keys)], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def esn_at(batch: pa.RecordBatch, row: int) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(
        batch.column(_SEQ)[row].as_py(), int(batch.column(_SUB)[row].as_py())
    )


@dataclass(frozen=True)
class Chunk:
    """Consecutive records of one lease as an Arrow record batch, with its end positions."""

    batch: pa.RecordBatch
    first: ExtendedSequenceNumber
    last: ExtendedSequenceNumber

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Chunk:
        return cls(batch, esn_at(batch, 0), esn_at(batch, batch.num_rows - 1))

    @property
    def rows(self) -> int:
        return int(self.batch.num_rows)

    @property
    def nbytes(self) -> int:
        return int(self.batch.nbytes)

    def split(self, rows: int) -> tuple[Chunk, Chunk]:
        """The first ``rows`` records and the rest (0 < rows < self.rows)."""
        return Chunk.of(self.batch.slice(0, rows)), Chunk.of(self.batch.slice(rows))

    def count_up_to(self, position: ExtendedSequenceNumber) -> int:
        """How many records are at or before ``position`` (records are in order)."""
        if self.last <= position:
            return self.rows
        if position < self.first:
            return 0
        return self._count_to(position, inclusive=True)

    def count_before(self, position: ExtendedSequenceNumber) -> int:
        """How many records are before ``position``."""
        if self.last < position:
            return self.rows
        if position <= self.first:
            return 0
        return self._count_to(position, inclusive=False)

    def _count_to(self, position: ExtendedSequenceNumber, *, inclusive: bool) -> int:
        seqs = self.batch.column(_SEQ).to_pylist()
        subs = self.batch.column(_SUB).to_pylist()
        target = (int(position.sequence_number), position.sub_sequence_number)
        count = 0
        for seq, sub in zip(seqs, subs, strict=True):
            at = (int(seq), sub)
            if at > target or (at == target and not inclusive):
                break
            count += 1
        return count


def take_chunks(chunks: deque[Chunk], max_rows: int, max_bytes: int) -> list[Chunk]:
    """Take from the head of ``chunks`` at most ``max_rows`` records and ``max_bytes`` (but at
    least one record, however large), splitting a chunk where the limit falls."""
    taken: list[Chunk] = []
    rows = nbytes = 0
    while chunks and rows < max_rows:
        chunk = chunks[0]
        fit = min(max_rows - rows, chunk.rows)
        if nbytes + chunk.nbytes > max_bytes:
            per_row = max(1, chunk.nbytes // chunk.rows)
            fit = min(fit, (max_bytes - nbytes) // per_row)
            if fit <= 0:
                if rows:
                    break
                fit = 1  # a single record larger than the limit still goes alone
        if fit < chunk.rows:
            chunk, chunks[0] = chunk.split(fit)
        else:
            chunks.popleft()
        taken.append(chunk)
        rows += chunk.rows
        nbytes += chunk.nbytes
    return taken


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def partition_key_column(records: Sequence[Record]) -> pa.Array:
    """The records' partition keys as Arrow strings. A key holding a lone surrogate (an emulator
    stores one, botocore parses it) is not UTF-8, which Arrow and every Spark sink need: each
    surrogate becomes U+FFFD there, the same way on every read, so the page is still written
    (its data, sequence numbers and order untouched) instead of failing each time."""
    keys = [r.partition_key for r in records]
    try:
        return pa.array(keys, pa.string())
    except UnicodeEncodeError:
        return pa.array([_LONE_SURROGATE.sub("\ufffd", k) for k in keys], pa.string())


def records_to_chunk(records: Sequence[Record], stream: str, shard_id: str) -> Chunk:
    """Arrow columns for ``records`` (non-empty, in order). Runs in the caller's thread, so the
    conversion overlaps with the Spark write of the previous batch."""
    n = len(records)
    columns = [
        pa.array([stream] * n, pa.string()),
        pa.array([shard_id] * n, pa.string()),
        pa.array([r.sequence_number for r in records], pa.string()),
        pa.array([r.sub_sequence_number for r in records], pa.int64()),
        partition_key_column(records),
        pa.array([r.timestamp_millis for r in records], pa.int64()).cast(SCHEMA.field(5).type),
        pa.array([r.binary_data for r in records], pa.binary()),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=SCHEMA)
    last = records[-1]
    return Chunk(
        batch,
        ExtendedSequenceNumber(records[0].sequence_number, records[0].sub_sequence_number),
        ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number),
    )


@dataclass(frozen=True)
class InFlight:
    """One piece of a lease in flight: the batch it is written in (every piece of that batch)
    and this lease's sink token in it."""

    group: tuple[PieceKey, ...]
    token: Any = None

    def piece_of(self, lease_key: str) -> PieceKey | None:
        return next((k for k in self.group if k.lease_key == lease_key), None)


@dataclass(frozen=True)
class PendingState:
    """What a lease's pending checkpoint says about its pieces in flight when it was set, in
    order (with pipelined batches, several: the pending checkpoint is the last one's end)."""

    pieces: tuple[InFlight, ...]

    def encode(self) -> bytes:
        """One piece in flight: format 1 (what earlier versions read); several: format 2."""
        if len(self.pieces) == 1:
            [only] = self.pieces
            value: dict[str, Any] = {"format": STATE_FORMAT, **_in_flight_json(only)}
        else:
            value = {"format": STATE_FORMAT_2, "pieces": [_in_flight_json(p) for p in self.pieces]}
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> PendingState | None:
        """The state, or None when absent or written by something else (another processor's
        ``prepare_checkpoint``): the range is then still re-formed, only alone."""
        if not raw:
            return None
        try:
            value = json.loads(raw)
            if not isinstance(value, Mapping):
                return None
            if value.get("format") == STATE_FORMAT:
                return cls((_in_flight_of(value),))
            if value.get("format") == STATE_FORMAT_2:
                return cls(tuple(_in_flight_of(p) for p in value["pieces"]))
        except (ValueError, TypeError, KeyError):
            return None
        return None

    def after(
        self, lease_key: str, checkpoint: ExtendedSequenceNumber | None
    ) -> list[tuple[PieceKey, InFlight]]:
        """This lease's pieces in flight that end after ``checkpoint``, in order."""
        out = []
        for entry in self.pieces:
            key = entry.piece_of(lease_key)
            if key is not None and (checkpoint is None or checkpoint < key.last):
                out.append((key, entry))
        return out


def _in_flight_json(entry: InFlight) -> dict[str, Any]:
    return {"group": [k.as_json() for k in entry.group], "token": entry.token}


def _in_flight_of(value: Mapping[str, Any]) -> InFlight:
    return InFlight(tuple(PieceKey.from_json(k) for k in value["group"]), value.get("token"))
