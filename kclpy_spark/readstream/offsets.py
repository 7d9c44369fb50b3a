"""The ``kinesis-kcl`` source's offsets and how one batch follows another (pure).

An offset is what Spark journals before it runs a batch, so everything that decides which records
a batch holds must be in it or fixed before any sink sees them. Kinesis has no "N records after
X" a planner could name in advance, so a batch's offset names, per shard, where its read
*starts* and whether the shard is read at all (``ShardPlan``); where the read *ends* is fixed by
its first read on an executor and stored as a pin (``Pin``, ``pins.py``) keyed by the query run,
the batch and the shard. A replayed batch finds the pin and reads exactly those records again;
the next batch starts after the pinned last record.

The shards come from the shard-sync rule the daemon uses (``shard_sync.leases_to_create``), so
LATEST, TRIM_HORIZON and AT_TIMESTAMP gaps are filled as the KCL fills them; a shard is read
only once every parent it names has ended (parents first). LATEST is the stream's tip when the
query first started (an AT_TIMESTAMP of that moment), so a read that finds nothing does not move
it. With ``until_ms`` (Trigger.AvailableNow) ranges stop before the first record that arrived
after it, and a shard read to that point or to its tip under the same bound is done.

Offsets are JSON dicts of strings, numbers and booleans (what Spark journals).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from checkpoint.sequence import AT_TIMESTAMP, TRIM_HORIZON, ExtendedSequenceNumber, InitialPosition
from shard_sync.hierarchy import InconsistentShardGraphError, leases_to_create
from shard_sync.shards import Shard

log = logging.getLogger(__name__)

ESN = ExtendedSequenceNumber
VERSION = 1


@dataclass(frozen=True)
class Start:
    """Where a shard's next read starts: after ``after`` (a record, or TRIM_HORIZON), or at the
    first record at or after ``at_ms`` (AT_TIMESTAMP, epoch milliseconds)."""

    after: ESN = TRIM_HORIZON
    at_ms: int | None = None

    def text(self) -> str:
        if self.at_ms is not None:
            return f"AT_TIMESTAMP:{self.at_ms}"
        if self.after.is_sentinel:
            return str(self.after.sentinel.value)  # type: ignore[union-attr]
        return f"{self.after.sequence_number}/{self.after.sub_sequence_number}"

    @classmethod
    def parse(cls, text: str) -> Start:
        if text.startswith("AT_TIMESTAMP:"):
            return cls(AT_TIMESTAMP, int(text.split(":", 1)[1]))
        if text == "TRIM_HORIZON":
            return cls()
        sequence, _, sub = text.partition("/")
        return cls(ESN(sequence, int(sub or 0)))


@dataclass(frozen=True)
class Pin:
    """What the first read of one shard's range in one batch found (both ends included)."""

    first: ESN | None
    last: ESN | None
    rows: int
    ended: bool = False  # the shard's end was reached
    caught_up: bool = False  # the read reached the tip, or the AvailableNow bound
    bounded: bool = False  # it stopped at a record that arrived after the AvailableNow bound
    # Where the next read goes on (GetRecords' NextShardIterator, valid 5 minutes): a shard's
    # end shows only to a read that goes on past its last record.
    next_iterator: str | None = None
    # The children an ended shard's last answer named (ShardId, ParentShards, HashKeyRange): a
    # query holding leases creates their leases at the shard's end, as the KCL does.
    children: tuple[Mapping[str, Any], ...] = ()
    # The shard's pacing after this read (5 calls and 2 MiB a second), kept for the next
    # batch's read: how long it asked to be left alone when the read ended, and when that was
    # (the executor's wall clock, epoch seconds; the pause is never stretched by a clock ahead).
    pause: float | None = None
    ended_at: float | None = None

    def pause_left(self, now: float) -> float:
        """What is left at ``now`` (another clock, maybe) of the pause the read asked: never
        more than the pause itself, whatever the clocks."""
        if self.pause is None or self.ended_at is None:
            return 0.0
        return self.pause - min(max(now - self.ended_at, 0.0), self.pause)

    def same_records(self, other: Pin) -> bool:
        """Whether a read to ``other`` gives this pin's records (the rest, such as the next
        iterator, differs between two reads of the same records)."""
        return (self.first, self.last, self.rows) == (other.first, other.last, other.rows)

    def to_json(self) -> dict[str, Any]:
        return {"first": _esn_text(self.first), "last": _esn_text(self.last), "rows": self.rows,
                "ended": self.ended, "caught_up": self.caught_up, "bounded": self.bounded,
                "next_iterator": self.next_iterator, "pause": self.pause,
                "ended_at": self.ended_at,
                "children": [dict(c) for c in self.children]}  # fmt: skip

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Pin:
        return cls(_esn_of(value.get("first")), _esn_of(value.get("last")), int(value["rows"]),
                   bool(value.get("ended")), bool(value.get("caught_up")),
                   bool(value.get("bounded")), value.get("next_iterator"),
                   tuple(value.get("children") or ()), _number(value.get("pause")),
                   _number(value.get("ended_at")))  # fmt: skip


