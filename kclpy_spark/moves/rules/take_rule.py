"""Which leases a worker should take or steal: the KCL 2.x lease taker's decision, as a function.

``plan_takes`` follows DynamoDBLeaseTaker.computeLeasesToTake / chooseLeasesToSteal:

1. ``workers`` = the owners of live (renewed, unexpired) leases, plus this worker;
   ``target`` = 1 if workers >= leases, else ceil(leases / workers), capped at
   ``max_leases_for_worker`` (leases over the cap are "spillover": nobody may take them).
2. If any lease is very old (counter unchanged for 3 lease durations, or never renewed), take those
   first, in random order, up to ``max_leases_for_worker - mine``, ignoring the target; nothing else
   happens in that round (as in the KCL, even when the cap leaves room for none). Unlike the KCL,
   at most this worker's share of them: ``ceil(very_old / k)``, ``k`` the workers holding no more
   live leases than this one (itself included; they are the ones that take next) plus the other
   workers known to run (``workers``: their status records) that hold none and process no lease
   this scan shows expired. On a fresh table every lease is very old (never renewed), and the
   KCL's first worker to scan takes them all; here workers started together split them in their
   first rounds. Known workers count only here, not in the target: one that runs but never
   takes (it cannot open its stream, say) only slows the very old leases' split by a round or
   two, and never holds back the expired leases of a dead worker.
3. Otherwise, below target, take up to ``target - mine`` available (unowned or expired) leases in
   random order.
4. If none is available and we are still below target, steal from the single most-loaded worker:
   ``n = min(needed, theirs - target)``, or 1 if ``needed > 1`` and ``theirs == target``, at most
   ``max_leases_to_steal``. Nothing is stolen from a worker at target when we need only one.

Two deliberate differences from the KCL:

* **SHARD_END leases are skipped.** The KCL counts them and takes them; the consumer it starts for
  one sees the SHARD_END checkpoint and soon shuts down, having only (re)created child leases and
  queued the lease for cleanup. Here they are not processing work: they are left out of the lease
  and worker counts (a worker holding only finished leases is no worker) and never taken, so they
  cannot skew the fair share or make a worker steal to reach a target inflated by dead shards.
  Creating child leases and deleting finished leases is shard sync's and lease cleanup's job.
* **Steal cooldown (damping).** Does the KCL's rule thrash by itself? With 2 workers and 3 leases
  the target is 2; the worker with 1 needs 1 and the other has exactly the target, so it does not
  steal: 2/1 is stable. In general, with every worker seeing the same counts, each steal moves a
  lease from a worker holding at least 2 more than the thief, so the sum of squared loads falls with
  every steal and stealing must stop. The rule's "theirs > target, or theirs == target and we are
  at least 2 below it" is already the minimal no-ping-pong condition, so we keep it unchanged.
  Owners still change back and forth in two ways: several workers stealing from the same victim
  in the same moment can push it below target, so it steals back; and a worker whose renewals
  stalled (a GC pause, a blocked event loop, throttling) has its leases taken as expired, then
  steals them back as soon as it recovers. Each round trip restarts processing on that shard and
  replays the records since its last checkpoint. So a worker that has seen one of its leases taken
  by another worker within ``steal_cooldown`` seconds does not steal (``LeaseTiming.steal_cooldown``
  is two take intervals). It still takes available leases at once: unowned work always goes first.
  ``steal_cooldown=0`` gives the KCL's behaviour exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass, replace

from checkpoint.lease import Lease
from kclpy_spark.moves.rules.load import FleetCpu, has_load, plan_load_steal
from kclpy_spark.moves.rules.observer import ObservedLease, ObservedScan

# The KCL's default maxLeasesForWorker (Integer.MAX_VALUE): no cap.
UNLIMITED = 2**31 - 1


@dataclass(frozen=True)
class TakePlan:
    """What one taker round should try, and the numbers it was decided on (for logs and metrics).

    ``take``: available leases (unowned, expired, very old). ``steal``: live leases of ``victim``.
    Each is taken with a conditional write on the counter seen in the scan; losing it is normal.
    """

    take: tuple[Lease, ...] = ()
    steal: tuple[Lease, ...] = ()
    reason: str = ""
    target: int = 0
    mine: int = 0
    workers: int = 0
    total: int = 0
    victim: str | None = None
    spillover: int = 0  # leases over max_leases_for_worker in our share: warn, they may starve

    @property
    def leases(self) -> tuple[Lease, ...]:
        return self.take + self.steal


def _shuffled(observed: tuple[ObservedLease, ...], rng: random.Random) -> list[Lease]:
    # Sort first so that the order depends only on the seed, not on the scan's order.
    leases = sorted((o.lease for o in observed), key=lambda lease: lease.lease_key)
    rng.shuffle(leases)
    return leases


def _preference(observed: ObservedLease) -> int:
    """Which available leases to take first (Data Prepper's source-coordination order): those
    whose owner stopped renewing (work stalled now), then parked leases whose reopen time has come
    (they waited already), then never-owned ones."""
    if observed.lease.lease_owner is not None:
        return 0
    if observed.lease.closed_count > 0:
        return 1
    return 2


def preferred(observed: tuple[ObservedLease, ...], rng: random.Random) -> list[Lease]:
    """Available leases in preference order; random within each group (as the KCL shuffles)."""
    groups: dict[int, list[ObservedLease]] = {}
    for o in observed:
        groups.setdefault(_preference(o), []).append(o)
    return [lease for rank in sorted(groups) for lease in _shuffled(tuple(groups[rank]), rng)]


def stalled(scan: ObservedScan) -> set[str]:
    """The workers processing a lease this scan shows expired (its actual owner: the old owner
    mid-handoff): they stopped renewing."""
    return {o.lease.actual_owner for o in scan.available if o.lease.actual_owner is not None}


def plan_takes(
    scan: ObservedScan,
    worker_id: str,
    *,
    max_leases_for_worker: int = UNLIMITED,
    max_leases_to_steal: int = 1,
    rng: random.Random,
    steal_cooldown: float = 0.0,
    workers: Collection[str] = (),
    cpu: FleetCpu | None = None,
) -> TakePlan:
    """Decide this round's takes for ``worker_id`` from ``scan``; ``workers``: the other
    workers known to run, whatever they hold; ``cpu``: the running workers' CPU figures (the
    load rule's, see load.py). Pure: randomness from ``rng``."""
    if max_leases_for_worker < 1:
        raise ValueError(f"max_leases_for_worker must be >= 1, got {max_leases_for_worker}")
    if max_leases_to_steal < 1:
        raise ValueError(f"max_leases_to_steal must be >= 1, got {max_leases_to_steal}")
    total = scan.total
    if total == 0:
        return TakePlan(reason="no lease with work left")
    counts = dict(scan.owner_counts)
    counts.setdefault(worker_id, 0)
    n_workers = len(counts)
    if n_workers == 1:  # nobody else holds a lease (a cold start, a resume): the known count
        # (alone, the first worker to scan took every lease; the others then stole back one a
        # round, a processor restart each)
        n_workers += len(set(workers) - stalled(scan) - {worker_id})
    target = 1 if n_workers >= total else math.ceil(total / n_workers)
    spillover = max(0, target - max_leases_for_worker)
    target = min(target, max_leases_for_worker)
    mine = counts[worker_id]
    base = TakePlan(target=target, mine=mine, workers=n_workers, total=total, spillover=spillover)

    if scan.very_old:
        sharing = sum(1 for n in counts.values() if n <= mine)
        sharing += len(set(workers) - stalled(scan) - set(counts))  # known, holding nothing
        return _plan_very_old(scan, base, sharing, max_leases_for_worker, rng)

    needed = target - mine
    available = scan.available
    if needed > 0 and available:
        chosen = tuple(preferred(available, rng)[:needed])
        return replace(
            base,
            take=chosen,
            reason=f"below target ({mine} of {target}): taking {len(chosen)} of "
            f"{len(available)} available lease(s)",
        )
    if has_load(scan):  # the leases carry their throughput: steal by load, not by count
        if mine >= max_leases_for_worker:
            return replace(base, reason=f"at max_leases_for_worker ({mine})")
        steal = min(max_leases_to_steal, max_leases_for_worker - mine)
        return _plan_load_steal(scan, worker_id, base, steal, rng, steal_cooldown, cpu)
    if needed <= 0:
        return replace(base, reason=f"at target: {mine} of {target}")
    return _plan_steal(
        scan, worker_id, base, counts, needed, max_leases_to_steal, rng, steal_cooldown
    )


def _plan_very_old(
    scan: ObservedScan,
    base: TakePlan,
    sharing: int,
    max_leases_for_worker: int,
    rng: random.Random,
) -> TakePlan:
    very_old, mine = scan.very_old, base.mine
    share = math.ceil(len(very_old) / sharing)
    room = max(0, min(max_leases_for_worker - mine, len(very_old), share))
    chosen = tuple(preferred(very_old, rng)[:room])
    return replace(
        base,
        take=chosen,
        reason=f"{len(very_old)} very old lease(s) first (never renewed, or not for the"
        f" very-old time); taking {len(chosen)}: our share of them, under"
        f" max {max_leases_for_worker}",
    )


def _plan_load_steal(
    scan: ObservedScan,
    worker_id: str,
    base: TakePlan,
    max_leases_to_steal: int,
    rng: random.Random,
    steal_cooldown: float,
    cpu: FleetCpu | None,
) -> TakePlan:
    decided = plan_load_steal(
        scan, worker_id, rng=rng, max_leases_to_steal=max_leases_to_steal, cpu=cpu
    )
    if not decided.steal:
        return replace(base, reason=decided.reason)
    lost_at = scan.taken_from.get(worker_id)
    if steal_cooldown > 0 and lost_at is not None and scan.now - lost_at < steal_cooldown:
        ago = scan.now - lost_at
        return replace(base, reason=f"{decided.reason}; but not now: a lease was taken from us "
                       f"{ago:.1f} s ago (cooldown {steal_cooldown:.1f} s)")  # fmt: skip
    return replace(base, steal=decided.steal, victim=decided.victim, reason=decided.reason)


def _plan_steal(
    scan: ObservedScan,
    worker_id: str,
    base: TakePlan,
    counts: dict[str, int],
    needed: int,
    max_leases_to_steal: int,
    rng: random.Random,
    steal_cooldown: float,
) -> TakePlan:
    target = base.target
    others = {w: n for w, n in counts.items() if w != worker_id}
    if not others:
        return replace(base, reason=f"below target ({base.mine} of {target}), nobody to steal from")
    most = max(others.values())
    # Ties broken at random so that several thieves do not all pick the same victim.
    victim = rng.choice(sorted(w for w, n in others.items() if n == most))
    theirs = others[victim]
    n = 0
    if theirs >= target:
        n = min(needed, theirs - target)
        if needed > 1 and n == 0:
            n = 1
        n = min(n, max_leases_to_steal)
    if n <= 0:
        return replace(
            base,
            reason=f"below target ({base.mine} of {target}) but not stealing: most loaded "
            f"{victim} has {theirs} and we need {needed}",
        )
    lost_at = scan.taken_from.get(worker_id)
    if steal_cooldown > 0 and lost_at is not None and scan.now - lost_at < steal_cooldown:
        return replace(
            base,
            reason=f"below target ({base.mine} of {target}) but not stealing: a lease was taken "
            f"from us {scan.now - lost_at:.1f} s ago (cooldown {steal_cooldown:.1f} s)",
        )
    # A lease already being handed over (to its owner here) is not stolen again.
    candidates = tuple(o for o in scan.held_by(victim) if not o.lease.handoff_pending)
    chosen = tuple(_shuffled(candidates, rng)[:n])
    return replace(
        base,
        steal=chosen,
        victim=victim,
        reason=f"below target ({base.mine} of {target}), nothing available: stealing "
        f"{len(chosen)} from most loaded {victim} ({theirs} leases)",
    )
