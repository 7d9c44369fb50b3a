"""Load-aware balancing: which lease a worker steals when the leases carry their throughput.

The KCL 3.x publishes each lease's read throughput as ``throughputKBps`` (an exponential moving
average, alpha 0.5, written at every renewal) and its leader moves load from workers more than 10%
above the fleet's average to workers more than 10% below it, damped. Here every worker decides for
itself (the KCL 2.x shape of taking), on the same figures, all read from the one scan it makes
anyway:

* a lease's **weight** is its throughput plus ``FLOOR_KBPS`` (an idle lease still counts, so a fleet
  with no traffic balances by count), or the mean throughput of the measured leases plus the floor
  while a lease has not been measured yet (a new lease is assumed average);
* a worker's **load** is the sum of the weights of the live leases it owns (a lease being handed
  over counts for its new owner);
* a worker more than ``threshold`` below the average steals from the most loaded worker, if that one
  is more than ``threshold`` above it: the heaviest lease whose weight is at most
  ``dampening`` times the gap between the two loads. The hot lease of a worker holding nothing
  else is never moved (its weight is the whole gap or more), and no move can be undone by the
  reverse move: each one takes weight ``w <= dampening * gap < gap`` from the heavier worker, so
  the sum of the squared loads falls with every move and balancing stops.

Pure: the scan in, the leases to steal out; randomness (ties) from the caller's ``rng``.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from checkpoint.lease import Lease
from checkpoint.leasing.observer import ObservedLease, ObservedScan

FLOOR_KBPS = 1.0
THRESHOLD = 0.10  # the KCL 3.x reBalanceThresholdPercentage
DAMPENING = 0.6  # the KCL 3.x dampeningPercentage (in code)


@dataclass(frozen=True)
class LoadSteal:
    """The load rule's decision for one worker: what to steal from whom, and why."""

    steal: tuple[Lease, ...] = ()
    victim: str | None = None
    reason: str = ""
    loads: Mapping[str, float] = field(default_factory=dict)


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


def plan_load_steal(
    scan: ObservedScan,
    worker_id: str,
    *,
    rng: random.Random,
    max_leases_to_steal: int = 1,
    threshold: float = THRESHOLD,
    dampening: float = DAMPENING,
    exclude: Collection[str] = (),
) -> LoadSteal:
    """What ``worker_id`` should steal to even out the load (possibly nothing, with why);
    leases in ``exclude`` are never picked."""
    live = _live(scan)
    weight = weights([o.lease for o in live])
    loads: dict[str, float] = {worker_id: 0.0}
    for o in live:
        assert o.owner is not None
        loads[o.owner] = loads.get(o.owner, 0.0) + weight[o.key]
    average = sum(loads.values()) / len(loads)
    mine = loads[worker_id]
    result = LoadSteal(loads=loads)
    if mine >= average * (1 - threshold):
        return _why(result, f"load {mine:.1f} KB/s is within {threshold:.0%} of the average "
                    f"{average:.1f} or above it")  # fmt: skip
    others = {w: n for w, n in loads.items() if w != worker_id}
    if not others:
        return _why(result, "nobody to steal load from")
    most = max(others.values())
    victim = rng.choice(sorted(w for w, n in others.items() if n == most))
    theirs = loads[victim]
    if theirs <= average * (1 + threshold):
        return _why(result, f"most loaded {victim} ({theirs:.1f} KB/s) is within {threshold:.0%} "
                    f"of the average {average:.1f}")  # fmt: skip
    candidates = [
        o.lease
        for o in live
        if o.owner == victim and not o.lease.handoff_pending and o.key not in exclude
    ]
    chosen: list[Lease] = []
    for _ in range(max_leases_to_steal):
        gap = theirs - mine
        fitting = [x for x in candidates if weight[x.lease_key] <= dampening * gap]
        if not fitting or mine >= average * (1 - threshold):
            break
        heaviest = max(weight[x.lease_key] for x in fitting)
        pick = rng.choice(sorted((x for x in fitting if weight[x.lease_key] == heaviest), key=_key))
        chosen.append(pick)
        candidates.remove(pick)
        mine, theirs = mine + weight[pick.lease_key], theirs - weight[pick.lease_key]
    if not chosen:
        return LoadSteal((), victim, f"below the average load ({mine:.1f} of {average:.1f} KB/s) "
                         f"but no lease of {victim} ({theirs:.1f}) fits within {dampening:.0%} "
                         "of the gap", loads)  # fmt: skip
    moved = sum(weight[x.lease_key] for x in chosen)
    return LoadSteal(tuple(chosen), victim, f"below the average load ({loads[worker_id]:.1f} of "
                     f"{average:.1f} KB/s): stealing {moved:.1f} KB/s from {victim} "
                     f"({loads[victim]:.1f})", loads)  # fmt: skip


def _key(lease: Lease) -> str:
    return lease.lease_key


def _why(result: LoadSteal, reason: str) -> LoadSteal:
    return LoadSteal(result.steal, result.victim, reason, result.loads)