@dataclass(frozen=True)
class ShardPlan:
    """One shard in one batch: where its read starts, whether it is read, its parents and
    hash keys, and whether an AvailableNow run is done with it (read to its bound or tip)."""

    start: Start
    read: bool
    parents: tuple[str, ...] = ()
    hash_range: tuple[int, int] | None = None
    done: bool = False
    iterator: str | None = None  # the last read's next iterator (an expired one is replaced)
    # The listing showed the shard closed when this batch was planned: a read of it that then
    # finds nothing more at the tip has read it to its end (Kinesis shows the end itself only to
    # a read that goes on past the last record, which an expired iterator's replacement loses).
    closed: bool = False
    # With a lease store: the tenure (``<worker id>#<id>``) under which the shard was planned.
    tenure: str | None = None
    # The shard's share of a per-trigger limit (Spark's ReadMaxRows / ReadMaxBytes), if any.
    max_records: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class SourceOffset:
    """One point of the query: its run, the batch that ends here, when the query first started
    (LATEST's moment), the AvailableNow bound the batch read under, every shard still open
    with its plan, and the shards known to have ended."""

    run: str
    batch: int
    started_ms: int
    until_ms: int | None = None
    shards: Mapping[str, ShardPlan] = field(default_factory=dict)
    ended: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "run": self.run,
            "batch": self.batch,
            "started_ms": self.started_ms,
            "until_ms": -1 if self.until_ms is None else self.until_ms,
            "shards": {sid: _plan_json(p) for sid, p in sorted(self.shards.items())},
            "ended": dict.fromkeys(sorted(self.ended), True),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SourceOffset:
        if value.get("v") != VERSION:
            raise ValueError(f"an offset of another version: {value.get('v')!r}")
        until = int(value["until_ms"])
        return cls(
            run=str(value["run"]), batch=int(value["batch"]), started_ms=int(value["started_ms"]),
            until_ms=None if until < 0 else until,
            shards={sid: _plan_of(p) for sid, p in value["shards"].items()},
            ended=frozenset(value.get("ended", {})),
        )  # fmt: skip

    def read_shards(self) -> list[str]:
        return sorted(sid for sid, plan in self.shards.items() if plan.read)


@dataclass(frozen=True)
class ShardState:
    """A shard after a batch: where its next read starts, and whether it ended or is done."""

    start: Start
    ended: bool
    caught_up: bool
    iterator: str | None = None
    bounded: bool = False


def resolve(
    offset: SourceOffset, pins: Mapping[str, Pin], skipped: Collection[str] = ()
) -> dict[str, ShardState]:
    """Each open shard's state after the batch ``offset`` ends: a shard read in it moves to its
    pin's last record (every read shard must have a pin: the batch ran); one ``skipped`` (a
    replay left it out: its lease had moved) stays where it was."""
    states = {}
    for sid, plan in offset.shards.items():
        if not plan.read or sid in skipped:
            states[sid] = ShardState(plan.start, False, plan.done, plan.iterator, plan.done)
            continue
        pin = pins.get(sid)
        if pin is None:
            raise LookupError(f"batch {offset.batch} of run {offset.run}: no pin for {sid}")
        start = Start(pin.last) if pin.last is not None else plan.start
        # read to the end of a shard the listing showed closed before the read: ended
        drained = plan.closed and pin.rows == 0 and pin.caught_up and not pin.bounded
        states[sid] = ShardState(start, pin.ended or drained, pin.caught_up, pin.next_iterator,
                                 pin.bounded)  # fmt: skip
    return states


