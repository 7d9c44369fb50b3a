"""When batches are due and which lanes go into them: pure functions over the lanes' state.

The planner only reads lanes; the batcher cuts the lanes it names, in the order given.

* A replayed cut (a pending checkpoint re-formed) goes first, exactly as it was: in ``worker``
  scope with the other pieces of its original batch once they are all back (same ``batch_id``),
  or alone after ``regroup_wait`` seconds, at once when none of its batch's other pieces can
  come back here (their leases not held here, or their lanes with nothing of that batch to
  re-form), or when it is drained.
* Fresh records: in ``worker`` scope one batch over every lease with records, oldest first, up to
  ``max_records``/``max_bytes`` and ``max_leases`` (the next leases in the next batch); in
  ``lease`` scope one batch per lease. Due when the records reach
  either limit, the oldest has waited ``max_wait``, a lease is drained, or the buffer is full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kclpy_spark.spark.lane import Lane, LaneState
from kclpy_spark.spark.pieces import PieceKey
from kclpy_spark.spark.settings import BatcherSettings


@dataclass(frozen=True)
class Plan:
    """The lanes of one batch due now, in cutting order. ``budgeted``: fresh records sharing
    ``max_records``/``max_bytes`` (cutting stops when they are spent); else replayed cuts,
    each exactly as it was."""

    lanes: tuple[Lane, ...]
    budgeted: bool


def plan_due(
    lanes: Iterable[Lane],
    s: BatcherSettings,
    now: float,
    limit: int | None,
    expected: Callable[[str], bool] = lambda key: False,
) -> list[Plan]:
    """The batches due at ``now`` (at most ``limit``). ``expected(lease_key)``: whether this
    worker holds that lease (so its lane may still open and bring its piece back)."""
    lanes = list(lanes)
    plans: list[Plan] = []

    def room() -> bool:
        return limit is None or len(plans) < limit

    ready = [x for x in lanes if x.can_cut() and x.replay_ready]
    open_lanes = {x.lease_key: x for x in lanes if x.state is not LaneState.CLOSED}

    done: set[int] = set()
    for lane in ready:
        if id(lane) in done or not room():
            continue
        group = lane.replay_group
        members = [lane]
        # A piece re-formed differently from the original (records trimmed meanwhile) cannot
        # complete its old batch: it goes alone.
        if s.scope == "worker" and len(group) > 1 and lane.replay_key() in group:
            members += [
                m
                for m in ready
                if m is not lane and m.replay_group == group and m.replay_key() in group
            ]
            complete = {m.replay_key() for m in members} == set(group)
            since = lane.replay_since or now
            partners = {k.lease_key for k in group} - {lane.lease_key}
            waited = (
                now >= since + s.regroup_wait
                or not any(
                    _may_come_back(open_lanes.get(key), key, group, expected) for key in partners
                )
                or any(m.forced for m in members)
            )
            if not complete and not waited:
                continue
        done.update(id(m) for m in members)
        plans.append(Plan(tuple(members), budgeted=False))

    fresh = [x for x in lanes if x.can_cut() and not x.replaying]
    rooms = None if limit is None else limit - len(plans)
    return plans + _fresh_plans(fresh, s, now, rooms)


def _fresh_plans(
    fresh: list[Lane], s: BatcherSettings, now: float, limit: int | None
) -> list[Plan]:
    """The batches of fresh records due now (at most ``limit``): one a lease in ``lease``
    scope; in ``worker`` scope oldest first, ``max_leases`` leases a batch."""
    # A full buffer cuts now, counting the lanes a cut can free: a lane whose write is slow (it
    # cannot cut) kept the buffer full, and every other lane was cut at each delivery.
    pressure = sum(x.nbytes for x in fresh) >= s.buffer_limit
    by_age = sorted(fresh, key=lambda x: x.oldest if x.oldest is not None else now)
    plans: list[Plan] = []
    if s.scope == "lease":
        for lane in by_age:
            if limit is not None and len(plans) >= limit:
                break
            if _due([lane], s, now, pressure):
                plans.append(Plan((lane,), budgeted=True))
        return plans
    size = s.max_leases
    for start in range(0, len(by_age), size):
        if limit is not None and len(plans) >= limit:
            break
        if not _due(by_age[start:], s, now, pressure):
            break  # the leases after it are younger: none of them is due either
        plans.append(Plan(tuple(by_age[start : start + size]), budgeted=True))
    return plans


def _may_come_back(
    lane: Lane | None, key: str, group: tuple[PieceKey, ...], expected: Callable[[str], bool]
) -> bool:
    """Whether the piece of lease ``key`` in ``group`` may still come back here: its open
    ``lane`` re-forms it, or the lease is held here and its lane not open yet. An open lane with
    nothing of ``group`` to re-form (its piece committed before a crash) never brings it:
    waiting for it held the others' pieces the whole ``regroup_wait``."""
    return expected(key) if lane is None else lane.reforms(group)


def _due(lanes: list[Lane], s: BatcherSettings, now: float, pressure: bool) -> bool:
    return (
        pressure
        or sum(x.rows for x in lanes) >= s.max_records
        or sum(x.nbytes for x in lanes) >= s.max_bytes
        or any(x.forced for x in lanes)
        or any(x.oldest is not None and now - x.oldest >= s.max_wait for x in lanes)
    )


def next_wakeup(lanes: Iterable[Lane], s: BatcherSettings, now: float) -> float:
    """Seconds until something may become due (capped at 1 s). Only lanes that can act count:
    a lane with a cut out, parked or closed has nothing due however old its records are."""
    lanes = list(lanes)
    cuttable = [x for x in lanes if x.can_cut()]
    times = [x.oldest + s.max_wait for x in cuttable if x.oldest is not None]
    times += [
        since + s.regroup_wait
        for x in cuttable
        if x.replay_ready and (since := x.replay_since) is not None
    ]
    times += [at for x in lanes if (at := x.commit_due_at) is not None and at != float("inf")]
    # Capped: a notification may be missed when the injected clock is not the OS's.
    return max(0.01, min([1.0, *(t - now for t in times)]))
