"""What an executor reads for one lease in one micro-batch (``ReadRange``), and what it found
(``RangeEnd``): small JSON-able values the driver plans and collects, never records (pure).

A range starts after ``after`` (the lease's checkpoint, or the last record of the range before
it; a starting sentinel reads from TRIM_HORIZON, LATEST or the configured timestamp) and, read the
first time, runs until a budget is spent: ``max_records``, ``max_bytes`` (whole pages: a page
that crosses the byte budget is kept, so a task holds at most the budget plus one page),
``max_seconds``, the shard's tip (an answer with ``MillisBehindLatest`` 0) or the shard's end.

What the first read found is *pinned* (``Pinned``: first and last record, how many, whether the
shard ended) and stored in the lease's pending checkpoint before any sink writes. A range read
again with its pin (a second sink, a retried attempt, a lost executor, a new owner after a crash)
reads from the first record to the last and must find exactly as many records; anything else is
a ``RangeMismatchError`` (the records are not the ones acknowledged: never written).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from checkpoint.base.errors import KclpySparkError
from checkpoint.sequence import ExtendedSequenceNumber

ESN = ExtendedSequenceNumber


class RangeMismatchError(KclpySparkError):
    """A pinned range read again gave other records than its first read (trimmed by retention,
    or a different stream): not retriable, the batch must not be written."""

    retriable = False


# A pinned read's time budget, in a plain read's ``max_seconds``: it must read all of what a
# first read found, which may have been cut by time (a slow or throttled shard), and it cannot
# stop early without breaking its pin.
PINNED_TIME_FACTOR = 10


@dataclass(frozen=True)
class Pinned:
    """A range's records as its first read found them: both ends included (None: no record).
    A range re-formed from a lease's pending checkpoint after a crash knows its last record (and
    its first when the pending state names the piece) but not how many: ``rows`` None."""

    first: ESN | None
    last: ESN | None
    rows: int | None
    shard_ended: bool = False
    # A read again may find the oldest of its records aged out of the stream's retention (a
    # readStream replay: nobody else holds them, and refusing fails the query for good): what
    # is left of it, a suffix of its records, is its read (``aged_out``).
    aged_out_ok: bool = False

    def __post_init__(self) -> None:
        if self.rows is None:
            if self.last is None:
                raise ValueError(f"a pin without a count names its last record: {self!r}")
        elif (self.first is None) != (self.last is None) or (self.first is None) != (
            self.rows == 0
        ):
            raise ValueError(f"a pin names both ends of its records or none: {self!r}")
        if self.first is not None and self.last is not None and self.last < self.first:
            raise ValueError(f"a pin's last record comes before its first: {self!r}")

    @property
    def needs_read(self) -> bool:
        return self.last is not None


Key = tuple[int, int]  # (sequence number, sub-sequence number) of a record


def key_of(position: ESN) -> Key:
    """A record position as integers (not a sentinel): compared far faster than positions."""
    return (int(position.sequence_number), position.sub_sequence_number)


@dataclass(frozen=True)
class KeyWindow:
    """Which record keys a read keeps: after ``low`` (from it, if ``inclusive``), up to ``high``
    (None: no bound), and after the last one kept."""

    low: Key | None
    inclusive: bool
    high: Key | None

    def keeps(self, key: Key, last_kept: Key | None) -> bool:
        if last_kept is not None and key <= last_kept:
            return False
        if self.low is not None and (key < self.low if self.inclusive else key <= self.low):
            return False
        return self.high is None or key <= self.high

    def past(self, key: Key) -> bool:
        return self.high is not None and key > self.high

    def keeps_all(self, first: Key, last: Key, last_kept: Key | None) -> bool:
        """Whether every record of a page from ``first`` to ``last`` (in order) is kept."""
        return self.keeps(first, last_kept) and (self.high is None or last <= self.high)


@dataclass(frozen=True)
class ReadRange:
    """One lease's records to read in one batch (``stream_arg``: the StreamName or StreamARN
    argument of the Kinesis calls; ``hash_range``: a child shard's hash keys, for KPL sub-records
    routed before a reshard; ``timestamp``: epoch seconds when ``after`` is AT_TIMESTAMP;
    ``iterator``: the previous range's next iterator, valid for 5 minutes)."""

    lease_key: str
    stream: str
    stream_arg: Mapping[str, str]
    shard_id: str
    after: ESN
    max_records: int = 10_000
    max_bytes: int = 2 * 1024 * 1024
    max_seconds: float = 10.0
    max_pages: int = 0  # GetRecords answers a first read stops after (0: no limit)
    read_rate: float = 2 * 1024 * 1024
    kpl: bool = True
    hash_range: tuple[int, int] | None = None
    timestamp: float | None = None
    iterator: str | None = None
    pinned: Pinned | None = None
    # A first read stops before the first record that arrived after this (epoch milliseconds):
    # a readStream query's Trigger.AvailableNow bound (readstream/offsets.py).
    until_millis: int | None = None
    # Seconds the task waits before the range's first call: the shard's pacing, for a lease
    # planned into a read job shortly before Kinesis allows its next call (counted from the
    # task's start, which comes after the plan: never early, whatever the executor's clock).
    delay: float = 0.0

    def __post_init__(self) -> None:
        if (
            self.max_records < 1
            or self.max_bytes < 1
            or not 0 < self.max_seconds < math.inf  # NaN too: msgspec would write it as null
            or self.max_pages < 0
            or not math.isfinite(self.read_rate)
            or not 0 <= self.delay < math.inf
        ):
            raise ValueError(f"a range needs positive, finite budgets: {self!r}")
        if self.after.is_shard_end:
            raise ValueError(f"lease {self.lease_key} ended: nothing to read after SHARD_END")

    def keeps(self, position: ESN, last_kept: ESN | None) -> bool:
        """Whether a record (or KPL sub-record) at ``position`` belongs to this range's read, in
        order after ``last_kept`` (a page read twice after an expired iterator keeps nothing
        twice)."""
        return self.window().keeps(
            key_of(position), None if last_kept is None else key_of(last_kept)
        )

    def past_pin(self, position: ESN) -> bool:
        """A record beyond the pinned last one: a pinned read is over."""
        return self.window().past(key_of(position))

    def window(self) -> KeyWindow:
        """The range's bounds as integer keys (what a read compares each record with)."""
        pin = self.pinned
        high = key_of(pin.last) if pin is not None and pin.last is not None else None
        if pin is not None and pin.first is not None:
            return KeyWindow(key_of(pin.first), True, high)
        low = None if self.after.is_sentinel else key_of(self.after)
        return KeyWindow(low, False, high)

    def whole_window(self) -> KeyWindow | None:
        """Read without deaggregation after ``(seq, k > 0)``, a KPL aggregate checkpointed part
        way: the window that also keeps that aggregate whole (``range_reader`` uses it once it
        finds the aggregate has sub-records after k). None otherwise."""
        if self.kpl or self.pinned is not None or self.after.is_sentinel:
            return None
        seq, sub = key_of(self.after)
        return KeyWindow((seq, 0), True, None) if sub > 0 else None

    def to_json(self) -> str:
        return _encode(
            {
                "lease_key": self.lease_key,
                "stream": self.stream,
                "stream_arg": dict(self.stream_arg),
                "shard_id": self.shard_id,
                "after": _esn_json(self.after),
                "max_records": self.max_records,
                "max_bytes": self.max_bytes,
                "max_seconds": self.max_seconds,
                "max_pages": self.max_pages,
                "read_rate": self.read_rate,
                "kpl": self.kpl,
                "hash_range": [str(x) for x in self.hash_range] if self.hash_range else None,
                "timestamp": self.timestamp,
                "iterator": self.iterator,
                "pinned": _pin_json(self.pinned),
                "until_millis": self.until_millis,
                "delay": self.delay,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ReadRange:
        v = _DECODER.decode(text)
        hash_range = v.get("hash_range")
        return cls(
            lease_key=v["lease_key"],
            stream=v["stream"],
            stream_arg=dict(v["stream_arg"]),
            shard_id=v["shard_id"],
            after=ESN(str(v["after"][0]), int(v["after"][1])),
            max_records=int(v["max_records"]),
            max_bytes=int(v["max_bytes"]),
            max_seconds=float(v["max_seconds"]),
            max_pages=int(v.get("max_pages", 0)),
            read_rate=float(v["read_rate"]),
            kpl=bool(v["kpl"]),
            hash_range=(int(hash_range[0]), int(hash_range[1])) if hash_range else None,
            timestamp=v.get("timestamp"),
            iterator=v.get("iterator"),
            pinned=_pin_of(v.get("pinned")),
            until_millis=v.get("until_millis"),
            delay=float(v.get("delay", 0.0)),
        )


@dataclass(frozen=True)
class RangeEnd:
    """What reading one range found: its records' ends and size, the shard's lag and whether it
    ended (with the children the answer named), the next iterator, and the calls it made."""

    lease_key: str
    first: ESN | None
    last: ESN | None
    rows: int
    nbytes: int
    millis_behind_latest: int | None = None
    shard_ended: bool = False
    child_shards: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    next_iterator: str | None = None
    calls: int = 0
    throttled: int = 0
    unanswered: bool = False  # no GetRecords answer came within the range's time
    error: str | None = None  # the read failed for good (its records are left out)
    bounded: bool = False  # it stopped at a record that arrived after ``until_millis``
    # When the shard may be called again, by the reader's pacing (five calls a second, the last
    # page's bytes at ``read_rate``), in the executor's wall-clock seconds; None: no call made.
    next_call_at: float | None = None
    # The last page was full, or went on past the range: more records may wait whatever its lag
    # says (0 on a full page from an emulator, or in the same millisecond). The lag itself is
    # still the shard's (a backlog reads full pages: its lag must show).
    left_behind: bool = False
    # The Kinesis records its pages held (what GetRecords' ``Limit`` counts: a KPL aggregate is
    # one, its sub-records ``rows``) and their bytes, those it kept or not.
    read_records: int = 0
    read_bytes: int = 0
    # KPL sub-records skipped as their aggregate had one outside the shard's hash range (the
    # executor's warning reaches no log of the daemon's: the driver counts and tells these).
    out_of_range: int = 0

    @property
    def pin(self) -> Pinned:
        return Pinned(self.first, self.last, self.rows, self.shard_ended)

    def to_json(self) -> str:
        return _encode(
            {
                "lease_key": self.lease_key,
                "first": _esn_json(self.first),
                "last": _esn_json(self.last),
                "rows": self.rows,
                "nbytes": self.nbytes,
                "millis_behind_latest": self.millis_behind_latest,
                "shard_ended": self.shard_ended,
                "child_shards": [dict(c) for c in self.child_shards],
                "next_iterator": self.next_iterator,
                "calls": self.calls,
                "throttled": self.throttled,
                "unanswered": self.unanswered,
                "error": self.error,
                "bounded": self.bounded,
                "next_call_at": self.next_call_at,
                "left_behind": self.left_behind,
                "read_records": self.read_records,
                "read_bytes": self.read_bytes,
                "out_of_range": self.out_of_range,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RangeEnd:
        v = _DECODER.decode(text)
        return cls(
            lease_key=v["lease_key"],
            first=_esn_of(v["first"]),
            last=_esn_of(v["last"]),
            rows=int(v["rows"]),
            nbytes=int(v["nbytes"]),
            millis_behind_latest=v.get("millis_behind_latest"),
            shard_ended=bool(v["shard_ended"]),
            child_shards=tuple(v.get("child_shards") or ()),
            next_iterator=v.get("next_iterator"),
            calls=int(v.get("calls", 0)),
            throttled=int(v.get("throttled", 0)),
            unanswered=bool(v.get("unanswered", False)),
            error=v.get("error"),
            bounded=bool(v.get("bounded", False)),
            next_call_at=v.get("next_call_at"),
            read_records=int(v.get("read_records", 0)),
            read_bytes=int(v.get("read_bytes", 0)),
            left_behind=bool(v.get("left_behind", False)),
            out_of_range=int(v.get("out_of_range", 0)),
        )


def check_pinned(rng: ReadRange, end: RangeEnd) -> None:
    """Raise ``RangeMismatchError`` unless a pinned range's read found exactly its pin (or,
    when its pin allows, what retention left of it: ``aged_out``)."""
    pin = rng.pinned
    if pin is None:
        return
    if pin.rows is None:  # re-formed after a crash: its last record must be found
        if end.last == pin.last and (pin.first is None or end.first == pin.first):
            return
    elif (end.first, end.last, end.rows) == (pin.first, pin.last, pin.rows):
        return
    if pin.aged_out_ok and aged_out(pin, end):
        return
    count = "?" if pin.rows is None else str(pin.rows)
    raise RangeMismatchError(
        f"lease {rng.lease_key}: the pinned range {_ends(pin.first, pin.last)} ({count} "
        f"records) read again gave {_ends(end.first, end.last)} ({end.rows} records): not the "
        "records its first read found"
    )


def aged_out(pin: Pinned, end: RangeEnd) -> bool:
    """Whether ``end`` read fewer of the pinned records and only those at its end: its oldest
    aged out of the stream (nothing at all, or from a later first record to the same last)."""
    if pin.first is None or pin.last is None or pin.rows is None or end.rows >= pin.rows:
        return False
    if end.rows == 0:
        return end.first is None
    return end.last == pin.last and end.first is not None and end.first > pin.first


def next_range(previous: ReadRange, end: RangeEnd) -> ReadRange:
    """The lease's range after ``previous`` once its read ``end`` is known: after its last
    record (or where it started, when it found none), from the iterator it ended with, unpinned."""
    after = end.last if end.last is not None else previous.after
    return ReadRange(
        **{
            **_fields(previous),
            "after": after,
            "iterator": end.next_iterator,
            "pinned": None,
            "delay": 0.0,  # the previous range's wait was its own
        }
    )


def _fields(rng: ReadRange) -> dict[str, Any]:
    return {name: getattr(rng, name) for name in rng.__dataclass_fields__}


def _ends(first: ESN | None, last: ESN | None) -> str:
    if first is None or last is None:
        return "[]"
    return f"[{_at(first)}..{_at(last)}]"


def _at(position: ESN) -> str:
    return f"{position.sequence_number}/{position.sub_sequence_number}"


# Each range's JSON crosses to the executors and each end's back (msgspec: a fifth of the json
# module's CPU, which at a thousand leases is the driver's largest share of a read round). Every
# field is a str, an int, a finite float (ReadRange checks its budgets), a bool, None or a list
# or dict of them; a value of another type (none is expected) is written as its str.
_ENCODER = msgspec.json.Encoder(enc_hook=str)
_DECODER = msgspec.json.Decoder()


def _encode(value: dict[str, Any]) -> str:
    return _ENCODER.encode(value).decode()


def _esn_json(value: ESN | None) -> list[Any] | None:
    return None if value is None else [value.sequence_number, value.sub_sequence_number]


def _esn_of(value: Any) -> ESN | None:
    return None if value is None else ESN(str(value[0]), int(value[1]))


def _pin_json(pin: Pinned | None) -> dict[str, Any] | None:
    if pin is None:
        return None
    return {
        "first": _esn_json(pin.first),
        "last": _esn_json(pin.last),
        "rows": pin.rows,
        "shard_ended": pin.shard_ended,
        "aged_out_ok": pin.aged_out_ok,
    }


def _pin_of(value: Any) -> Pinned | None:
    if value is None:
        return None
    return Pinned(
        _esn_of(value["first"]),
        _esn_of(value["last"]),
        None if value["rows"] is None else int(value["rows"]),
        bool(value["shard_ended"]),
        bool(value.get("aged_out_ok", False)),
    )