def next_offset(
    previous: SourceOffset,
    pins: Mapping[str, Pin],
    listed: Sequence[Shard],
    initial: InitialPosition,
    until_ms: int | None = None,
) -> SourceOffset:
    """The batch after ``previous`` (whose reads left ``pins``), given the stream's shards as
    listed now; unchanged (``previous`` itself) when an AvailableNow run has nothing left."""
    states = resolve(previous, pins) if previous.batch >= 0 else {}
    listed_ids = {s.shard_id for s in listed}
    # A shard a complete listing no longer has aged out of the stream (a query down longer
    # than the retention, across a reshard): reading it failed every batch, and its children
    # waited for it for ever. Its unread records are gone; its children start at their start.
    gone = {sid for sid, s in states.items() if listed and not s.ended and sid not in listed_ids}
    if gone:
        log.warning("kinesis-kcl: shard(s) %s are no longer in the stream (past its retention): "
                    "records not read yet are gone; their children are read from their start",
                    ", ".join(sorted(gone)))  # fmt: skip
    ended = frozenset(previous.ended | gone | {sid for sid, s in states.items() if s.ended})
    open_states = {sid: s for sid, s in states.items() if sid not in ended}
    plans = _plans(previous, open_states, ended, listed, initial)
    closed = {s.shard_id for s in listed if s.ending_sequence_number is not None}
    same_bound = until_ms is not None and previous.until_ms == until_ms
    for sid, plan in plans.items():
        waiting = any(p in plans for p in plan.parents)  # a parent still open: parents first
        was = open_states.get(sid)
        is_closed = plan.closed or sid in closed
        # Done under the bound: caught up, and for a closed shard read to its end or its bound
        # (its children's records came after those).
        finished = (same_bound and was is not None and was.caught_up
                    and (not is_closed or was.bounded))  # fmt: skip
        plans[sid] = replace(plan, read=not waiting and not finished, done=finished,
                             closed=is_closed)  # fmt: skip
    named = {p for plan in plans.values() for p in plan.parents}
    kept = frozenset(e for e in ended if e in listed_ids or e in named)  # the rest aged out
    following = SourceOffset(previous.run, previous.batch + 1, previous.started_ms, until_ms,
                             plans, kept)  # fmt: skip
    if until_ms is not None and not following.read_shards() and previous.batch >= 0:
        return previous
    return following


def _plans(
    previous: SourceOffset,
    open_states: Mapping[str, ShardState],
    ended: frozenset[str],
    listed: Sequence[Shard],
    initial: InitialPosition,
) -> dict[str, ShardPlan]:
    """Every shard the next batch knows: the open ones where their reads left them, new ones
    by the shard-sync rule, and the children of ended ones (from TRIM_HORIZON, as the KCL's
    shard end makes them); none decided read yet."""
    plans: dict[str, ShardPlan] = {}
    for sid, state in open_states.items():
        plans[sid] = replace(previous.shards[sid], start=state.start, iterator=state.iterator,
                             max_records=None, max_bytes=None)  # fmt: skip
    known = set(open_states) | ended
    try:
        created = leases_to_create(listed, known, initial) if listed else []
    except InconsistentShardGraphError:  # the listing raced a reshard: the next batch lists again
        created = []
    for lease in created:
        if lease.shard_id not in known:
            start = _start_of(lease.checkpoint, initial, previous.started_ms)
            hash_range = (lease.hash_key_range.start, lease.hash_key_range.end)
            plans[lease.shard_id] = ShardPlan(start, False, tuple(sorted(lease.parent_shard_ids)),
                                              hash_range)  # fmt: skip
    for shard in listed:
        parents = tuple(p for p in (shard.parent_shard_id, shard.adjacent_parent_shard_id) if p)
        if shard.shard_id not in plans and shard.shard_id not in ended and set(parents) & ended:
            hash_range = (shard.hash_key_range.start, shard.hash_key_range.end)
            plans[shard.shard_id] = ShardPlan(Start(), False, tuple(sorted(parents)), hash_range)
    return plans


