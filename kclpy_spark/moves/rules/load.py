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
  being handed over counts for its new owner); moving a lease takes its weight from one worker
  and gives the same to the other;
* **by CPU** instead (cpu_load.py), when every worker in the comparison publishes its CPU and the
  fleet uses at least ``CPU_FLOOR`` percent of its limits on average: a worker's load is its CPU;
  a lease costs its owner its share of the owner's CPU by weight and gives the receiver what its
  weight costs there. Below the floor every worker has CPU to spare and the bytes are balanced;
  moving leases hardly changes the fleet's average, so the rule's own moves do not switch it
  between the two. Between a quarter of the floor and the floor (5-20%), where every worker
  publishes CPU, a steal by bytes is judged on current figures as by CPU and takes no lease that
  would leave the thief more than ``CPU_NOISE`` busier by CPU than its victim (a fleet whose
  average wanders across the floor would otherwise move leases one way by CPU and back by bytes,
  as a first run of bench_cpu_balance.py did); an idle fleet's figures are polling and noise, and
  there the bytes alone decide. Only current
  figures count (measured over a window that began after the worker's last lease move, see
  cpu_load.current): the thief waits while its own is not, and steals from the busiest worker
  whose figure is; two workers must differ by ``CPU_MIN_GAP`` points as well as by the
  threshold;
* a worker more than ``threshold`` below the average steals from the most loaded worker, if that one
  is more than ``threshold`` above it: the heaviest lease that takes from the victim, and gives
  the thief, at most ``dampening`` times the gap between the two loads. The hot lease of a worker
  holding nothing else is never moved (its cost is the whole gap or more). Every move lowers the
  larger of the two loads and leaves the other below where the larger was, so the loads sorted
  from the largest fall (lexicographically) with every move, on the figures the moves are judged
  by: balancing stops, and no move is undone by its reverse (by bytes, where a lease takes from
  one what it gives the other, the sum of the squared loads falls too).

Pure: the scan and the figures in, the leases to steal out; randomness (ties) from the caller's
``rng``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from checkpoint.coordination import CpuFigure
from checkpoint.lease import Lease
from kclpy_spark.moves.rules.cpu_load import (
    CPU_FLOOR,
    CPU_MIN_GAP,
    CPU_NOISE,
    FleetCpu,
    current,
    percents,
    receiver_gain,
)
from kclpy_spark.moves.rules.observer import ObservedLease, ObservedScan

__all__ = ["CpuFigure", "FleetCpu", "LoadSteal", "ema", "has_load", "plan_load_steal", "weights"]

