"""Leader assignment at run time (``lease_assignment = "leader"``, the KCL 3.x shape; or
``"auto"``, the default: from the fleet size on where it costs fewer capacity units).

Each round a worker plays one of three roles:

* **leader** (it holds the shard-sync leadership): one scan of the table (leases and status
  records), the same expiry judgement and timed reads as a taker's, then ``plan_assignments``:
  each free lease is written to its target with a take conditional on the counter seen
  (``take_lease(lease, target)``: the old owner is fenced off as by any take), each move begins a
  graceful handoff to its target. Before every write it checks that it still leads: a leader
  whose leadership lapsed mid-round stops, and a write planned on a stale scan loses its
  condition.
* **led** (another worker leads, its record seen moving): no scan. Every renewal interval it
  Queries the owner index for its own lease keys (``list_lease_keys_by_owner``), reads the few it
  does not run, and takes each that is its own to take (a write of its own, so its tenure counts
  from it) or watches a handoff to it. A lease assigned to a dead worker is never renewed and
  expires again; the leader gives it to another.
* **worker** (nobody leads: a leader just died, or the table does not answer; or the leader does
  not assign, its record says, while a fleet changes the setting): the KCL 2.x round, as with
  ``lease_assignment = "worker"``, until a leader that assigns leads. In a job
  (``--until-caught-up``) always.

The leader record is renewed every third of the failover time and lapses after one failover
time in this mode, so a dead leader's own leases move about one failover time later than a
worker's: a new leader is elected, then it scans and assigns them.

With ``"auto"`` the leader decides after each of its scans (``leader_assigns``: from
``auto_assignment_leases`` open leases and ``auto_assignment_workers`` running workers on) and
says so in its record from its next tick (a switch is written at once, within a sixth of the
record's life); until the record says it, it takes as a worker and
nobody follows it. Its record then lives one failover time, as in ``"leader"`` mode; while it
does not assign, three (leadership then only syncs shards).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from checkpoint.base.clock import Clock
from checkpoint.base.errors import InvalidStateError
from checkpoint.lease import Lease
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.port import CoordinationStore
from kclpy_spark.config import WorkerConfig
from kclpy_spark.moves.rules.assign_rule import (
    Consumers,
    Suspects,
    leader_assigns,
    plan_assignments,
)
from shard_sync.leader import LeaderElection

if TYPE_CHECKING:
    from kclpy_spark.moves.lease_worker import LeaseWorker
    from kclpy_spark.moves.rules.cpu_load import FleetCpu
    from kclpy_spark.moves.rules.observer import LeaseObserver, ObservedScan

log = logging.getLogger(__name__)

# Where leader assignment saves a fleet on DynamoDB something worth a change of setting
# (simulated for both modes: BENCHMARKS.md, "Where leader mode starts to pay"): from about this
# many open leases and running workers it costs 11-12% fewer capacity units than every worker
# scanning (about 2% of the bill, a write unit being priced as five read units), and more
# with every worker (at 50 workers: 54% fewer units, 20% of the bill). Below, leader mode
# saves at most 7% of the units (64 leases, 8 workers) and 1% of the bill, and for small
# tables the default is cheaper. The leases counted are the open ones (a Scan also pays for
# finished leases and status records), so the hint errs on the quiet side.
# The same figures are the defaults of "auto" (WorkerConfig.auto_assignment_leases / _workers).
LEADER_PAYS_LEASES = WorkerConfig.auto_assignment_leases
LEADER_PAYS_WORKERS = WorkerConfig.auto_assignment_workers
# A key of ours that we read and did not take (finished, parked, of a stream we do not consume)
# is read again only after this many seconds.
DECLINED_FOR = 30.0
# Without the owner index, workers take for themselves this long before looking again.
NO_INDEX_RETRY = 300.0


class LedTaker(Protocol):
    """What the leader-assignment roles use of their worker's taker (``taking.Taker``)."""

    @property
    def worker(self) -> LeaseWorker: ...
    @property
    def observer(self) -> LeaseObserver: ...
    @property
    def running(self) -> dict[str, float]: ...
    @property
    def cpu(self) -> FleetCpu: ...
    @property
    def foreign(self) -> frozenset[str]: ...
    @property
    def consumes(self) -> Consumers: ...
    @property
    def suspects(self) -> Suspects: ...
    @property
    def io(self) -> Callable[..., Awaitable[Any]]: ...
    async def scan(self) -> ObservedScan | None: ...
    async def adopt(self, leases: list[Lease]) -> None: ...
    def running_here(self, key: str) -> bool: ...
    async def ask_handoff(self, lease: Lease, to: str) -> bool: ...
    async def take(self, lease: Lease, *, how: str) -> None: ...


