"""Taking leases: one scan of the lease table per round, the KCL 2.x rule (``plan_takes``) over
what this worker has seen of each lease's counter (``LeaseObserver``), and a conditional take of
each lease it names; a lease taken gets its shard consumer.

A steal from a worker that follows hand-offs (``kclpy``) is a graceful handoff: the table names
us as owner and the old one as checkpoint owner, whose processor checkpoints in
``shutdown_requested`` and completes it; we take the lease then (looking every ``HANDOFF_POLL``
s). A lease handed to us by a stopping worker (ours, not held) is taken in the next round.

Between rounds, a lease of another worker is read once more at the moment it would expire unless
its counter moved (``LeaseObserver.next_check``, dated by write stamps); if it did not move, the
next round starts at once. A live lease's counter moves before that moment, so the read is seldom
needed; more than ``MAX_LOOKS`` due at once start a round instead (one scan reads them all)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from checkpoint import coordination
from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease, LeaseState
from checkpoint.port import TableScan
from kclpy_spark.moves.assigning import AssignmentHint, Led
from kclpy_spark.moves.rules.assign_rule import Consumers, Suspects
from kclpy_spark.moves.rules.cpu_load import FleetCpu
from kclpy_spark.moves.rules.observer import LeaseObserver, ObservedScan
from kclpy_spark.moves.rules.take_rule import plan_takes

if TYPE_CHECKING:
    from kclpy_spark.moves.lease_worker import LeaseWorker

log = logging.getLogger(__name__)

CLOCK_WARNING_EVERY = 600.0  # seconds between two warnings of one worker's clock
CLOCK_MARGIN = 0.5  # seconds past max_clock_skew before a clock is said to run ahead

Io = Callable[..., Awaitable[Any]]

HANDOFF_POLL = 0.5
# Leases read one by one when due (more start a round at once), and the shortest wait for them.
MAX_LOOKS = 8
LOOK_MARGIN = 0.02
PRUNE_EVERY = 300.0  # seconds between the leader's deletions of gone workers' records


class Taker:
    def __init__(self, worker: LeaseWorker, io: Io) -> None:
        self._w = worker
        self._io = io  # runs a lease-table call on the worker's lease executor
        self._observer = LeaseObserver(worker.timing)
        self._incoming: dict[str, float] = {}  # handoffs to us -> monotonic time to stop waiting
        self._live: dict[str, int] = {}  # other live workers -> leases, as of the last scan
        self._ours: set[str] = set()  # owners whose leases a kclpy-spark store stamped last
        self._stamping: frozenset[str] = frozenset()  # workers with a status record of ours
        self.running: dict[str, float] = {}  # workers whose status record says they run -> when
        self._status_written: dict[str, float] = {}  # ours of them (status records) -> when
        # Workers seen to stop renewing whose status has not been written since (dead, or
        # stalled): never handed a lease, nor counted in our share, until it is.
        self.suspects = Suspects(quiet_after=worker.timing.quiet_after)
        self.cpu = FleetCpu({})  # their CPU figures (the load rule's), from the same scan
        self.consumes = Consumers({})  # which of them consume which streams, from the same scan
        self.hint = AssignmentHint()
        led = worker.cfg.lease_assignment in ("leader", "auto")
        self.led: Led | None = Led(self) if led else None
        self._pruned_at = -math.inf  # when the leader last deleted gone workers' records
        self._clock_told: dict[str, float] = {}  # workers warned of a clock ahead -> when

    async def wait(self, wake: asyncio.Event, interval: float) -> None:
        """Until ``wake`` is set or ``interval`` passed; meanwhile take each lease handed to us
        as soon as its handoff completes. Timed on the event loop's clock, as its waits are."""
        loop = asyncio.get_running_loop()
        end = loop.time() + interval
        while (left := end - loop.time()) > 0:
            poll = min(left, HANDOFF_POLL) if self._incoming else left
            check = (
                None
                if self._w.run_state.suspended
                else self._observer.next_check(self._w.cfg.worker_id)
            )
            if check is not None:
                poll = min(poll, max(check - self._w.clock.monotonic(), 0.0) + LOOK_MARGIN)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), poll)
                return
            if check is not None and await self._look_at_due():
                return  # an owner stopped writing: the next round takes its lease now
            if self._incoming:
                try:
                    await self._look_at_incoming()
                except KclpySparkError as exc:  # the next poll (or round) tries again
                    log.warning("worker %s: looking at leases handed to us failed: %s",
                                self._w.cfg.worker_id, exc)  # fmt: skip
                except Exception:  # a bug here must not end the take loop
                    log.exception("worker %s: looking at leases handed to us failed",
                                  self._w.cfg.worker_id)  # fmt: skip

    async def _look_at_due(self) -> bool:
        """Read each lease of another worker whose expiry has come unless its counter moved;
        True if one is available now (or too many are due to read one by one: a scan reads
        them all). Leases not read (too many, or a read failed) are watched no more until the
        next scan, so they cannot end every wait."""
        w = self._w
        due = self._observer.due(w.clock.monotonic(), w.cfg.worker_id)
        if len(due) > MAX_LOOKS:
            self._observer.unwatch(due)
            return True
        try:
            for key in due:
                lease = await self._io(w.store.get_lease, key)
                if self._observer.look_again(key, lease, w.clock.monotonic(), w.clock.wall()):
                    log.info("lease %s: %s stopped renewing it (or released it); taking leases "
                             "now", key, lease.actual_owner if lease else None)  # fmt: skip
                    return True
        except Exception as exc:  # the next round scans anyway
            self._observer.unwatch(due)
            report = log.warning if isinstance(exc, KclpySparkError) else log.exception  # a bug
            report("worker %s: reading leases due to expire failed: %s", w.cfg.worker_id, exc)
        return False

    async def _look_at_incoming(self) -> None:
        """Read the leases being handed to us, at most ``MAX_LOOKS`` a pass, in turn: a stopping
        worker may hand us hundreds, and each pass read them all one after another while the
        take loop waited. One whose time is up is left to the rounds before any read (a key
        whose read kept failing was never dropped); a failed read skips only its key."""
        w = self._w
        now = w.clock.monotonic()
        for key in [k for k, until in self._incoming.items() if now > until]:
            del self._incoming[key]
        keys = list(self._incoming)[:MAX_LOOKS]
        for key in keys:  # to the back of the line
            self._incoming[key] = self._incoming.pop(key)
        for key in keys:
            try:
                lease = await self._io(w.store.get_lease, key)
            except KclpySparkError as exc:  # the next pass (or round) tries again
                log.warning("lease %s: reading it, handed to us, failed: %s", key, exc)
                continue
            if lease is None or lease.lease_owner != w.cfg.worker_id:
                asked = lease is not None and lease.checkpoint_owner == w.cfg.worker_id
                if asked and not self.running_here(key):  # asked of us before we took it
                    try:
                        await self._end_handoff(lease)
                    except KclpySparkError as exc:  # kept: the next pass tries again
                        log.warning("lease %s: ending a handoff from us failed: %s", key, exc)
                        continue
                self._incoming.pop(key, None)  # gone, taken by another, or its handoff ended
            elif not lease.handoff_pending:
                self._incoming.pop(key, None)
                if w.run_state.may_take and self._ours_to_take(lease):
                    await self._take_handed(lease)

    @property
    def worker(self) -> LeaseWorker:
        return self._w

    @property
    def io(self) -> Io:
        return self._io

    @property
    def observer(self) -> LeaseObserver:
        return self._observer

    def interval(self) -> float:
        """Between rounds: a renewal interval when led (assigned leases start within it) or beside
        a KCL worker (its unstamped renewals are dated by the scan that sees them), else more."""
        t, foreign = self._w.timing, any(o not in self._ours for o in self._live)
        led = self.led is not None and self.led.role() == "led"
        return min(t.take_interval, t.renew_interval) if led or foreign else t.take_interval

    async def round(self) -> None:
        """One round: led (``lease_assignment = "leader"``, or ``"auto"`` in a large fleet), the
        leader's scan and assignment,
        or another worker's look at its own keys; else (or while no leader leads) one scan of
        the lease table and the takes (or steals) the KCL's rule says."""
        if self.led is not None and await self.led.round():
            return
        scan = await self.scan()
        if scan is None:
            return
        w = self._w
        if (
            w.clock.monotonic() - w.run_state.resumed_at
            < w.timing.lease_duration + w.timing.max_clock_skew
        ):
            return  # the others' status still says suspended: each would count itself alone
        self.hint.after_scan(w, self.running, scan.total)
        plan = plan_takes(
            scan,
            w.cfg.worker_id,
            max_leases_for_worker=w.cfg.max_leases_for_worker,
            max_leases_to_steal=w.cfg.max_leases_to_steal,
            rng=w.rng,
            steal_cooldown=w.timing.steal_cooldown,
            workers=self._trusted() - {w.cfg.worker_id},
            cpu=self.cpu,
        )
        if not plan.leases:
            if plan.mine < plan.target:
                w.reports.none_acquired()
            return
        log.info("worker %s: %s", w.cfg.worker_id, plan.reason)
        for lease in plan.leases:
            if not w.run_state.may_take:  # suspended or stopping meanwhile: take (or steal) no more
                return
            if w.placement.running(lease.lease_key):
                continue
            follows = self.kclpy(lease.lease_owner)  # hand-offs; else a steal is the 2.x take
            if lease in plan.steal and not (follows or w.cfg.steal_from_kcl_workers):
                continue
            if lease in plan.steal and w.cfg.graceful_handoff and follows:
                await self.ask_handoff(lease, w.cfg.worker_id)
            elif len(w.holder.held()) >= w.cfg.max_leases_for_worker:
                # The rule counts a lease we are handing over as its new owner's, but we run it
                # until the handoff completes: what we hold is the cap's measure.
                log.info("worker %s: at max_leases_for_worker (%d held); taking no more",
                         w.cfg.worker_id, w.cfg.max_leases_for_worker)  # fmt: skip
                return
            else:
                await self.take(lease, how="stole" if lease in plan.steal else "took")

    async def scan(self) -> ObservedScan | None:
        """Scan the lease table (leases and status records), show it to the status page, take
        what was handed to us, and judge every open lease; None when a job just completed."""
        w = self._w
        table = await self._io(w.store.scan_table, "")  # every record: its Scan reads them all
        returned = w.clock.monotonic()
        leases = list(table.leases)
        w.leader.observe(table.records, returned)
        w.reports.scanned(table, returned)
        now_wall = w.clock.wall()
        if w.leader.is_leader and returned - self._pruned_at >= PRUNE_EVERY:
            self._pruned_at = returned
            await self._prune(table, now_wall)
        mine = [x for x in leases if w.placement.context_of(x) is not None]
        if w.caught_up is not None:  # a job: stop when every shard is caught up
            if self._job_complete(mine):
                return None
            mine = [x for x in mine if not w.caught_up.is_ended(x.lease_key)]
        unfinished = [x for x in mine if not x.checkpoint.is_shard_end]
        # Parked leases are invisible to the taker until their reopen time; leases of streams
        # this worker does not consume (removed from the config) are never taken.
        open_leases = [x for x in mine if x.state(now_wall) is not LeaseState.CLOSED]
        w.reports.all_parked(
            bool(unfinished) and all(x.state(now_wall) is LeaseState.CLOSED for x in unfinished)
        )
        await self.adopt(open_leases)
        self._note_running(table)
        if self.led is not None:
            await self.led.after_scan(len(open_leases), self.running)
        return self._observe(open_leases)

    async def _prune(self, table: TableScan, now_wall: float) -> None:
        """Delete the status records of workers gone for an hour; a failure waits for the next
        prune, never costing the round its takes."""
        prune = coordination.prune_gone_workers
        try:
            gone = await self._io(prune, self._w.store, table.records, now_wall)
        except KclpySparkError as exc:
            log.warning("deleting the status records of gone workers failed: %s", exc)
            return
        if gone:
            log.info("deleted the status records of %d worker(s) gone for an hour", gone)

    async def adopt(self, leases: list[Lease]) -> None:
        """Take the leases the table says are ours (handed to us) that we do not hold; watch
        those whose handoff to us has begun (a stopping worker's), to take them as soon as it
        completes; end the handoffs from us of leases we no longer hold (handed to us and asked
        for by another worker before we took them), so that their new owner can start."""
        w = self._w
        for lease in leases:
            key = lease.lease_key
            if key in self._incoming or not w.run_state.may_take:
                continue
            if lease.checkpoint_owner == w.cfg.worker_id and not self.running_here(key):
                await self._end_handoff(lease)
            elif self._ours_to_take(lease):
                await self._take_handed(lease)
            elif self._handed_to_us(lease):
                log.info("lease %s: %s is handing it over to us; watching it",
                         key, lease.checkpoint_owner)  # fmt: skip
                self._watch_incoming(key)

    async def _end_handoff(self, lease: Lease) -> None:
        """End a handoff from us of a lease we do not run, so that its new owner can start;
        unless that owner does not follow hand-offs (a KCL 2.x worker took the lease meanwhile,
        leaving our name as its checkpoint owner): the completion's counter move made it lose
        a lease it holds (a stalled shard, then records again). Left as it is: our name stays
        on it (the lease counts as ours mid-handoff, never stolen) until a worker of ours or a
        KCL 3.x one takes it, after the KCL 2.x worker let it expire."""
        key, owner = lease.lease_key, lease.lease_owner
        # The handoff's ask moved no counter: a stamp of our stores still dates the lease's
        # counter (a KCL 2.x take moves it unstamped); a led worker, which scans nothing, may
        # not know its new owner's status record.
        if not self.kclpy(owner) and lease.write_time is None:
            log.debug("lease %s: held by %s, which does not follow hand-offs; left to it",
                      key, owner)  # fmt: skip
            return
        log.info("lease %s: ending a handoff from us to %s", key, owner)
        await self._io(self._w.store.complete_handoff, lease)

    async def _take_handed(self, lease: Lease) -> None:
        """Take a lease the table says is ours (handed or assigned to us), unless we hold our
        ``max_leases_for_worker`` already: two stopping workers that both saw us below it (or
        the leader and a stopping worker) gave us more; the one over is given back unowned, for
        the next worker's take round, instead of running here past the cap."""
        w = self._w
        cap = w.cfg.max_leases_for_worker
        if len(w.holder.held()) >= cap:
            log.info("lease %s: handed to us at our cap of %d lease(s); giving it back",
                     lease.lease_key, cap)  # fmt: skip
            await self._io(w.store.evict_lease, lease)
            return
        await self.take(lease, how="handed")

    def _watch_incoming(self, key: str) -> None:
        """Look at a lease being handed to us every HANDOFF_POLL seconds, for at most the
        handoff timeout and a lease duration (then the rounds take over)."""
        wait = self._w.cfg.handoff_timeout + self._w.timing.lease_duration
        self._incoming[key] = self._w.clock.monotonic() + wait

    def _handed_to_us(self, lease: Lease) -> bool:
        """A handoff to us has begun (by a stopping worker) and we do not run the lease."""
        mine = lease.lease_owner == self._w.cfg.worker_id and lease.handoff_pending
        return mine and not self.running_here(lease.lease_key)

    def running_here(self, key: str) -> bool:
        return self._w.placement.running(key) or self._w.holder.get_if_held(key) is not None

    def _ours_to_take(self, lease: Lease) -> bool:
        """Ours by the table and ours to take now: no handoff pending, work left, not parked,
        of a stream we consume (not ended, in a job), and not held or running here."""
        w = self._w
        if lease.lease_owner != w.cfg.worker_id or lease.handoff_pending:
            return False
        if lease.checkpoint.is_shard_end or lease.state(w.clock.wall()) is LeaseState.CLOSED:
            return False
        if w.placement.context_of(lease) is None:
            return False
        if w.caught_up is not None and w.caught_up.is_ended(lease.lease_key):
            return False
        return not self.running_here(lease.lease_key)

    async def hand_out(self) -> int:
        """Stopping: hand every lease we hold to the running workers (``_trusted``: they follow
        hand-offs) below their lease cap, by a fresh scan (else the last round's), fewest leases
        first; each gets it once the processor checkpointed in ``shutdown_requested``. Else (or
        with handoffs off, or in a job) leases are released. Returns how many handoffs began."""
        w = self._w
        if not w.cfg.graceful_handoff or w.caught_up is not None or not w.holder.held():
            return 0
        await self._refresh_live()  # a KCL worker takes a released lease sooner than a handed one
        # Only to workers known to run (a status record not saying "stopping", a KCL 3.x
        # metrics entity): one stopping too would never take it (its take loop has ended), nor
        # would one over its max_leases_for_worker.
        trusted = self._trusted() - (self.suspects.quiet - self.foreign)  # not one killed lately
        cap = w.cfg.max_leases_for_worker
        load = {o: self._live.get(o, 0) for o in trusted if o != w.cfg.worker_id}
        load = {o: n for o, n in load.items() if n < cap and not self._quiet_and_empty(o, n)}
        if not load:
            return 0
        begun = 0
        # One hand-off after another, each a lease-table write: a slow table must not stretch
        # the stop past its grace (the leases left are released at the end instead).
        until = w.clock.monotonic() + w.cfg.shutdown_grace / 4
        for held in w.holder.held():
            if held.lease.handoff_pending:
                continue
            if w.clock.monotonic() > until:
                log.warning(
                    "handing leases over took a quarter of the grace: the rest are released"
                )
                break
            takers = [o for o in sorted(load) if self.consumes(o, held.lease)]
            if not takers:  # none consumes its stream: released at the end
                continue
            to = min(takers, key=lambda worker: load[worker])
            try:
                result = await self._io(w.holder.begin_handoff, held.lease_key, held.token, to)
            except KclpySparkError as exc:
                log.warning("lease %s: no handoff (%s); releasing it instead", held.lease_key, exc)
                continue
            if result.lease is not None:  # begun by us, or by a thief meanwhile
                to = result.lease.lease_owner or to
                begun += 1
                log.info("lease %s: handing it over to %s (stopping)", held.lease_key, to)
                if to not in load:  # a thief that is no target of ours (full, or not trusted)
                    continue
                load[to] += 1
                if load[to] >= cap:
                    load.pop(to)
                    if not load:  # every running worker full: the rest are released
                        break
        return begun

    async def _refresh_live(self) -> None:
        """The other live workers and their lease counts, from a fresh scan (a new one's too)."""
        w = self._w
        try:
            table = await self._io(w.store.scan_table, coordination.WORKER_PREFIX)
        except Exception as exc:  # stopping goes on whatever this scan does
            return log.warning("worker %s: no fresh scan before handing leases out (%r); using "
                               "the last", w.cfg.worker_id, exc)  # fmt: skip
        now_wall = w.clock.wall()
        self._note_running(table)
        self._observe([x for x in table.leases if w.placement.context_of(x) is not None
                       and x.state(now_wall) is not LeaseState.CLOSED])  # fmt: skip

    def _note_running(self, table: TableScan) -> None:
        """The workers known to run (see plan_takes and assigning): ours by their status records,
        KCL 3.x workers by their metrics entities (they follow hand-offs as ours do), unless
        their fleet is still migrating from KCL 2.x (then they never look for a lease given to
        them: a hand-off or assignment to one left the lease idle until it expired)."""
        w, records = self._w, table.records
        max_age = w.timing.status_max_age
        follow = coordination.kcl_workers_follow_handoffs(table.kcl_client_version)
        kcl = table.kcl_workers if follow else ()
        self.running = coordination.live_kcl_workers(kcl, w.clock.wall())
        self._status_written = coordination.live_workers(records, w.clock.wall(), max_age)
        self.running |= self._status_written
        # Ours, whatever their records say (stopping, stopped, aged): their writes are stamped.
        self._stamping = frozenset(coordination.worker_statuses(records))
        self._tell_clocks_ahead(table)
        figures = coordination.cpu_figures(records, w.clock.wall(), max_age)
        use = w.cfg.load_metric == "auto"  # else the load rule balances throughput only
        self.cpu = FleetCpu(figures if use else {}, w.clock.wall(), w.timing.max_clock_skew)
        self.consumes = Consumers(coordination.consumed_streams(records))

    def _observe(self, open_leases: list[Lease]) -> ObservedScan:
        """Show a scan's open leases to the observer (dated now), and note the other live
        workers (those the scan shows renewing: a stopping worker hands its leases to them) and
        their lease counts."""
        w = self._w
        stamping = {*self._stamping, w.cfg.worker_id}
        scan = self._observer.observe(
            open_leases, w.clock.monotonic(), w.clock.wall(), stamping=stamping
        )
        self.suspects.observe(scan, self.running)
        self._live = {o: n for o, n in scan.owner_counts.items() if o != w.cfg.worker_id}
        self._ours = {str(x.lease_owner) for x in open_leases if x.write_time is not None}
        return scan

    def _quiet_and_empty(self, owner: str, leases: int) -> bool:
        """Whether ``owner``, one of ours, holds no lease in the scan and has not written its
        status record for a round: a worker holding none writes it every round, so this one was
        killed a moment ago (its last record, written while it held leases, may say it runs for
        longer: ``live_for``). The stopping worker keeps no suspects when a leader assigns."""
        written = self._status_written.get(owner)
        if leases or written is None:
            return False
        timing = self._w.timing
        return self._w.clock.wall() - written > timing.lease_duration + timing.max_clock_skew

    @property
    def foreign(self) -> frozenset[str]:
        """The running workers of another KCL (metrics entities, no status record of ours)."""
        return frozenset(self.running.keys() - self._status_written.keys())

    def _trusted(self) -> frozenset[str]:
        """The running workers (status records, KCL metrics entities) not suspected."""
        return frozenset(o for o in self.running if o not in self.suspects)

    def _tell_clocks_ahead(self, table: TableScan) -> None:
        """Warn (once in CLOCK_WARNING_EVERY a worker) of a worker whose clock runs ahead of
        ours past ``max_clock_skew``: lease expiry dates writes by their stamps, so its leases
        look fresher than they are (moved late) and ours older (moved early: records twice)."""
        w = self._w
        now, allowance = w.clock.monotonic(), w.timing.max_clock_skew + CLOCK_MARGIN
        self._clock_told = {k: t for k, t in self._clock_told.items()
                            if now - t < CLOCK_WARNING_EVERY}  # fmt: skip
        ahead = coordination.clocks_ahead(table.records, w.clock.wall(), allowance)
        for worker, by in ahead.items():
            if worker not in self._clock_told and worker != w.cfg.worker_id:
                self._clock_told[worker] = now
                log.warning(
                    "worker %s's clock runs at least %.1f s ahead of this worker's (its status "
                    "record is stamped in our future), past max_clock_skew (%g s): leases may "
                    "move early (records twice) or late; synchronise the clocks (NTP) or raise "
                    "max_clock_skew", worker, by, allowance,
                )  # fmt: skip

    def kclpy(self, owner: str | None) -> bool:
        """A worker that follows hand-offs: ours (a status record, or our stores' stamp on its
        leases) or a KCL 3.x one (a metrics entity); kcl-rs (neither) takes one for a lost lease."""
        return owner is not None and (owner in self.running or owner in self._ours)

    async def ask_handoff(self, lease: Lease, to: str) -> bool:
        """Ask ``lease``'s owner to hand it over to ``to`` (us, or a worker the leader names);
        True if the handoff began."""
        w = self._w
        pending = await self._io(w.store.initiate_handoff, lease, to)
        if pending is None:
            log.info("lease %s: changed before we could ask for it", lease.lease_key)
            return False
        log.info("lease %s: asked %s to hand it over to %s (graceful handoff)",
                 lease.lease_key, lease.lease_owner, to)  # fmt: skip
        w.reports.asked(lease, to, w.cfg.worker_id)
        if to == w.cfg.worker_id:
            self._watch_incoming(lease.lease_key)
        return True

    def _job_complete(self, leases: list[Lease]) -> bool:
        w = self._w
        assert w.caught_up is not None
        if not leases or w.caught_up.remaining(leases):
            return False
        done, failed = len(w.caught_up.done), len(w.caught_up.failed)
        log.info("worker %s: caught up (%d lease(s) done, %d failed); stopping",
                 w.cfg.worker_id, done, failed)  # fmt: skip
        w.caught_up.complete = True
        w.run_state.stop("every lease caught up")
        return True

    async def take(self, lease: Lease, *, how: str) -> None:
        w = self._w
        started = w.clock.monotonic()  # the new tenure's expiry counts from before the write
        take = asyncio.ensure_future(self._io(w.store.take_lease, lease, w.cfg.worker_id))
        try:
            taken = await asyncio.shield(take)
        except KclpySparkError as exc:
            w.reports.write_answered(exc)
            raise
        except asyncio.CancelledError:
            # Stopping: the take may still win in its thread. Hold what it took, so the stop's
            # release gives it back at once instead of leaving it owned by nobody alive.
            with contextlib.suppress(Exception):
                late = await take
                if late is not None:
                    w.holder.add_taken(late, started)
            raise
        w.reports.write_answered()
        if taken is None:
            log.info("lease %s: another worker took it first", lease.lease_key)
            return
        self._observer.record_write(taken, w.clock.monotonic())
        # On a thread: a retake of a lease whose slot is still ours waits a moment for that
        # slot's lock (every consumer would wait on the loop). Shielded as the take is: stopping
        # meanwhile, it still registers the lease, which the stop's release then gives back.
        held = await asyncio.shield(self._io(w.holder.add_taken, taken, started))
        w.reports.took(lease, how)
        context = w.placement.context_of(taken)
        # Its stream removed, or the worker suspended, meanwhile.
        if context is None or not w.run_state.may_take:
            await self._io(w.holder.release, held.lease_key, held.token)
            return
        try:
            w.placement.start(held, context)
        except Exception:  # a bug: never hold (and renew) a lease nothing processes
            log.exception("lease %s: its consumer could not start; releasing it", held.lease_key)
            await self._io(w.holder.release, held.lease_key, held.token)
