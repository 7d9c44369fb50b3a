"""When batches are due and what goes into them: pure functions over the lanes (called by the
MicroBatcher under its lock; cutting a piece marks it in flight in its lane).

* A re-formed piece (recovery) goes first, exactly as it was: in ``worker`` scope with the other
  pieces of its original batch once they are all back (same ``batch_id``), or alone after
  ``regroup_wait`` seconds (or when its lease is being drained).
* Fresh records: in ``worker`` scope one batch over every lease with records, oldest first, up to
  ``max_records``/``max_bytes``; in ``lease`` scope one batch per lease. Due when the records reach
  either limit, the oldest has waited ``max_wait``, a lease is drained, or the buffer is full.
"""

from __future__ import annotations

from collections.abc import Iterable

from kclpy_spark.spark.lanes import Lane, LaneState
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.writer import Entry, PlannedBatch


def plan_due(
    lanes: Iterable[Lane], s: BatcherSettings, now: float, limit: int | None
) -> list[PlannedBatch]:
    """The batches due at ``now`` (at most ``limit``), their pieces cut and marked in flight."""
    lanes = list(lanes)
    batches: list[PlannedBatch] = []

    def room() -> bool:
        return limit is None or len(batches) < limit

    ready = [x for x in lanes if x.can_start() and x.recovery_ready]
    done: set[int] = set()
    for lane in ready:
        if id(lane) in done or not room():
            continue
        rec = lane.recovery
        assert rec is not None
        members = [lane]
        if s.scope == "worker" and len(rec.group) > 1:
            members = [
                m
                for m in ready
                if m.recovery and m.recovery.group == rec.group and m.recovery_key() in rec.group
            ]
            complete = {m.recovery_key() for m in members} == set(rec.group)
            waited = now >= rec.since + s.regroup_wait or any(m.forced for m in members)
            if not complete and not waited:
                continue
        done.update(id(m) for m in members)
        batches.append(_plan([Entry(m, m.take(0, 0)) for m in members]))

    fresh = [x for x in lanes if x.can_start() and x.recovery is None]
    active = [x for x in lanes if x.state is LaneState.ACTIVE]
    pressure = sum(x.nbytes for x in active) >= s.buffer_limit
    if s.scope == "lease":
        for lane in sorted(fresh, key=lambda x: x.oldest or now):
            if room() and _due([lane], s, now, pressure):
                batches.append(_plan([Entry(lane, lane.take(s.max_records, s.max_bytes))]))
    elif fresh and room() and _due(fresh, s, now, pressure):
        rows_left, bytes_left = s.max_records, s.max_bytes
        entries = []
        for lane in sorted(fresh, key=lambda x: x.oldest or now):
            if rows_left <= 0 or bytes_left <= 0:
                break
            flight = lane.take(rows_left, bytes_left)
            rows_left -= flight.piece.rows
            bytes_left -= sum(c.nbytes for c in flight.chunks)
            entries.append(Entry(lane, flight))
        batches.append(_plan(entries))
    return batches


def _due(lanes: list[Lane], s: BatcherSettings, now: float, pressure: bool) -> bool:
    return (
        pressure
        or sum(x.rows for x in lanes) >= s.max_records
        or sum(x.nbytes for x in lanes) >= s.max_bytes
        or any(x.forced for x in lanes)
        or any(x.oldest is not None and now - x.oldest >= s.max_wait for x in lanes)
    )


def _plan(entries: list[Entry]) -> PlannedBatch:
    return PlannedBatch(sorted(entries, key=lambda e: e.flight.piece.key))


def next_wakeup(lanes: Iterable[Lane], s: BatcherSettings, now: float) -> float:
    """Seconds until something may become due (capped at 1 s)."""
    lanes = list(lanes)
    times = [x.oldest + s.max_wait for x in lanes if x.oldest is not None]
    times += [x.recovery.since + s.regroup_wait for x in lanes if x.recovery]
    times += [x.commit_retry_at for x in lanes if x.uncommitted]
    # Capped: a notification may be missed when the injected clock is not the OS's.
    return max(0.01, min([1.0, *(t - now for t in times)]))