FLOOR_KBPS = 1.0
THRESHOLD = 0.10  # the KCL 3.x reBalanceThresholdPercentage
GUARD_FROM = 0.25  # of CPU_FLOOR: a fleet using less is idle, and the bytes alone decide
DAMPENING = 0.6  # the KCL 3.x dampeningPercentage (in code)


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
    cost: dict[str, float]  # lease key -> what moving it takes from its owner
    unit: str
    min_gap: float
    by_cpu: bool
    weights: dict[str, float]  # lease key -> weight
    held: dict[str, float]  # worker -> the weight it holds
    figures: Mapping[str, CpuFigure] = field(default_factory=dict)  # current figures
    guarded: bool = False  # by bytes, but every worker publishes CPU and the fleet is not idle

    def gain(self, lease: Lease, giver: str, receiver: str) -> float:
        """What moving ``lease`` from ``giver`` would add to ``receiver``'s load."""
        cost = self.cost[lease.lease_key]
        if not self.by_cpu:
            return cost
        weight = self.weights[lease.lease_key]
        return receiver_gain(weight, cost, giver, receiver, self.loads, self.held, self.figures)

    def current(self, worker: str) -> bool:
        return not (self.by_cpu or self.guarded) or self.figures[worker].settled

    def flips_cpu(self, lease: Lease, giver: str, receiver: str) -> bool:
        """By bytes, where both publish CPU: whether the move would leave the receiver busier by
        CPU than the giver, by more than ``CPU_NOISE`` (balancing by CPU, when the fleet is busy
        again, would move it back: it needs the two ``CPU_MIN_GAP`` points apart, so traffic
        would have to grow fivefold first). At 1-2% CPU, where figures are mostly noise and
        polling, the bytes still decide."""
        a, b = self.figures.get(receiver), self.figures.get(giver)
        if not self.guarded or a is None or b is None or a.percent is None or b.percent is None:
            return False
        if self.held.get(receiver, 0.0) == 0:
            return False  # a worker holding nothing always gets its first lease
        weight, held = self.weights[lease.lease_key], self.held.get(giver, 0.0)
        cost = b.percent * weight / held if held > 0 else 0.0
        percent = {receiver: a.percent, giver: b.percent}
        gain = receiver_gain(weight, cost, giver, receiver, percent, self.held, self.figures)
        return a.percent + gain > b.percent - cost + CPU_NOISE


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
    held: dict[str, float] = {worker_id: 0.0}
    for o in live:
        assert o.owner is not None
        held[o.owner] = held.get(o.owner, 0.0) + weight[o.key]
    figures = current(fleet, scan.moved_at, scan.now) if fleet is not None else {}
    bytes_ = _Measure(dict(held), weight, "KB/s", 0.0, False, weight, held, figures)
    if not figures or any(w not in figures for w in held):
        return bytes_
    percent = percents(figures, list(held))
    average = sum(percent.values()) / len(percent)
    if average < CPU_FLOOR:
        return replace(bytes_, guarded=average >= CPU_FLOOR * GUARD_FROM)
    cost = {}
    for o in live:
        assert o.owner is not None
        cost[o.key] = percent[o.owner] * weight[o.key] / held[o.owner]
    return _Measure(percent, cost, "% CPU", CPU_MIN_GAP, True, weight, held, figures)


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
    m = measure(scan, worker_id, cpu)
    loads, unit = m.loads, m.unit
    average = sum(loads.values()) / len(loads)
    mine = loads[worker_id]
    result = LoadSteal(loads=loads, by_cpu=m.by_cpu)
    if not m.current(worker_id):
        return _why(result, "our CPU figure was measured before our leases last changed: no "
                    "move by load until it is current again")  # fmt: skip
    if mine >= average * (1 - threshold):
        return _why(result, f"load {mine:.1f} {unit} is within {threshold:.0%} of the average "
                    f"{average:.1f} or above it")  # fmt: skip
    live = _live(scan)
    # Only a worker holding a lease we may take (another stream's are excluded) is a victim.
    holding = {
        o.owner for o in live if o.owner and not o.lease.handoff_pending and o.key not in exclude
    }
    victim = _victim(m, worker_id, rng, holding)
    if victim is None:
        return _why(result, "nobody to steal load from who holds a lease we may take and whose "
                    "CPU figure is current")  # fmt: skip
    theirs = loads[victim]
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
    chosen = _heaviest_fitting(m, candidates, worker_id, victim, average * (1 - threshold),
                               dampening, max_leases_to_steal, rng)  # fmt: skip
    if not chosen:
        return LoadSteal((), victim, f"below the average load ({mine:.1f} of {average:.1f} "
                         f"{unit}) but no lease of {victim} ({theirs:.1f}) fits within "
                         f"{dampening:.0%} of the gap", loads, m.by_cpu)  # fmt: skip
    moved = sum(m.cost[x.lease_key] for x in chosen)
    return LoadSteal(tuple(chosen), victim, f"below the average load ({mine:.1f} of "
                     f"{average:.1f} {unit}): stealing {moved:.1f} {unit} from {victim} "
                     f"({theirs:.1f})", loads, m.by_cpu)  # fmt: skip


def _victim(
    m: _Measure, worker_id: str, rng: random.Random, holding: Collection[str]
) -> str | None:
    """The most loaded other worker in ``holding`` whose figure is current (ties at random)."""
    others = {w: n for w, n in m.loads.items() if w != worker_id and w in holding and m.current(w)}
    if not others:
        return None
    most = max(others.values())
    return rng.choice(sorted(w for w, n in others.items() if n == most))


def _heaviest_fitting(
    m: _Measure,
    candidates: list[Lease],
    thief: str,
    victim: str,
    below: float,
    dampening: float,
    n: int,
    rng: random.Random,
) -> list[Lease]:
    """Up to ``n`` leases, each the heaviest (by what it takes from the victim) whose move takes
    from the victim and gives the thief at most ``dampening`` times the gap left; none once the
    thief is no longer ``below``."""
    chosen: list[Lease] = []
    mine, theirs = m.loads[thief], m.loads[victim]
    for _ in range(n):
        gap = theirs - mine
        moves = [(x, m.cost[x.lease_key], m.gain(x, victim, thief)) for x in candidates]
        fitting = [
            (x, g, r) for x, g, r in moves
            if max(g, r) <= dampening * gap and not m.flips_cpu(x, victim, thief)
        ]  # fmt: skip
        if not fitting or mine >= below:
            break
        heaviest = max(g for _, g, _ in fitting)
        pick, g, r = rng.choice(sorted((t for t in fitting if t[1] == heaviest), key=_first_key))
        chosen.append(pick)
        candidates.remove(pick)
        mine, theirs = mine + r, theirs - g
    return chosen


def _first_key(t: tuple[Lease, float, float]) -> str:
    return t[0].lease_key


def _why(result: LoadSteal, reason: str) -> LoadSteal:
    return LoadSteal(result.steal, result.victim, reason, result.loads, result.by_cpu)
