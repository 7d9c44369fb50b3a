"""One GetRecords JSON body -> its ``Record`` objects and the small rest of the body, for the
fast decode (``fastdecode.py`` installs it inside botocore and checks it against botocore's parse).

With msgspec (a dependency), one pass in C parses the body, checks each record's types and turns
its base64 data into bytes: ~0.4 us a record of 200 B, where orjson's parse alone took ~0.7 us
(its data then base64, ~0.6 us more to decode it in Python). The other top-level members
(``OTHER_MEMBERS``: botocore's model has no more; the self-check refuses a model with more) are
kept as raw JSON and put together as the rest for botocore to parse. A body msgspec's typed parse
refuses goes to botocore alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from kclpy_spark.processor import Record

# GetRecords' top-level members besides Records (its output shape's, botocore's Kinesis model).
OTHER_MEMBERS = ("NextShardIterator", "MillisBehindLatest", "ChildShards")


class FastRecords(list[Record]):
    """The Records this module decoded: the type marks a response the fast path handled.
    ``data_bytes``: their data (decoded size) and partition keys, in bytes (``page_bytes``)."""

    __slots__ = ("data_bytes",)

    def __init__(self) -> None:
        super().__init__()
        self.data_bytes = 0


def arrival_millis(value: float | None) -> int:
    """Epoch seconds (as in the JSON body) -> integer milliseconds, exactly as
    ``int(datetime.fromtimestamp(value, tz).timestamp() * 1000)`` computes them from botocore's
    datetime: fromtimestamp rounds the fraction half-even to whole microseconds, timestamp()
    divides the microseconds by 10**6 (correctly rounded), and the float product is truncated."""
    if value is None:
        return 0
    fraction, whole = math.modf(value)
    micros = int(whole) * 1_000_000 + round(fraction * 1e6)
    return int(micros / 1_000_000 * 1000)


def _entries_decoder() -> Callable[[bytes], tuple[list[Any] | None, bytes]]:
    """msgspec's typed decoder of a body -> (its record entries or None, the rest as JSON)."""

    class Entry(msgspec.Struct, gc=False):  # never in a cycle: the collector skips it
        Data: bytes  # base64 in the JSON, decoded (and checked) by msgspec
        PartitionKey: str
        SequenceNumber: str
        ApproximateArrivalTimestamp: float | None = None

    raw_members = [(name, msgspec.Raw, msgspec.Raw()) for name in OTHER_MEMBERS]
    page = msgspec.defstruct("Page", [("Records", list[Entry] | None, None), *raw_members])
    decoder = msgspec.json.Decoder(page)
    labels = [(name, f'"{name}":'.encode()) for name in OTHER_MEMBERS]

    def decode(body: bytes) -> tuple[list[Any] | None, bytes]:
        try:
            parsed = decoder.decode(body)
        except msgspec.ValidationError:  # valid JSON of another shape (whitespace in base64, ...)
            return None, b""  # this response alone goes to botocore
        rest = [label + bytes(raw) for name, label in labels if len(raw := getattr(parsed, name))]
        entries: list[Any] | None = getattr(parsed, "Records")  # noqa: B009 (a made class)
        return entries, b"{" + b",".join(rest) + b"}"

    return decode


def _records_of_entries(entries: Iterable[Any]) -> FastRecords:
    """Records from msgspec's entries (data already bytes)."""
    records = FastRecords()
    append = records.append
    last: float | None = None
    millis = size = 0
    keys = []
    for e in entries:
        seconds = e.ApproximateArrivalTimestamp
        if seconds != last or seconds is None:
            last = seconds
            millis = arrival_millis(seconds)
        data = e.Data
        size += len(data)
        keys.append(e.PartitionKey)
        append(Record(data, e.PartitionKey, e.SequenceNumber, 0, millis))
    records.data_bytes = size + len("".join(keys).encode())
    return records


_entries = _entries_decoder()
DECODER = "msgspec"


def decode_page(body: bytes) -> tuple[FastRecords, bytes] | None:
    """A GetRecords body's records and the rest of the body (JSON); None if it has no
    ``Records`` list or msgspec refuses its shape (botocore then parses that body). Raises for a
    body that is no JSON at all."""
    entries, rest = _entries(body)
    return None if entries is None else (_records_of_entries(entries), rest)