class Led:
    """The leader-assignment roles of one worker's taker."""

    def __init__(self, taker: LedTaker) -> None:
        self._t = taker
        self._role = "worker"
        self._declined: dict[str, float] = {}  # key -> monotonic time it was declined
        self._assigned: dict[str, float] = {}  # key -> monotonic time the leader assigned it
        # key -> (its owner at our last scan, when we first saw that owner; -inf: at our first)
        self._owners: dict[str, tuple[str | None, float]] = {}
        # Until when (monotonic) to take as every worker does: the owner index was missing.
        self._no_index_until = float("-inf")

    def role(self) -> str:
        w = self._t.worker
        if w.caught_up is not None or w.clock.monotonic() < self._no_index_until:
            return "worker"
        if w.leader.is_leader:
            return "leader" if w.leader.assigning else "worker"
        led = w.leader.led_by() is not None and w.leader.other_assigns
        return "led" if led else "worker"

    async def round(self) -> bool:
        """One round in this worker's role; False: none (take as a worker does)."""
        role = self.role()
        if role != self._role:
            w = self._t.worker
            log.info("worker %s: lease assignment role %s -> %s", w.cfg.worker_id,
                     self._role, role)  # fmt: skip
            self._role = role
            self._assigned = {}  # the taker's suspects stay: a status record proves them wrong
            self._owners = {}
            self._t.observer.forget()  # a led worker watches no lease; a new leader starts fresh
            w.reports.all_parked(False)  # judged from scans, which a led worker does not make
            if role == "leader" and not await self._index_answers():
                return False
        if role == "leader":
            await self._lead()
        elif role == "led":
            await self._discover()
        return role != "worker" and self._role == role

    async def after_scan(self, open_leases: int, running: Iterable[str]) -> None:
        """``"auto"``: whether we assign from our next renewal on, decided from a scan of ours
        while we lead (a worker that does not lead says nothing: losing leadership resets the
        wish, and when it comes to lead, its first scan decides)."""
        w = self._t.worker
        if w.cfg.lease_assignment != "auto" or not w.leader.is_leader:
            return
        workers = len(set(running) | {w.cfg.worker_id})
        wanted = (
            w.caught_up is None
            and w.clock.monotonic() >= self._no_index_until
            and leader_assigns(
                w.leader.assigning,
                open_leases,
                workers,
                from_leases=w.cfg.auto_assignment_leases,
                from_workers=w.cfg.auto_assignment_workers,
            )
        )
        if wanted and not w.leader.wants_assigns and not await self._index_answers():
            wanted = False  # logged there; every worker takes for itself meanwhile
        if wanted != w.leader.wants_assigns:
            log.info("worker %s (leader): %d open leases, %d running workers: %s "
                     "(lease_assignment = \"auto\")", w.cfg.worker_id, open_leases, workers,
                     "assigning leases once the leader record says so" if wanted
                     else "every worker takes its own leases again")  # fmt: skip
        w.leader.set_assigns(wanted)

    def _leading(self) -> bool:
        w = self._t.worker
        return w.leader.is_leader and w.run_state.may_take

    async def _lead(self) -> None:
        t = self._t
        w = t.worker
        me = w.cfg.worker_id
        scan = await t.scan()
        if scan is None:
            return
        now = w.clock.monotonic()
        if now - w.run_state.resumed_at < w.timing.lease_duration + w.timing.max_clock_skew:
            return  # the others' status still says suspended: they would get nothing
        window = w.timing.lease_duration
        self._assigned = {k: at for k, at in self._assigned.items() if now - at < window}
        running = dict(t.running)
        if w.run_state.may_take:  # we run, whether or not our last status write landed
            running.setdefault(me, w.clock.wall())
        targets = self._t.suspects.targets(scan, running, exempt={me, *t.foreign})
        plan = plan_assignments(
            scan,
            targets,
            rng=w.rng,
            max_leases_for_worker=w.cfg.max_leases_for_worker,
            max_moves=max(1, len(targets)) * w.cfg.max_leases_to_steal,
            keep={*self._assigned, *self._moved_lately(scan, now, window)},
            max_load_moves=w.cfg.max_leases_to_steal,
            cpu=t.cpu,
            foreign=t.foreign,
            consumes=t.consumes.streams,
        )
        if not plan.assign and not plan.moves:
            return
        log.info("worker %s (leader): %s", me, plan.reason)
        for a in plan.assign:
            if not self._leading():
                return
            if a.to == me:
                if not w.placement.running(a.lease.lease_key):
                    await t.take(a.lease, how="took")
            else:
                await self._assign(a.lease, a.to)
        for m in plan.moves:
            if not self._leading():
                return
            if w.cfg.graceful_handoff:
                await t.ask_handoff(m.lease, m.to)
            elif m.to == me:
                await t.take(m.lease, how="stole")
            else:
                await self._assign(m.lease, m.to)

    def _moved_lately(self, scan: ObservedScan, now: float, window: float) -> set[str]:
        """The leases whose owner changed between two of our scans within ``window``: handed
        over (a stopping worker's handoff completed) or taken, maybe not yet by their new owner
        (ours, running here, are taken).
        Asked to move on before it took one, that owner, which never held it, never ended the
        handoff from it (the owner index no longer names it), and the shard waited for the
        lease to expire twice."""
        owners: dict[str, tuple[str | None, float]] = {}
        for o in scan.leases:
            before = self._owners.get(o.key)
            since = float("-inf") if before is None else before[1]
            if before is not None and before[0] != o.owner:
                since = now
            owners[o.key] = (o.owner, since)
        self._owners = owners  # the leases of this scan only
        t = self._t
        return {key for key, (_, since) in owners.items()
                if now - since < window and not t.running_here(key)}  # fmt: skip

    async def _assign(self, lease: Lease, to: str) -> None:
        t = self._t
        w = t.worker
        taken = await t.io(w.store.take_lease, lease, to)
        key = lease.lease_key
        if taken is None:
            log.info("lease %s: changed before we could assign it", key)
            return
        t.observer.record_write(taken, w.clock.monotonic())
        self._assigned[key] = w.clock.monotonic()
        why = f"by leader {w.cfg.worker_id}: " + why_free(lease)
        w.reports.assigned(key, to, why)
        log.info("lease %s: assigned to %s %s", key, to, why)

    async def _discover(self) -> None:
        """Our keys from the owner index; read the ones we do not run, take what is ours."""
        t = self._t
        w = t.worker
        keys = await self._own_keys()
        if keys is None:
            return
        w.reports.table_answered()
        t.observer.forget()  # nothing to watch while led (and nothing kept from our takes)
        now = w.clock.monotonic()
        self._declined = {k: at for k, at in self._declined.items() if now - at < DECLINED_FOR}
        leases: list[Lease] = []
        for key in keys:
            if t.running_here(key) or key in self._declined:
                continue
            lease = await t.io(w.store.get_lease, key)
            if lease is not None:
                leases.append(lease)
        w.reports.table_answered(every_lease_read=True)  # none of those we looked at corrupt
        await t.adopt(leases)
        for lease in leases:  # ours, yet not taken: finished, parked, or not of our streams
            mine = lease.lease_owner == w.cfg.worker_id and not lease.handoff_pending
            if mine and not t.running_here(lease.lease_key):
                self._declined[lease.lease_key] = now

    async def _own_keys(self) -> list[str] | None:
        """Our keys from the owner index; None if the table has none (a KCL 2.x table, or an
        index still being built): then every worker takes for itself for NO_INDEX_RETRY
        seconds, and looks again."""
        t = self._t
        w = t.worker
        try:
            keys: list[str] = await t.io(w.store.list_lease_keys_by_owner, w.cfg.worker_id)
            return keys
        except InvalidStateError as exc:
            log.error("worker %s: %s; lease_assignment = \"leader\" needs the owner index "
                      "(LeaseOwnerToLeaseKeyIndex): taking leases as every worker does for "
                      "%.0f s", w.cfg.worker_id, exc, NO_INDEX_RETRY)  # fmt: skip
            self._no_index_until = w.clock.monotonic() + NO_INDEX_RETRY
            self._role = "worker"
            return None

    async def _index_answers(self) -> bool:
        """A new leader checks once that the owner index exists (the others depend on it)."""
        return await self._own_keys() is not None


