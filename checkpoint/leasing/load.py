"""Load-aware balancing: which lease a worker steals when the leases carry their throughput.

The KCL 3.x publishes each lease's read throughput as ``throughputKBps`` (an exponential moving
average, alpha 0.5, written at every renewal) and each worker's CPU, and its leader moves load from
workers more than 10% above the fleet's average to workers more than 10% below it, damped. Here
every worker decides for itself (the KCL 2.x shape of taking; the leader asks the same rule in
``lease_assignment = "leader"``), on the same figures, all read from the one scan it makes anyway:

* a lease's **weight** is its throughput plus ``FLOOR_KBPS`` (an idle lease still counts, so a fleet
  with no traffic balances by count), or the mean throughput of the measured leases plus the floor
  while a lease has not been measured yet (a new lease is assumed average);
* a worker's **load** is, by default, the sum of the weights of the live leases it owns (a lease
  being handed over counts for its new owner);
* **by CPU** instead, when every worker in the comparison publishes its CPU (percent of its
  cgroup-aware limit, process and children; ``CpuFigure``) and the fleet uses at least
  ``CPU_FLOOR`` percent on average: a worker's load is its CPU, and a lease costs its owner's CPU
  in proportion to its weight among the owner's leases. Below the floor every worker has CPU to
  spare and the bytes are balanced. Moving leases shifts CPU between workers but hardly changes
  the fleet's average, so the rule's own moves do not switch it between the two measures. A CPU
  figure counts only when it was measured over a window in which its worker started or ended no
  consumer (``settled``) and ended at least ``FleetCpu.settle`` after the scan last saw a lease
  come to it or leave it: while the stealer's or the victim's does not, nothing moves by load (so
  no move is judged on figures from before the last one; a third worker's churn holds nothing
  back), and two workers must differ by ``CPU_MIN_GAP`` points (measurement noise) as well as by
  the threshold;
* a worker more than ``threshold`` below the average steals from the most loaded worker, if that one
  is more than ``threshold`` above it: the heaviest lease whose cost is at most
  ``dampening`` times the gap between the two loads. The hot lease of a worker holding nothing
  else is never moved (its cost is the whole gap or more), and no move can be undone by the
  reverse move: each one takes cost ``w <= dampening * gap < gap`` from the heavier worker, so
  the sum of the squared loads falls with every move and balancing stops.

Pure: the scan and the figures in, the leases to steal out; randomness (ties) from the caller's
``rng``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from checkpoint.lease import Lease
from checkpoint.leasing.observer import ObservedLease, ObservedScan

FLOOR_KBPS = 1.0
THRESHOLD = 0.10  # the KCL 3.x reBalanceThresholdPercentage
DAMPENING = 0.6  # the KCL 3.x dampeningPercentage (in code)
CPU_FLOOR = 20.0  # percent: a fleet using less on average is balanced by throughput
CPU_MIN_GAP = 5.0  # percentage points: CPU figures closer than this are the same


@dataclass(frozen=True)
class CpuFigure:
    """A worker's CPU as its status record publishes it: percent of its limit over the last
    window (None before its first window ends), and whether its set of consumers stayed the same
    over that window."""

    percent: float | None
    settled: bool = True


@dataclass(frozen=True)
class FleetCpu:
    """What the load rule knows of the workers' CPU: their figures (from their status records)
    and how long after a worker's leases changed its figure still describes the leases before
    (``LeaseTiming.cpu_settle``; the scan's ``moved_at`` says when they changed)."""

    figures: Mapping[str, CpuFigure]
    settle: float = 0.0


@dataclass(frozen=True)
class LoadSteal:
    """The load rule's decision for one worker: what to steal from whom, and why."""

    steal: tuple[Lease, ...] = ()
    victim: str | None = None
    reason: str = ""
    loads: Mapping[str, float] = field(default_factory=dict)
    by_cpu: bool = False


@dataclass(frozen=True)
class _Measure:
    loads: dict[str, float]
    cost: dict[str, float]  # lease key -> what moving it moves
    unit: str
    min_gap: float
    by_cpu: bool
    unsettled: frozenset[str] = frozenset()  # workers whose figure predates their last change


def ema(previous: float | None, sample: float, alpha: float = 0.5) -> float:
    """The KCL 3.x's moving average of a lease's throughput (the first sample taken as is)."""
    return sample if previous is None else alpha * sample + (1 - alpha) * previous


def weights(leases: Sequence[Lease]) -> dict[str, float]:
    """Lease key -> weight: throughput (the measured mean where unmeasured) plus FLOOR_KBPS."""
    known = [x.throughput_kbps for x in leases if x.throughput_kbps is not None]
    mean = sum(known) / len(known) if known else 0.0
    return {
        x.lease_key: (mean if x.throughput_kbps is None else max(0.0, x.throughput_kbps))
        + FLOOR_KBPS
        for x in leases
    }


def has_load(scan: ObservedScan) -> bool:
    """Whether any live lease carries a throughput (else balance by count, the KCL 2.x rule)."""
    return any(o.lease.throughput_kbps is not None for o in _live(scan))


def _live(scan: ObservedScan) -> list[ObservedLease]:
    return [o for o in scan.leases if not o.available and o.owner is not None]


def measure(scan: ObservedScan, worker_id: str, fleet: FleetCpu | None) -> _Measure:
    """The loads and lease costs the rule compares: by CPU or by throughput (see the module)."""
    live = _live(scan)
    weight = weights([o.lease for o in live])
    loads: dict[str, float] = {worker_id: 0.0}
    for o in live:
        assert o.owner is not None
        loads[o.owner] = loads.get(o.owner, 0.0) + weight[o.key]
    bytes_ = _Measure(loads, weight, "KB/s", 0.0, by_cpu=False)
    cpu = fleet.figures if fleet is not None else {}
    if not cpu or any(w not in cpu for w in loads):
        return bytes_
    known = [p for w in loads if (p := cpu[w].percent) is not None]
    if not known or sum(known) / len(known) < CPU_FLOOR:
        return bytes_
    assert fleet is not None
    unsettled = frozenset(
        w for w in loads
        if not cpu[w].settled or cpu[w].percent is None
        or scan.now - scan.moved_at.get(w, -math.inf) < fleet.settle
    )  # fmt: skip
    percent = {w: cpu[w].percent or 0.0 for w in loads}
    cost = {}
    for o in live:
        assert o.owner is not None
        cost[o.key] = percent[o.owner] * weight[o.key] / loads[o.owner]
    return _Measure(percent, cost, "% CPU", CPU_MIN_GAP, by_cpu=True, unsettled=unsettled)


def plan_load_steal(
    scan: ObservedScan,
    worker_id: str,
    *,
    rng: random.Random,
    max_leases_to_steal: int = 1,
    threshold: float = THRESHOLD,
    dampening: float = DAMPENING,
    exclude: Collection[str] = (),
    cpu: FleetCpu | None = None,
) -> LoadSteal:
    """What ``worker_id`` should steal to even out the load (possibly nothing, with why);
    leases in ``exclude`` are never picked; ``cpu``: the running workers' CPU figures."""
    live = _live(scan)
    m = measure(scan, worker_id, cpu)
    loads, unit = m.loads, m.unit
    average = sum(loads.values()) / len(loads)
    mine = loads[worker_id]
    result = LoadSteal(loads=loads, by_cpu=m.by_cpu)
    if mine >= average * (1 - threshold):
        return _why(result, f"load {mine:.1f} {unit} is within {threshold:.0%} of the average "
                    f"{average:.1f} or above it")  # fmt: skip
    others = {w: n for w, n in loads.items() if w != worker_id}
    if not others:
        return _why(result, "nobody to steal load from")
    most = max(others.values())
    victim = rng.choice(sorted(w for w, n in others.items() if n == most))
    theirs = loads[victim]
    waiting = sorted(m.unsettled & {worker_id, victim})
    if waiting:  # the two a move would change: judged only on figures from after their last one
        return _why(result, f"CPU of {', '.join(waiting)} not yet measured over its current "
                    "leases: no move by load until it is")  # fmt: skip
    if theirs <= average * (1 + threshold):
        return _why(result, f"most loaded {victim} ({theirs:.1f} {unit}) is within "
                    f"{threshold:.0%} of the average {average:.1f}")  # fmt: skip
    if theirs - mine < m.min_gap:
        return _why(result, f"most loaded {victim} ({theirs:.1f} {unit}) is less than "
                    f"{m.min_gap:g} points above us ({mine:.1f})")  # fmt: skip
    candidates = [
        o.lease
        for o in live
        if o.owner == victim and not o.lease.handoff_pending and o.key not in exclude
    ]
    chosen = _heaviest_fitting(candidates, m.cost, mine, theirs, average, threshold, dampening,
                               max_leases_to_steal, rng)  # fmt: skip
    if not chosen:
        return LoadSteal((), victim, f"below the average load ({mine:.1f} of {average:.1f} "
                         f"{unit}) but no lease of {victim} ({theirs:.1f}) fits within "
                         f"{dampening:.0%} of the gap", loads, m.by_cpu)  # fmt: skip
    moved = sum(m.cost[x.lease_key] for x in chosen)
    return LoadSteal(tuple(chosen), victim, f"below the average load ({mine:.1f} of "
                     f"{average:.1f} {unit}): stealing {moved:.1f} {unit} from {victim} "
                     f"({theirs:.1f})", loads, m.by_cpu)  # fmt: skip


def _heaviest_fitting(
    candidates: list[Lease],
    cost: Mapping[str, float],
    mine: float,
    theirs: float,
    average: float,
    threshold: float,
    dampening: float,
    n: int,
    rng: random.Random,
) -> list[Lease]:
    """Up to ``n`` leases, each the heaviest whose cost fits ``dampening`` times the gap left."""
    chosen: list[Lease] = []
    for _ in range(n):
        gap = theirs - mine
        fitting = [x for x in candidates if cost[x.lease_key] <= dampening * gap]
        if not fitting or mine >= average * (1 - threshold):
            break
        heaviest = max(cost[x.lease_key] for x in fitting)
        pick = rng.choice(sorted((x for x in fitting if cost[x.lease_key] == heaviest), key=_key))
        chosen.append(pick)
        candidates.remove(pick)
        mine, theirs = mine + cost[pick.lease_key], theirs - cost[pick.lease_key]
    return chosen


def _key(lease: Lease) -> str:
    return lease.lease_key


def _why(result: LoadSteal, reason: str) -> LoadSteal:
    return LoadSteal(result.steal, result.victim, reason, result.loads, result.by_cpu)
