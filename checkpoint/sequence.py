"""Sequence numbers, the KCL's checkpoint sentinels, and initial positions."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import total_ordering


class Sentinel(enum.StrEnum):
    """Values a lease's checkpoint may hold instead of a sequence number (the KCL's names)."""

    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"
    SHARD_END = "SHARD_END"


# The order the KCL gives sentinels when comparing with real sequence numbers: every starting
# sentinel sorts before any sequence number, SHARD_END after all of them.
# The last moment a datetime can hold (9999-12-31T23:59:59Z), as epoch seconds.
LATEST_EPOCH_SECONDS = 253_402_300_799.0

_SENTINELS: dict[str, Sentinel] = {s.value: s for s in Sentinel}  # Sentinel(v) raises when not

_SENTINEL_RANK = {
    Sentinel.AT_TIMESTAMP: -3,
    Sentinel.TRIM_HORIZON: -2,
    Sentinel.LATEST: -1,
}


def parse_sequence_number(value: str) -> int:
    """A Kinesis sequence number as an int; ValueError naming the value if it is not one."""
    if not isinstance(value, str) or not value.isdigit() or not value.isascii():
        raise ValueError(f"not a sequence number: {value!r} (expected decimal digits)")
    return int(value)


# A sub-sequence number is a Java long in the KCL's lease table (checkpointSubSequenceNumber):
# one past it was stored by DynamoDB, then every read of the table refused the item.
MAX_SUB_SEQUENCE = 2**63 - 1


@total_ordering
@dataclass(frozen=True)
class ExtendedSequenceNumber:
    """A checkpoint position: a sequence number (or sentinel) plus a KPL sub-sequence number."""

    sequence_number: str
    sub_sequence_number: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.sub_sequence_number <= MAX_SUB_SEQUENCE:
            raise ValueError(
                f"sub-sequence number must be 0..{MAX_SUB_SEQUENCE}, got {self.sub_sequence_number}"
            )
        if self.sequence_number not in Sentinel.__members__:
            parse_sequence_number(self.sequence_number)

    @classmethod
    def of(cls, value: str | Sentinel, sub_sequence_number: int = 0) -> ExtendedSequenceNumber:
        seq = value.value if isinstance(value, Sentinel) else value
        return cls(seq, sub_sequence_number)

    @property
    def sentinel(self) -> Sentinel | None:
        return _SENTINELS.get(self.sequence_number)

    @property
    def is_sentinel(self) -> bool:
        return self.sentinel is not None

    @property
    def is_shard_end(self) -> bool:
        return self.sequence_number == Sentinel.SHARD_END.value

    def _key(self) -> tuple[int, int, int]:
        """The sort key, worked out once (a batch's checkpoint writes compare positions ~20
        times each; not a field: equality and the hash stay the fields')."""
        key: tuple[int, int, int] | None = self.__dict__.get("_sort_key")
        if key is None:
            sentinel = self.sentinel
            if sentinel is Sentinel.SHARD_END:
                key = (2, 0, 0)
            elif sentinel is not None:
                key = (0, _SENTINEL_RANK[sentinel], 0)
            else:
                key = (1, int(self.sequence_number), self.sub_sequence_number)
            object.__setattr__(self, "_sort_key", key)
        return key

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ExtendedSequenceNumber):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        if self.sub_sequence_number:
            return f"{self.sequence_number}/{self.sub_sequence_number}"
        return self.sequence_number


TRIM_HORIZON = ExtendedSequenceNumber.of(Sentinel.TRIM_HORIZON)
LATEST = ExtendedSequenceNumber.of(Sentinel.LATEST)
AT_TIMESTAMP = ExtendedSequenceNumber.of(Sentinel.AT_TIMESTAMP)
SHARD_END = ExtendedSequenceNumber.of(Sentinel.SHARD_END)


class Position(enum.StrEnum):
    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_TIMESTAMP = "AT_TIMESTAMP"


@dataclass(frozen=True)
class InitialPosition:
    """Where a lease with no checkpoint starts: the KCL's InitialPositionInStreamExtended."""

    position: Position
    timestamp: datetime | None = None

    def __post_init__(self) -> None:
        if (self.position is Position.AT_TIMESTAMP) != (self.timestamp is not None):
            raise ValueError("a timestamp is required with AT_TIMESTAMP and only with it")
        if self.timestamp is not None and self.timestamp.tzinfo is None:
            raise ValueError("the AT_TIMESTAMP timestamp must be timezone-aware")

    @classmethod
    def latest(cls) -> InitialPosition:
        return cls(Position.LATEST)

    @classmethod
    def trim_horizon(cls) -> InitialPosition:
        return cls(Position.TRIM_HORIZON)

    @classmethod
    def at_timestamp(cls, when: datetime | float) -> InitialPosition:
        if not isinstance(when, datetime):
            when = datetime.fromtimestamp(when, tz=UTC)
        return cls(Position.AT_TIMESTAMP, when)

    @classmethod
    def parse(cls, text: str) -> InitialPosition:
        """``LATEST``, ``TRIM_HORIZON`` or ``AT_TIMESTAMP:<epoch seconds or ISO-8601>``."""
        name, _, rest = text.strip().partition(":")
        name = name.upper()
        if name == "AT_TIMESTAMP":
            if not rest:
                raise ValueError(
                    "AT_TIMESTAMP needs a time: AT_TIMESTAMP:<epoch seconds or ISO-8601>"
                )
            try:
                seconds = float(rest)
            except ValueError:
                seconds = None
            if seconds is not None:  # 1e20, inf, nan: no time a stream can hold
                if not 0 <= seconds <= LATEST_EPOCH_SECONDS:
                    raise ValueError(f"AT_TIMESTAMP time out of range: {rest!r}")
                return cls.at_timestamp(seconds)
            try:
                when = datetime.fromisoformat(rest)
            except ValueError:
                raise ValueError(f"unreadable AT_TIMESTAMP time {rest!r}") from None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            return cls.at_timestamp(when)
        if rest:
            raise ValueError(f"unknown initial position {text!r}")
        try:
            return cls(Position(name))
        except ValueError:
            raise ValueError(
                f"unknown initial position {text!r}: "
                "use LATEST, TRIM_HORIZON or AT_TIMESTAMP:<time>"
            ) from None

    @property
    def checkpoint(self) -> ExtendedSequenceNumber:
        """The sentinel a new lease at this position stores as its checkpoint."""
        return ExtendedSequenceNumber.of(self.position.value)