def leader_assignment_pays(
    lease_store: str, lease_assignment: str, leases: int, workers: int
) -> bool:
    """Whether a fleet taking leases worker by worker on DynamoDB is large enough that
    ``lease_assignment = "leader"`` would cost it fewer capacity units (only the leader would
    scan the table; the others Query the owner index for their own keys)."""
    return (
        lease_store == "dynamodb"
        and lease_assignment == "worker"
        and leases >= LEADER_PAYS_LEASES
        and workers >= LEADER_PAYS_WORKERS
    )


class AssignmentHint:
    """Says once per run, in the log, when a fleet set to take leases worker by worker would
    cost fewer capacity units with leader assignment (``leader_assignment_pays``)."""

    def __init__(self) -> None:
        self.given = False

    def after_scan(self, w: LeaseWorker, running: Iterable[str], leases: int) -> None:
        if self.given or w.caught_up is not None:  # a job takes as every worker does anyway
            return
        workers = len(set(running) | {w.cfg.worker_id})
        if not leader_assignment_pays(w.cfg.lease_store, w.cfg.lease_assignment, leases, workers):
            return
        self.given = True
        log.info(
            "worker %s: %d open leases and %d running workers, each worker scanning the whole "
            "lease table every %.1f s: with lease_assignment = \"auto\" (the default) or "
            "\"leader\" only the leader would scan, at fewer capacity units for a fleet this "
            "size (README, Leader assignment)",
            w.cfg.worker_id, leases, workers, w.timing.take_interval,
        )  # fmt: skip


def lease_timing(cfg: WorkerConfig) -> LeaseTiming:
    """A leader that assigns leases lapses after one failover time (see above); in ``"auto"``
    the election switches between the two lives itself."""
    return LeaseTiming(
        failover=cfg.failover_time,
        max_clock_skew=cfg.max_clock_skew,
        # "auto": three while it does not assign; one when it does (leader_election)
        leader_duration_multiplier=1.0 if cfg.lease_assignment == "leader" else 3.0,
    )


def leader_election(
    cfg: WorkerConfig, store: CoordinationStore, timing: LeaseTiming, clock: Clock
) -> LeaderElection:
    return LeaderElection(
        store,
        cfg.worker_id,
        lease_duration=timing.leader_duration,
        clock=clock,
        assigns=cfg.lease_assignment == "leader",
        assigning_duration=timing.failover if cfg.lease_assignment == "auto" else None,
        renew_at=0.5,  # a record of three failover times, at half its life (one: at a third)
        observed_max_age=timing.leader_renew_interval,  # a scan since the last tick
    )


def why_free(lease: Lease) -> str:
    if lease.lease_owner:
        return f"(from {lease.lease_owner}, which stopped renewing it)"
    return "(it had no owner)"
