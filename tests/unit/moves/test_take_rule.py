"""plan_takes: the KCL 2.x taker's decisions, table-driven, and fleets of simulated workers."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.lease import Lease
from checkpoint.leasing import LeaseTiming
from checkpoint.sequence import SHARD_END, TRIM_HORIZON
from kclpy_spark.moves.rules import UNLIMITED, LeaseObserver, ObservedScan, TakePlan, plan_takes

TIMING = LeaseTiming(failover=10.0)
ME = "me"


def scan_of(
    live: dict[str, int] | None = None,
    *,
    free: int = 0,
    very_old: int = 0,
    expired: dict[str, int] | None = None,
    finished: int = 0,
) -> ObservedScan:
    """A scan, made by a real observer over two scans a lease duration apart: ``live`` leases were
    renewed in between, ``free`` ones were released (unowned, seen changing), ``expired`` ones were
    not renewed, ``very_old`` ones are unowned and new, ``finished`` ones are at SHARD_END."""
    clock = ManualClock()
    observer = LeaseObserver(TIMING)
    before: list[Lease] = []
    for owner, n in (live or {}).items():
        before += [Lease(f"{owner}-{i:02d}", TRIM_HORIZON, owner, 1) for i in range(n)]
    before += [Lease(f"free-{i:02d}", TRIM_HORIZON, "gone", 1) for i in range(free)]
    before += [Lease(f"done-{i:02d}", SHARD_END, None, 1) for i in range(finished)]
    stale = [
        Lease(f"{owner}-{i:02d}", TRIM_HORIZON, owner, 1)
        for owner, n in (expired or {}).items()
        for i in range(n)
    ]
    observer.observe(before + stale, clock.monotonic())
    clock.advance(TIMING.lease_duration + 1)
    after = [
        x.bumped(lease_owner=None) if x.lease_key.startswith("free") else x.bumped() for x in before
    ]
    new = [Lease(f"new-{i:02d}", TRIM_HORIZON) for i in range(very_old)]
    return observer.observe(after + stale + new, clock.monotonic())


# live, free, very_old, expired, finished, max_leases, max_steal -> target, taken, stolen
PLAN_TABLE = [
    ("alone takes everything", {}, 4, 0, {}, 0, UNLIMITED, 1, 4, 4, 0),
    ("fair share of free leases", {"a": 2}, 2, 0, {}, 0, UNLIMITED, 1, 2, 2, 0),
    ("2 workers 3 leases: no steal", {"a": 2, ME: 1}, 0, 0, {}, 0, UNLIMITED, 1, 2, 0, 0),
    ("over target: steal the excess", {"a": 3, "b": 3}, 0, 0, {}, 0, UNLIMITED, 1, 2, 0, 1),
    ("at target, I need 2: steal 1", {"a": 2, "b": 2}, 0, 0, {}, 0, UNLIMITED, 5, 2, 0, 1),
    ("at target, I need 1: no steal", {"a": 2, "b": 2, ME: 1}, 0, 0, {}, 0, UNLIMITED, 5, 2, 0, 0),
    ("steal capped at 1", {"a": 10}, 0, 0, {}, 0, UNLIMITED, 1, 5, 0, 1),
    ("steal capped at 3", {"a": 10}, 0, 0, {}, 0, UNLIMITED, 3, 5, 0, 3),
    ("steal at most the need", {"a": 10}, 0, 0, {}, 0, UNLIMITED, 10, 5, 0, 5),
    ("steal at most the excess", {"a": 6, "b": 1}, 0, 0, {}, 0, UNLIMITED, 9, 3, 0, 3),
    ("target capped by max", {"a": 2}, 8, 0, {}, 0, 3, 1, 3, 3, 0),
    ("very old first, past target", {ME: 4, "a": 2}, 0, 4, {}, 0, UNLIMITED, 1, 5, 2, 0),
    ("very old: our share", {ME: 1, "a": 1}, 0, 10, {}, 0, UNLIMITED, 1, 6, 5, 0),
    ("very old up to max", {ME: 4}, 0, 3, {}, 0, 5, 1, 5, 1, 0),
    ("very old at max: nothing", {ME: 2, "a": 6}, 0, 1, {}, 0, 2, 1, 2, 0, 0),
    ("very old before free", {"a": 1}, 5, 2, {}, 0, UNLIMITED, 1, 4, 2, 0),
    ("dead worker's expired leases", {"a": 2}, 0, 0, {"dead": 3}, 0, UNLIMITED, 1, 3, 3, 0),
    ("SHARD_END leases not counted", {"a": 1}, 0, 0, {}, 5, UNLIMITED, 1, 1, 0, 0),
    ("at target: nothing", {ME: 3, "a": 3}, 2, 0, {}, 0, UNLIMITED, 1, 4, 1, 0),
    ("no leases at all", {}, 0, 0, {}, 7, UNLIMITED, 1, 0, 0, 0),
]


@pytest.mark.parametrize(
    (
        "live",
        "free",
        "old",
        "expired",
        "done",
        "max_leases",
        "max_steal",
        "target",
        "taken",
        "stolen",
    ),
    [row[1:] for row in PLAN_TABLE],
    ids=[row[0] for row in PLAN_TABLE],
)
def test_plan_table(
    live: dict[str, int],
    free: int,
    old: int,
    expired: dict[str, int],
    done: int,
    max_leases: int,
    max_steal: int,
    target: int,
    taken: int,
    stolen: int,
) -> None:
    scan = scan_of(live, free=free, very_old=old, expired=expired, finished=done)
    plan = plan_takes(
        scan,
        ME,
        max_leases_for_worker=max_leases,
        max_leases_to_steal=max_steal,
        rng=random.Random(7),
    )
    assert (plan.target, len(plan.take), len(plan.steal)) == (target, taken, stolen), plan.reason
    assert not any(x.checkpoint.is_shard_end for x in plan.leases)
    assert len({x.lease_key for x in plan.leases}) == len(plan.leases)
    if old:
        assert all(x.lease_key.startswith("new-") for x in plan.take)
    if stolen:
        assert {x.lease_owner for x in plan.steal} == {plan.victim}
        assert plan.victim is not None
        assert scan.count(plan.victim) == max(scan.owner_counts.values())


def test_spillover_is_reported() -> None:
    plan = plan_takes(scan_of({"a": 2}, free=8), ME, max_leases_for_worker=3, rng=random.Random())
    assert (plan.target, plan.spillover, plan.workers, plan.total) == (3, 2, 2, 10)


def test_steals_only_from_the_most_loaded_and_breaks_ties_at_random() -> None:
    scan = scan_of({"a": 5, "b": 4, "c": 1})
    for seed in range(20):
        plan = plan_takes(scan, ME, max_leases_to_steal=5, rng=random.Random(seed))
        assert plan.victim == "a" and len(plan.steal) == 2  # target 3: a has 2 over it
    tied = scan_of({"a": 4, "b": 4, "c": 1})
    victims = {plan_takes(tied, ME, rng=random.Random(seed)).victim for seed in range(40)}
    assert victims == {"a", "b"}


def test_the_plan_depends_on_the_seed_not_on_the_scan_order() -> None:
    scan = scan_of({"a": 1}, free=9)
    shuffled = ObservedScan(scan.now, tuple(reversed(scan.leases)), (), scan.owner_counts)
    first = plan_takes(scan, ME, rng=random.Random(3))
    assert first == plan_takes(shuffled, ME, rng=random.Random(3))
    assert any(plan_takes(scan, ME, rng=random.Random(s)) != first for s in range(10))


def test_cooldown_after_a_lease_was_taken_from_us_suppresses_stealing_only() -> None:
    base = scan_of({"a": 6})
    recent = ObservedScan(base.now, base.leases, (), base.owner_counts, {ME: base.now - 1})
    rng = random.Random(1)
    assert len(plan_takes(recent, ME, rng=rng).steal) == 1  # cooldown 0: the KCL's rule
    held = plan_takes(recent, ME, rng=rng, steal_cooldown=TIMING.steal_cooldown)
    assert held.leases == () and "cooldown" in held.reason
    long_ago = ObservedScan(
        base.now, base.leases, (), base.owner_counts, {ME: base.now - TIMING.steal_cooldown - 1e-6}
    )
    assert len(plan_takes(long_ago, ME, rng=rng, steal_cooldown=TIMING.steal_cooldown).steal) == 1
    free = scan_of({"a": 2}, free=2)
    free = ObservedScan(free.now, free.leases, (), free.owner_counts, {ME: free.now})
    assert len(plan_takes(free, ME, rng=rng, steal_cooldown=TIMING.steal_cooldown).take) == 2


def test_finished_leases_are_never_taken_even_when_very_old() -> None:
    scan = LeaseObserver(TIMING).observe(
        [Lease("done", SHARD_END), Lease("done-too", SHARD_END, "a", 3)], 0.0
    )
    assert plan_takes(scan, ME, rng=random.Random()).leases == ()


@pytest.mark.parametrize(
    ("name", "value"), [("max_leases_for_worker", 0), ("max_leases_to_steal", 0)]
)
def test_bad_limits_are_rejected(name: str, value: int) -> None:
    with pytest.raises(ValueError, match=name):
        plan_takes(scan_of(), ME, rng=random.Random(), **{name: value})


class Fleet:
    """Workers sharing an in-memory table of owners: every take interval each live worker renews
    its leases, then scans with its own observer and applies its plan with conditional takes."""

    def __init__(
        self,
        leases: int,
        workers: int,
        seed: int,
        *,
        lockstep: bool = False,
        cooldown: bool = True,
        max_steal: int = 1,
        status: bool = False,
    ) -> None:
        self.clock = ManualClock()
        self.table = {f"s{i:03d}": Lease(f"s{i:03d}", TRIM_HORIZON) for i in range(leases)}
        self.rng = random.Random(seed)
        self.lockstep, self.max_steal = lockstep, max_steal
        # Every worker ever started is known from its status record (which outlives a death).
        self.status = status
        self.cooldown = TIMING.steal_cooldown if cooldown else 0.0
        self.observers: dict[str, LeaseObserver] = {}
        self.alive: dict[str, bool] = {}
        for i in range(workers):
            self.join(f"w{i}")

    def join(self, worker: str) -> None:
        self.observers[worker] = LeaseObserver(TIMING)
        self.alive[worker] = True

    def round(self) -> int:
        """One take interval; returns how many leases changed owner."""
        self.clock.advance(TIMING.take_interval)
        now = self.clock.monotonic()
        for key, lease in self.table.items():
            if lease.lease_owner is not None and self.alive[lease.lease_owner]:
                self.table[key] = lease.bumped()
        order = sorted(w for w, up in self.alive.items() if up)
        self.rng.shuffle(order)
        plans = {w: self.plan(w, now) for w in order} if self.lockstep else {}
        moved = 0
        for worker in order:
            plan = plans[worker] if self.lockstep else self.plan(worker, now)
            for lease in plan.leases:
                current = self.table[lease.lease_key]
                if current.lease_counter == lease.lease_counter:  # the conditional write
                    self.table[lease.lease_key] = current.bumped(lease_owner=worker)
                    self.observers[worker].record_write(self.table[lease.lease_key], now)
                    moved += current.lease_owner != worker
        return moved

    def plan(self, worker: str, now: float) -> TakePlan:
        scan = self.observers[worker].observe(list(self.table.values()), now)
        rng = random.Random(self.rng.random())
        known = set(self.alive) - {worker} if self.status else set()
        return plan_takes(
            scan,
            worker,
            max_leases_to_steal=self.max_steal,
            rng=rng,
            steal_cooldown=self.cooldown,
            workers=known,
        )

    def settle(self, quiet: int = 10, limit: int = 200) -> int:
        """Run until ``quiet`` rounds pass with no owner change; returns the owner changes."""
        moved, still = 0, 0
        for _ in range(limit):
            changed = self.round()
            moved, still = moved + changed, (0 if changed else still + 1)
            if still >= quiet:
                return moved
        raise AssertionError(f"no convergence in {limit} rounds: {self.counts()}")

    def counts(self) -> dict[str, int]:
        counts = {w: 0 for w, up in self.alive.items() if up}
        for lease in self.table.values():
            assert lease.lease_owner in counts, f"{lease.lease_key} owned by {lease.lease_owner}"
            counts[lease.lease_owner] += 1
        return counts


def kcl_target(leases: int, workers: int) -> int:
    return 1 if workers >= leases else math.ceil(leases / workers)


@pytest.mark.parametrize("workers", range(1, 6))
@pytest.mark.parametrize("leases", range(1, 21))
def test_fair_share_from_a_fresh_table(workers: int, leases: int) -> None:
    fleet = Fleet(leases, workers, seed=leases * 10 + workers)
    fleet.settle()
    counts = fleet.counts().values()
    assert max(counts) == kcl_target(leases, workers)
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize(("workers", "leases"), [(2, 3), (3, 10), (4, 10), (5, 7), (3, 20)])
@pytest.mark.parametrize("lockstep", [False, True], ids=["staggered", "lockstep"])
def test_no_owner_changes_after_convergence(workers: int, leases: int, lockstep: bool) -> None:
    for seed in range(5):
        fleet = Fleet(leases, workers, seed, lockstep=lockstep, max_steal=2)
        fleet.settle()
        owners = {k: x.lease_owner for k, x in fleet.table.items()}
        for _ in range(100):
            assert fleet.round() == 0
        assert owners == {k: x.lease_owner for k, x in fleet.table.items()}


def test_a_joining_worker_gets_its_share_and_only_its_share_moves() -> None:
    for seed in range(10):
        fleet = Fleet(10, 3, seed)
        fleet.settle()
        fleet.join("new")
        moved = fleet.settle()
        counts = fleet.counts()
        assert max(counts.values()) - min(counts.values()) <= 1
        assert moved == counts["new"]  # no lease changed owner twice, none between old workers


def test_a_dead_workers_leases_are_taken_within_one_take_interval_after_expiry() -> None:
    for seed in range(10):
        fleet = Fleet(10, 3, seed)
        fleet.settle()
        last_renewal_seen = fleet.clock.monotonic()
        fleet.alive["w0"] = False  # stops renewing and taking
        while any(x.lease_owner == "w0" for x in fleet.table.values()):
            fleet.round()
        took = fleet.clock.monotonic() - last_renewal_seen
        assert took <= TIMING.lease_duration + TIMING.take_interval
        counts = fleet.counts()
        assert sorted(counts.values()) == [5, 5]


def test_the_cooldown_damps_churn_around_a_stalling_worker() -> None:
    def churn(cooldown: bool) -> int:
        total = 0
        for seed in range(10):
            fleet = Fleet(12, 3, seed, cooldown=cooldown)
            fleet.settle()
            for r in range(60):
                # Stalls three rounds in six: past the lease duration (rounds are take
                # intervals, half a lease duration each; a lease just moved to a worker gets
                # two), then is back and would steal.
                fleet.alive["w0"] = r % 6 >= 3
                total += fleet.round()
        return total

    assert churn(cooldown=True) < 0.8 * churn(cooldown=False)


def test_available_leases_are_taken_expired_first_then_reopened_then_unowned() -> None:
    observer = LeaseObserver(TIMING)
    expired = Lease("expired", TRIM_HORIZON, lease_owner="dead", lease_counter=4)
    released = Lease("released", TRIM_HORIZON, lease_owner="gone", lease_counter=7)
    parked = Lease("parked", TRIM_HORIZON, lease_owner="sick", lease_counter=2)
    busy = [Lease(f"busy-{i}", TRIM_HORIZON, lease_owner="busy", lease_counter=1) for i in range(3)]
    observer.observe([expired, released, parked, *busy], 0.0)
    # Then "gone" released its lease, "sick" parked its lease (released with a reopen time that
    # has come), "dead" stopped renewing, and "busy" kept renewing.
    now = TIMING.lease_duration + 1
    later = [
        expired,
        replace(released, lease_owner=None, lease_counter=8),
        replace(parked, lease_owner=None, lease_counter=4, closed_until=0.0, closed_count=1),
        *(replace(x, lease_counter=x.lease_counter + 5) for x in busy),
    ]
    scan = observer.observe(later, now)
    assert {o.key for o in scan.available} == {"expired", "released", "parked"}
    assert not scan.very_old
    orders = set()
    for seed in range(20):
        plan = plan_takes(scan, ME, rng=random.Random(seed))
        orders.add(tuple(x.lease_key for x in plan.take))
    # Target is ceil(6 / 2) = 3: all three, always in preference order.
    assert orders == {("expired", "parked", "released")}
    one = plan_takes(scan, ME, rng=random.Random(0), max_leases_for_worker=1)
    assert [x.lease_key for x in one.take] == ["expired"]


def test_very_old_leases_follow_the_same_preference() -> None:
    observer = LeaseObserver(TIMING)
    stale = Lease("stale", TRIM_HORIZON, lease_owner="dead", lease_counter=4)
    observer.observe([stale], 0.0)
    reopened = Lease("reopened", TRIM_HORIZON, closed_until=0.0, closed_count=1, lease_counter=3)
    fresh = [Lease(f"fresh-{i}", TRIM_HORIZON) for i in range(5)]
    scan = observer.observe([stale, reopened, *fresh], TIMING.very_old + 1)
    assert {o.key for o in scan.very_old} == {"stale", "reopened", *(x.lease_key for x in fresh)}
    for seed in range(20):
        plan = plan_takes(scan, ME, rng=random.Random(seed), max_leases_for_worker=2)
        assert [x.lease_key for x in plan.take] == ["stale", "reopened"]


def test_a_lease_already_being_handed_over_is_not_stolen_again() -> None:
    """The victim's leases mid-handoff (checkpoint owner set) are skipped; with only such
    leases nothing is stolen."""
    base = scan_of({"a": 4, "b": 4}, expired={})
    pending_keys = {"a-00", "a-01", "a-02"}

    def with_pending(keys: set[str]) -> ObservedScan:
        leases = tuple(
            replace(o, lease=replace(o.lease, checkpoint_owner="old")) if o.key in keys else o
            for o in base.leases
        )
        return replace(base, leases=leases)

    from_a = 0
    for seed in range(20):
        plan = plan_takes(with_pending(pending_keys), ME, rng=random.Random(seed))
        if plan.victim == "a":
            from_a += 1
            assert [x.lease_key for x in plan.steal] == ["a-03"]
    assert from_a > 0
    everything = {o.key for o in base.leases}
    plan = plan_takes(with_pending(everything), ME, rng=random.Random(1))
    assert plan.steal == ()


# live leases, expired leases, very old leases, workers known from status -> target, taken
KNOWN_TABLE = [
    ("fresh table: a quarter of it", {}, {}, 12, {"a", "b", "c"}, 3, 3),
    ("known worker holding nothing shares", {"a": 4}, {}, 4, {"a", "b"}, 4, 2),
    ("a phantom never holds back expired leases", {"a": 2}, {"dead": 4}, 0, {"a", "phantom"}, 3, 3),
    ("stalled worker shares nothing", {"a": 1}, {"gone": 1}, 4, {"a", "gone"}, 3, 4),
    ("nothing known", {}, {}, 6, set(), 6, 6),
]


@pytest.mark.parametrize(
    ("live", "expired", "old", "known", "target", "taken"),
    [row[1:] for row in KNOWN_TABLE],
    ids=[row[0] for row in KNOWN_TABLE],
)
def test_workers_known_from_their_status_share_the_very_old_leases_only(
    live: dict[str, int],
    expired: dict[str, int],
    old: int,
    known: set[str],
    target: int,
    taken: int,
) -> None:
    scan = scan_of(live, very_old=old, expired=expired)
    plan = plan_takes(scan, ME, rng=random.Random(3), workers=known)
    assert (plan.target, len(plan.take)) == (target, taken), plan.reason


def test_after_a_resume_the_first_to_scan_takes_its_share_not_every_lease() -> None:
    """A suspend released every lease (none very old: renewed until then): the first worker to
    scan counted itself alone and took them all; the others then stole back one a round."""
    scan = scan_of({}, free=12)  # released by the suspend: unowned, seen changing
    assert not scan.very_old
    plan = plan_takes(scan, ME, rng=random.Random(3), workers={"a", "b"})
    assert (plan.target, len(plan.take)) == (4, 4), plan.reason
    alone = plan_takes(scan, ME, rng=random.Random(3))
    assert (alone.target, len(alone.take)) == (12, 12)


@pytest.mark.parametrize(("workers", "leases"), [(4, 1000), (3, 10), (5, 7), (4, 40)])
def test_workers_started_together_each_take_a_fair_share_at_once(workers: int, leases: int) -> None:
    """Without the status records the first worker's first round takes everything (nobody else
    holds a lease yet) and balancing moves the rest one lease per round; with them, one round
    gives a fair share and no lease moves twice."""
    for seed in range(3):
        fleet = Fleet(leases, workers, seed, status=True)
        assert fleet.round() == leases
        counts = fleet.counts()
        assert max(counts.values()) == kcl_target(leases, workers)
        assert fleet.settle(quiet=5) == 0
        without = Fleet(leases, workers, seed)
        without.round()
        # What the status records fix: the first to scan takes (nearly) everything.
        assert max(without.counts().values()) >= leases - workers + 1


def test_a_dead_workers_fresh_status_does_not_halve_its_survivors_share() -> None:
    for seed in range(5):
        fleet = Fleet(10, 2, seed, status=True)
        fleet.settle()
        fleet.alive["w0"] = False  # its status record stays fresh a while longer
        for _ in range(4):
            fleet.round()
        assert fleet.counts() == {"w1": 10}
