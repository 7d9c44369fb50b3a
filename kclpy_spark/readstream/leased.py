"""How a ``kinesis-kcl`` query that holds KCL leases plans its batches (pure).

With a lease store the query is a worker of its application (``query_worker.py``): it reads
only the shards whose leases it holds. A held lease is announced (``HeldShard``) only once its
consumer started reading, which the worker allows only after every parent reached SHARD_END (the
KCL's rule), so parents come first without this module knowing them. Each announcement is a
*tenure*: the worker's id and a fresh id, so a lease lost and taken again is a new tenure.

* A shard held under the tenure it was planned under in the last batch goes on after that
  batch's pin.
* A shard held under a new tenure starts at ``resume_start``: where this query's own batches left
  it, unless the lease's checkpoint is beyond that (another worker read further and acknowledged
  it), then at the checkpoint. A position this query never reached is never skipped to.
* A shard not held is not read; where this query left it is kept for the rule above until the
  shard ends or ages out of the stream.

After a batch completed, each shard read under a tenure still held is acknowledged: its pin's
last record becomes the lease's checkpoint, and an ended shard's SHARD_END lets its children
start (``acknowledgments``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kclpy_spark.readstream.offsets import Pin, ShardPlan, SourceOffset, Start, resolve
from shard_sync.shards import Shard


@dataclass(frozen=True)
class HeldShard:
    """A lease this query holds and reads: its tenure, its checkpoint when reading began (as a
    ``Start``) and its hash keys (a child's range after a merge)."""

    shard_id: str
    tenure: str
    start: Start
    hash_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class Ack:
    """Acknowledge ``pin`` (a completed batch's read of a shard) under ``tenure``."""

    shard_id: str
    tenure: str
    pin: Pin
    ended: bool = False  # read to its end (or drained at the tip of a closed shard)


def children_in(listed: Sequence[Shard], shard_id: str) -> list[dict[str, Any]]:
    """``shard_id``'s children as GetRecords' ``ChildShards`` names them, from a listing (for
    an end found without them: a closed shard drained at its tip, an end handed again)."""
    children = []
    for shard in listed:
        parents = [p for p in (shard.parent_shard_id, shard.adjacent_parent_shard_id) if p]
        if shard_id in parents:
            hashes = shard.hash_key_range
            children.append({
                "ShardId": shard.shard_id, "ParentShards": parents,
                "HashKeyRange": {"StartingHashKey": str(hashes.start),
                                 "EndingHashKey": str(hashes.end)},
            })  # fmt: skip
    return children


def ends_to_hand(
    previous: SourceOffset, pins: Mapping[str, Pin], readable: Collection[str],
    skipped: Collection[str] = (),
) -> list[str]:  # fmt: skip
    """Shards this query read to their end that a consumer of this worker holds and reads
    now: their end was never handed to it (the batch that ended them was not acknowledged, or
    the lease moved and came back): it must be, or SHARD_END never comes and the children wait
    for good. Called after the batch's acknowledgments, which hand the ends they found (a
    handed end is no longer readable)."""
    ended = set(previous.ended)
    if previous.batch >= 0:
        ended |= {sid for sid, s in resolve(previous, pins, skipped).items() if s.ended}
    return sorted(ended & set(readable))


def owner_of(tenure: str) -> str:
    """The worker id a tenure names."""
    return tenure.rpartition("#")[0]


def resume_start(ours: Start | None, lease: Start) -> Start:
    """Where a shard taken under a new tenure starts: ``ours`` (after this query's last batch
    of it) unless the lease's checkpoint names a record beyond it."""
    if ours is None:
        return lease
    lease_record = lease.at_ms is None and not lease.after.is_sentinel
    if not lease_record:
        return ours
    ours_record = ours.at_ms is None and not ours.after.is_sentinel
    return lease if not ours_record or lease.after > ours.after else ours


def acknowledgments(
    offset: SourceOffset,
    pins: Mapping[str, Pin],
    skipped: Collection[str] = (),
    read_under: Mapping[str, str] | None = None,
) -> list[Ack]:
    """What the completed batch ``offset`` acknowledges: each shard it read (not skipped) that
    found records or its end, under the tenure it was read under (``read_under``: a replay
    that re-checked a shard under the tenure held now)."""
    acks = []
    states = resolve(offset, pins, skipped)
    for sid in offset.read_shards():
        pin, plan = pins.get(sid), offset.shards[sid]
        tenure = (read_under or {}).get(sid, plan.tenure)
        if sid in skipped or pin is None or tenure is None:
            continue
        if pin.last is not None or states[sid].ended:
            acks.append(Ack(sid, tenure, pin, states[sid].ended))
    return acks


def next_leased_offset(
    previous: SourceOffset,
    pins: Mapping[str, Pin],
    held: Mapping[str, HeldShard],
    *,
    closed: Collection[str] = (),
    listed: Collection[str] | None = None,
    until_ms: int | None = None,
    skipped: Collection[str] = (),
    read_under: Mapping[str, str] | None = None,
) -> SourceOffset:
    """The batch after ``previous`` (whose reads left ``pins``) for the shards ``held`` now;
    ``closed``: shards the stream lists as closed; ``listed``: every shard it lists (None: not
    listed, keep what is known). Unchanged (``previous``) when an AvailableNow run has nothing
    left to read in the shards held."""
    states = resolve(previous, pins, skipped) if previous.batch >= 0 else {}
    ended = frozenset(previous.ended | {sid for sid, s in states.items() if s.ended})
    same_bound = until_ms is not None and previous.until_ms == until_ms
    under = read_under or {}
    plans: dict[str, ShardPlan] = {}
    for sid, left in states.items():  # where this query left each open shard
        if not left.ended and (listed is None or sid in listed):
            known = previous.shards[sid]
            plans[sid] = ShardPlan(left.start, False, (), known.hash_range, closed=known.closed)
    for sid, shard in held.items():
        if sid in ended:
            continue  # read to its end: acknowledged with SHARD_END, never read again
        was, state = previous.shards.get(sid), states.get(sid)
        is_closed = sid in closed or (was is not None and was.closed)
        if was is not None and state is not None and under.get(sid, was.tenure) == shard.tenure:
            start, iterator = state.start, state.iterator
            finished = same_bound and state.caught_up and (not is_closed or state.bounded)
        else:
            start = resume_start(state.start if state is not None else None, shard.start)
            iterator, finished = None, False
        plans[sid] = ShardPlan(start, not finished, (), shard.hash_range, done=finished,
                               iterator=iterator, closed=is_closed,
                               tenure=shard.tenure)  # fmt: skip
    kept = frozenset(e for e in ended if listed is None or e in listed)
    following = replace(previous, batch=previous.batch + 1, until_ms=until_ms, shards=plans,
                        ended=kept)  # fmt: skip
    if until_ms is not None and not following.read_shards() and previous.batch >= 0:
        return previous
    return following
