"""Leader assignment: which worker each free lease goes to, and which lease moves to even out the
load, decided by the one worker that leads (the KCL 3.x shape; ``lease_assignment = "leader"``).

The leader scans the table (its observer judges expiry exactly as a taker's does) and knows the
running workers from their status records. ``plan_assignments``:

1. ``targets``: the running workers (the leader included), less any that owns a lease this scan
   shows expired (it stopped renewing: dead, or stalled, and given nothing more until its leases
   move on). A worker owning live leases but not known as running (its status write failed) is
   counted in the loads but given nothing new.
2. **Free leases** (very old ones first, then the others available, each group in the taker's
   preference order): each goes to the target holding the fewest live leases at that point (ties
   at random) among those that consume its stream (``consumes``: what the workers' status records
   name; moves too), skipping targets at ``max_leases_for_worker``; a lease no target has room
   for is spillover (reported, left where it is). Nothing moves in a round that assigns.
3. **Moves**, when nothing was free: by load when the leases carry their throughput (the least
   loaded target asks what it would steal under ``plan_load_steal``'s rule: up to
   ``max_load_moves`` leases, all to it, none in ``keep``), else by count: one live lease of the
   most loaded target (not one being handed over already, nor one in ``keep``: assigned a
   moment ago and not yet taken) goes to the least loaded while the two differ by more than
   one; each target takes at most one a round (a giver may give several), at most ``max_moves``
   in all. Each move strictly lowers the sum of squared counts, so moves stop; none undoes
   another.

The caller writes each assignment as a take conditional on the counter seen (naming the target),
and each move as a graceful handoff to its target; a lost write just means the table changed.
Pure: randomness from the caller's ``rng``.

With ``lease_assignment = "auto"`` the leader decides from each of its scans whether to assign at
all (``leader_assigns``): from ``from_leases`` open leases and ``from_workers`` running workers
on (only the leader then scans the table; every other worker Queries the owner index), and back
to every worker taking for itself only when either falls below three quarters of its threshold,
so a fleet that hovers around a threshold does not switch back and forth.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from checkpoint.lease import Lease
from kclpy_spark.moves.rules.load import FleetCpu, has_load, plan_load_steal
from kclpy_spark.moves.rules.observer import ObservedLease, ObservedScan
from kclpy_spark.moves.rules.take_rule import UNLIMITED, preferred, stalled


@dataclass(frozen=True)
class Assignment:
    lease: Lease
    to: str


@dataclass(frozen=True)
class AssignPlan:
    assign: tuple[Assignment, ...] = ()  # free leases, each to a target (a take naming it)
    moves: tuple[Assignment, ...] = ()  # live leases, each to a target (a graceful handoff)
    reason: str = ""
    counts: dict[str, int] = field(default_factory=dict)  # targets' live leases, before the plan
    spillover: int = 0


def targets_of(scan: ObservedScan, running: Collection[str]) -> list[str]:
    """The running workers that own no lease this scan shows expired, sorted."""
    return sorted(set(running) - stalled(scan))


def quiet(scan: ObservedScan, after: float) -> set[str]:
    """The workers of ours holding leases in ``scan`` none of which is expired yet and none
    renewed for more than ``after`` seconds: killed or stalled a moment ago. A worker with a
    lease whose counter is unstamped is a KCL worker (dated only by the scans that saw its
    counters move): never judged so (a lease just moved to one still bears our stamp until its
    first renewal; ``Suspects.targets`` exempts the known ones too)."""
    latest: dict[str, float] = {}
    kcl: set[str] = set()
    for o in scan.leases:
        owner = o.lease.actual_owner
        if owner is None or o.available or o.last_change is None:
            continue
        if o.lease.write_time is None:
            kcl.add(owner)
        latest[owner] = max(latest.get(owner, o.last_change), o.last_change)
    return {worker for worker, at in latest.items() if scan.now - at > after} - kcl


class Suspects:
    """A worker's memory of the workers that stopped renewing. Once a stalled worker's leases
    have moved on, no scan shows it stalled any more, yet its status record stays fresh for two
    lease durations after it died: without this memory a leader would assign it leases again, a
    stopping worker would hand it its leases, and the take rule would count it in the even share;
    each lease given to it then waits a lease duration more. A suspect is a target again only
    once its status record has been written after it was suspected (it runs again), or when its
    record is gone. A worker whose leases the last scan shows unrenewed for more than
    ``quiet_after`` seconds (``quiet``: killed a moment ago, its leases not yet expired) is no
    target either while it stays so (a lease given to it in those seconds waited for its own
    expiry again), though still counted in the take rule's even share (a holder a moment slow
    would otherwise have its leases stolen)."""

    def __init__(self, quiet_after: float = float("inf")) -> None:
        self._since: dict[str, float] = {}  # worker -> its status time when suspected
        self._stalled: set[str] = set()  # stalled in the last scan shown
        self._quiet: set[str] = set()  # quiet in the last scan shown
        self._quiet_after = quiet_after

    def __contains__(self, worker: object) -> bool:
        """Suspected, or stalled in the last scan shown (a lease of it expired there)."""
        return worker in self._since or worker in self._stalled

    @property
    def quiet(self) -> frozenset[str]:
        """The workers quiet in the last scan shown (``quiet``)."""
        return frozenset(self._quiet)

    def observe(self, scan: ObservedScan, running: Mapping[str, float]) -> None:
        """Remember who ``scan`` shows stalled; ``running``: worker -> the time its status
        record was written."""
        self._quiet = quiet(scan, self._quiet_after)
        now_stalled = self._stalled = stalled(scan)
        for worker in now_stalled:
            if worker in running:
                self._since[worker] = max(running[worker], self._since.get(worker, running[worker]))
        self._since = {w: t for w, t in self._since.items() if w in running and running[w] <= t}

    def targets(
        self, scan: ObservedScan, running: Mapping[str, float], exempt: Collection[str] = ()
    ) -> list[str]:
        """The ``running`` workers not suspected nor quiet after ``scan`` (``observe``),
        sorted; those in ``exempt`` are never judged quiet (the leader itself, KCL workers)."""
        self.observe(scan, running)
        quiet_now = self._quiet - set(exempt)
        return sorted(w for w in running if w not in self and w not in quiet_now)


def plan_assignments(
    scan: ObservedScan,
    running: Collection[str],
    *,
    rng: random.Random,
    max_leases_for_worker: int = UNLIMITED,
    max_moves: int = 1,
    keep: Collection[str] = (),
    max_load_moves: int = 1,
    cpu: FleetCpu | None = None,
    foreign: Collection[str] = (),
    consumes: Mapping[str, frozenset[str]] | None = None,
) -> AssignPlan:
    """This round's assignments and moves over ``scan``, for the ``running`` workers; leases
    in ``keep`` (assigned a moment ago, not yet taken by their target) are not moved; ``cpu``:
    the workers' CPU figures (the load rule's). ``foreign``: workers of another KCL (Java KCL
    3.x, seen by their metrics entities): no lease moves from one of them to another, which
    their own leader balances by its own measure (two balancers over the same leases would
    move them back and forth). ``consumes``: the streams a worker says it consumes (one not
    named: every stream); no lease goes to a worker that does not consume its stream (it would
    not take it, and the lease would wait out its expiry unread)."""
    takes = Consumers(consumes or {})
    if max_moves < 0:
        raise ValueError(f"max_moves must be >= 0, got {max_moves}")
    targets = targets_of(scan, running)
    counts = {t: scan.count(t) for t in targets}
    base = AssignPlan(counts=dict(counts))
    if not targets:
        return AssignPlan(reason="no running worker to assign to", counts={})
    free = _free(scan, rng)
    if free:
        # A lease being handed over counts for its new owner, but its old owner runs it until
        # the handoff completes: at its cap meanwhile (given one, it gave it back, again and
        # again until the handoff was done).
        handing = Counter(o.lease.checkpoint_owner for o in scan.leases if o.lease.handoff_pending)
        full = {t for t in targets if counts[t] + handing[t] >= max_leases_for_worker}
        return _assign_free(free, counts, base, rng, max_leases_for_worker, takes, full)
    if max_moves == 0:
        return AssignPlan(reason="nothing free; moves off", counts=base.counts)
    if has_load(scan):
        moves = min(max_moves, max_load_moves)
        return _load_moves(
            scan, counts, base, rng, moves, max_leases_for_worker, set(keep), cpu, set(foreign),
            takes,
        )  # fmt: skip
    return _count_moves(
        scan, counts, base, rng, max_moves, max_leases_for_worker, set(keep), set(foreign), takes
    )


@dataclass(frozen=True)
class Consumers:
    """Which workers consume a lease's stream (``plan_assignments``' ``consumes``)."""

    streams: Mapping[str, frozenset[str]]

    def __call__(self, worker: str, lease: Lease) -> bool:
        said = self.streams.get(worker)
        return said is None or lease.stream_key is None or lease.stream_key in said


def _free(scan: ObservedScan, rng: random.Random) -> list[Lease]:
    very_old = scan.very_old
    old_keys = {o.key for o in very_old}
    rest = tuple(o for o in scan.available if o.key not in old_keys)
    return preferred(very_old, rng) + preferred(rest, rng)


def _least(counts: dict[str, int], rng: random.Random, cap: int) -> str | None:
    open_ = {t: n for t, n in counts.items() if n < cap}
    if not open_:
        return None
    fewest = min(open_.values())
    return rng.choice(sorted(t for t, n in open_.items() if n == fewest))


def _assign_free(
    free: list[Lease],
    counts: dict[str, int],
    base: AssignPlan,
    rng: random.Random,
    cap: int,
    takes: Consumers,
    full: Collection[str] = (),
) -> AssignPlan:
    chosen: list[Assignment] = []
    unconsumed = 0  # of a stream no running worker consumes
    for lease in free:
        consumers = {t: n if t not in full else cap for t, n in counts.items() if takes(t, lease)}
        to = _least(consumers, rng, cap)
        if to is None:
            unconsumed += not consumers
            continue
        counts[to] += 1
        chosen.append(Assignment(lease, to))
    spill = len(free) - len(chosen)
    reason = f"{len(chosen)} free lease(s) assigned to {len(set(a.to for a in chosen))} worker(s)"
    if spill > unconsumed:
        reason += f"; {spill - unconsumed} left: every worker at max_leases_for_worker ({cap})"
    if unconsumed:
        reason += f"; {unconsumed} left: no running worker consumes its stream"
    return AssignPlan(tuple(chosen), (), reason, base.counts, spill)


def _movable(scan: ObservedScan, owner: str, keep: set[str]) -> list[ObservedLease]:
    return [o for o in scan.held_by(owner) if not o.lease.handoff_pending and o.key not in keep]


def _count_moves(
    scan: ObservedScan,
    counts: dict[str, int],
    base: AssignPlan,
    rng: random.Random,
    max_moves: int,
    cap: int,
    keep: set[str],
    foreign: set[str],
    takes: Consumers,
) -> AssignPlan:
    """One lease at a time from the most loaded to the least loaded target (not two foreign
    ones; a lease of a stream it consumes), each target taking at most one a round (a giver may
    give several), while they differ by more than one."""
    moves: list[Assignment] = []
    takers = dict(counts)
    exhausted: set[str] = set()  # givers with nobody left to give to
    while len(moves) < max_moves:
        givers = {t: n for t, n in counts.items() if t not in exhausted}
        if not givers or not takers:
            break
        most = max(givers.values())
        giver = rng.choice(sorted(t for t, n in givers.items() if n == most))
        moved = {a.lease.lease_key for a in moves}
        movable = [o.lease for o in _movable(scan, giver, keep) if o.key not in moved]
        both_foreign = foreign if giver in foreign else set()
        # Whom it may give to: fewer by more than one, not foreign both, and consuming the stream
        # of one of its leases (else a giver with fewer may still give to it: another stream).
        to = _least(
            {t: counts[t] for t in takers
             if t != giver and t not in both_foreign and counts[giver] - counts[t] > 1
             and any(takes(t, x) for x in movable)},
            rng, cap,
        )  # fmt: skip
        if to is None:
            exhausted.add(giver)
            continue
        candidates = sorted((x for x in movable if takes(to, x)), key=_key)
        moves.append(Assignment(rng.choice(candidates), to))
        counts[giver] -= 1
        counts[to] += 1
        del takers[to]
    if not moves:
        return AssignPlan(reason="balanced by count", counts=base.counts)
    what = ", ".join(f"{a.lease.lease_key} {a.lease.lease_owner} -> {a.to}" for a in moves)
    return AssignPlan((), tuple(moves), f"evening out lease counts: {what}", base.counts)


def _load_moves(
    scan: ObservedScan,
    counts: dict[str, int],
    base: AssignPlan,
    rng: random.Random,
    max_moves: int,
    cap: int,
    keep: set[str],
    cpu: FleetCpu | None,
    foreign: set[str],
    takes: Consumers,
) -> AssignPlan:
    """The least loaded target (by count, then at random) asks the load rule what it would take
    (at most ``max_moves`` leases, all to it; none in ``keep``, none of a stream it does not
    consume)."""
    order = sorted(counts, key=lambda t: (counts[t], rng.random()))
    for thief in order:
        if counts[thief] >= cap:
            continue
        room = min(max_moves, cap - counts[thief])  # never past max_leases_for_worker
        not_consumed = {o.key for o in scan.leases if not takes(thief, o.lease)}
        decided = plan_load_steal(
            scan, thief, rng=rng, max_leases_to_steal=room, exclude=keep | not_consumed,
            cpu=cpu,
        )  # fmt: skip
        if thief in foreign and decided.victim in foreign:
            continue  # their own leader balances them
        if decided.steal and decided.victim in counts:
            moves = tuple(Assignment(lease, thief) for lease in decided.steal)
            return AssignPlan((), moves, f"{thief}: {decided.reason}", base.counts)
    return AssignPlan(reason="balanced by load", counts=base.counts)


def _key(lease: Lease) -> str:
    return lease.lease_key


def leader_assigns(
    assigning: bool, open_leases: int, workers: int, *, from_leases: int, from_workers: int
) -> bool:
    """Whether a leader in ``lease_assignment = "auto"`` assigns leases after a scan that saw
    ``open_leases`` and ``workers`` running workers (itself included); ``assigning``: whether
    it does now."""
    if assigning:
        return open_leases >= from_leases * 3 / 4 and workers >= from_workers * 3 / 4
    return open_leases >= from_leases and workers >= from_workers