def within_limit(offset: SourceOffset, max_rows: int | None, max_bytes: int | None) -> SourceOffset:
    """``offset`` with a per-trigger limit (Spark's ReadMaxRows / ReadMaxBytes) shared over the
    shards it reads: each gets an equal share (the remainder to the first ones, in an order
    that turns with the batch); with fewer records than shards, the shards left without a share
    wait for a later batch. Each shard's own budget (the options) still applies."""
    shards = offset.read_shards()
    if not shards or (max_rows is None and max_bytes is None):
        return offset
    turn = offset.batch % len(shards)
    order = shards[turn:] + shards[:turn]
    plans = dict(offset.shards)
    for i, sid in enumerate(order):
        rows = None if max_rows is None else _share(max_rows, len(order), i)
        size = None if max_bytes is None else _share(max_bytes, len(order), i)
        if rows == 0 or size == 0:
            plans[sid] = replace(plans[sid], read=False)
        else:
            plans[sid] = replace(plans[sid], max_records=rows, max_bytes=size)
    return replace(offset, shards=plans)


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)


def first_offset(run: str, now_ms: int) -> SourceOffset:
    """A new query's initial offset: no batch yet (``batch`` -1), no shard known."""
    return SourceOffset(run, -1, now_ms)


def _start_of(checkpoint: ESN, initial: InitialPosition, started_ms: int) -> Start:
    """A new shard's start from the checkpoint the shard-sync rule gives it (a sentinel)."""
    if checkpoint == TRIM_HORIZON:
        return Start()
    if checkpoint == AT_TIMESTAMP and initial.timestamp is not None:
        return Start(AT_TIMESTAMP, int(initial.timestamp.timestamp() * 1000))
    return Start(AT_TIMESTAMP, started_ms)  # LATEST: the tip when the query first started


def timestamp_of(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _plan_json(plan: ShardPlan) -> dict[str, Any]:
    value: dict[str, Any] = {"start": plan.start.text(), "read": plan.read,
                             "parents": ",".join(plan.parents), "done": plan.done}  # fmt: skip
    if plan.iterator is not None:
        value["iterator"] = plan.iterator
    if plan.closed:
        value["closed"] = True
    if plan.tenure is not None:
        value["tenure"] = plan.tenure
    if plan.max_records is not None:
        value["max_records"] = plan.max_records
    if plan.max_bytes is not None:
        value["max_bytes"] = plan.max_bytes
    if plan.hash_range is not None:
        value["hash"] = f"{plan.hash_range[0]}-{plan.hash_range[1]}"
    return value


def _plan_of(value: Mapping[str, Any]) -> ShardPlan:
    parents = tuple(p for p in str(value.get("parents", "")).split(",") if p)
    hash_text = value.get("hash")
    hash_range = None
    if hash_text:
        low, high = str(hash_text).split("-")
        hash_range = (int(low), int(high))
    return ShardPlan(Start.parse(str(value["start"])), bool(value["read"]), parents, hash_range,
                     bool(value.get("done")), value.get("iterator"),
                     bool(value.get("closed")), value.get("tenure"),
                     _int_or_none(value.get("max_records")),
                     _int_or_none(value.get("max_bytes")))  # fmt: skip


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _esn_text(value: ESN | None) -> str | None:
    return None if value is None else f"{value.sequence_number}/{value.sub_sequence_number}"


def _esn_of(value: Any) -> ESN | None:
    if value is None:
        return None
    sequence, _, sub = str(value).partition("/")
    return ESN(sequence, int(sub or 0))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
