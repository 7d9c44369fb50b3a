"""The workers' CPU as a load measure for load.py: what each worker publishes, when a figure is
current, and what moving a lease costs its giver and gives its receiver, in percent of each one's
own CPU limit.

* A worker publishes (status record) the percent of its CPU limit its process and children used
  over the last window, when that window began (its wall clock), its limit (CPUs), and whether it
  started or ended no consumer during the window (``settled``).
* A figure is **current** when it is settled and its window began after this worker's scan last
  saw a lease come to that worker or leave it (``ObservedScan.moved_at``, its own takes and a
  pending handoff's two sides included), plus the clock skew allowed: a figure from before a move
  would make the next move overshoot, and leases would go back and forth.
* A lease's **cost** on its owner is the owner's CPU times the lease's share of the owner's
  weight (throughput plus a floor, load.weights). What it would **give** the receiver is its
  weight times the receiver's own percent per unit of weight (a slower or smaller worker pays more
  for the same bytes), or, for a receiver holding less than half the giver's weight, the cost
  converted by the two limits.

Pure: figures and times in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from checkpoint.coordination import CpuFigure

CPU_FLOOR = 20.0  # percent: a fleet using less on average is balanced by throughput
CPU_MIN_GAP = 5.0  # percentage points: CPU figures closer than this are the same
CPU_NOISE = 1.0  # percentage points a steal by bytes may leave the thief above its victim


@dataclass(frozen=True)
class FleetCpu:
    """What the load rule knows of the workers' CPU: their figures (from their status records),
    the wall time of the scan the rule judges (``ObservedScan.now`` on the wall clock) and the
    clock skew allowed between two workers."""

    figures: Mapping[str, CpuFigure]
    wall: float | None = None
    skew: float = 0.0


def current(fleet: FleetCpu, moved_at: Mapping[str, float], now: float) -> dict[str, CpuFigure]:
    """The figures, each marked unsettled unless its window began after the last move of one of
    its worker's leases that the scan saw (``moved_at``, on the same clock as ``now``)."""
    out: dict[str, CpuFigure] = {}
    for worker, figure in fleet.figures.items():
        moved = moved_at.get(worker)
        stale = moved is not None and (
            fleet.wall is None
            or figure.since is None
            or figure.since < fleet.wall - (now - moved) + fleet.skew
        )
        out[worker] = replace(figure, settled=False) if stale else figure
    return out


def percents(figures: Mapping[str, CpuFigure], workers: list[str]) -> dict[str, float]:
    """Each worker's percent; one without a figure yet counts as the average of the others."""
    known = [p for w in workers if (p := figures[w].percent) is not None]
    average = sum(known) / len(known) if known else 0.0
    return {
        w: average if figures[w].percent is None else figures[w].percent or 0.0 for w in workers
    }


def receiver_gain(
    weight: float,
    cost: float,
    giver: str,
    receiver: str,
    percent: Mapping[str, float],
    weights: Mapping[str, float],
    figures: Mapping[str, CpuFigure],
) -> float:
    """What a lease of ``weight`` (costing ``cost`` on ``giver``) would add to ``receiver``'s
    percent: its weight at the receiver's own percent per unit of weight, or, when the receiver
    holds too little to judge by (less than half the giver's weight: its idle CPU would count
    as the leases'), the cost scaled by the giver's limit over the receiver's."""
    held = weights.get(receiver, 0.0)
    if held >= 0.5 * weights.get(giver, 0.0) and held > 0 and percent[receiver] > 0:
        return weight * percent[receiver] / held
    giver_limit, receiver_limit = figures[giver].limit, figures[receiver].limit
    if giver_limit and receiver_limit:
        return cost * giver_limit / receiver_limit
    return cost
