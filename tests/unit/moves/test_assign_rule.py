"""The leader's assignment rule (kclpy_spark.moves.rules.assign_rule): table-driven over scans
made by a real observer, then a fleet in virtual time where one leader assigns and moves leases for
everyone."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.coordination import CpuFigure
from checkpoint.lease import Lease, WriteStamp
from checkpoint.leasing import LeaseTiming
from checkpoint.sequence import TRIM_HORIZON
from kclpy_spark.moves.rules import LeaseObserver
from kclpy_spark.moves.rules.assign_rule import (
    Suspects,
    leader_assigns,
    plan_assignments,
    quiet,
    targets_of,
)
from kclpy_spark.moves.rules.load import FleetCpu
from kclpy_spark.moves.rules.observer import ObservedLease, ObservedScan
from tests.unit.moves.test_take_rule import scan_of

TIMING = LeaseTiming(failover=10.0)

# live, free, very old, expired, running, max leases, max moves -> {worker: assigned}, moves
TABLE = [
    ("fresh table, 3 workers", {}, 0, 9, {}, {"a", "b", "c"}, 99, 1, {"a": 3, "b": 3, "c": 3}, 0),
    ("fill the emptiest first", {"a": 3}, 3, 0, {}, {"a", "b"}, 99, 1, {"a": 0, "b": 3}, 0),
    (
        "uneven free: fewest first",
        {"a": 2, "b": 1},
        3,
        0,
        {},
        {"a", "b"},
        99,
        1,
        {"a": 1, "b": 2},
        0,
    ),
    (
        "dead worker's leases to survivors",
        {"a": 2, "b": 2},
        0,
        0,
        {"dead": 4},
        {"a", "b", "dead"},
        99,
        1,
        {"a": 2, "b": 2},
        0,
    ),
    ("capped by max_leases_for_worker", {"a": 2}, 5, 0, {}, {"a", "b"}, 3, 1, {"a": 1, "b": 3}, 0),
    ("balanced: nothing", {"a": 3, "b": 2}, 0, 0, {}, {"a", "b"}, 99, 1, {}, 0),
    ("a joiner gets one per round", {"a": 4, "b": 4}, 0, 0, {}, {"a", "b", "c"}, 99, 1, {}, 1),
    (
        "two moves, different workers",
        {"a": 4, "b": 4},
        0,
        0,
        {},
        {"a", "b", "c", "d"},
        99,
        2,
        {},
        2,
    ),
    ("one giver, three takers", {"a": 9}, 0, 0, {}, {"a", "b", "c", "d"}, 99, 5, {}, 3),
    ("moves off", {"a": 6}, 0, 0, {}, {"a", "b"}, 99, 0, {}, 0),
    ("nobody running", {"a": 2}, 2, 0, {}, set(), 99, 1, {}, 0),
    ("owner not known as running keeps its leases", {"x": 4}, 2, 0, {}, {"a"}, 99, 1, {"a": 2}, 0),
]


@pytest.mark.parametrize(
    ("live", "free", "old", "expired", "running", "cap", "max_moves", "assigned", "moves"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_plan_table(
    live: dict[str, int],
    free: int,
    old: int,
    expired: dict[str, int],
    running: set[str],
    cap: int,
    max_moves: int,
    assigned: dict[str, int],
    moves: int,
) -> None:
    scan = scan_of(live, free=free, very_old=old, expired=expired)
    plan = plan_assignments(
        scan, running, rng=random.Random(5), max_leases_for_worker=cap, max_moves=max_moves
    )
    got = {t: sum(1 for a in plan.assign if a.to == t) for t in assigned}
    assert got == assigned, plan.reason
    assert sum(got.values()) == len(plan.assign)
    assert len(plan.moves) == moves, plan.reason
    for move in plan.moves:  # never to the lease's own owner, never a lease mid-handoff
        assert move.to != move.lease.lease_owner and not move.lease.handoff_pending
    assert len({a.lease.lease_key for a in plan.assign + plan.moves}) == len(
        plan.assign + plan.moves
    )


def test_a_worker_whose_leases_expired_is_no_target() -> None:
    scan = scan_of({"a": 1}, expired={"stalled": 2})
    assert targets_of(scan, {"a", "stalled"}) == ["a"]


def test_leases_mid_handoff_or_just_assigned_are_not_moved() -> None:
    observer, clock = LeaseObserver(TIMING), ManualClock()
    leases = [Lease(f"a-{i}", TRIM_HORIZON, "a", 1) for i in range(5)]
    # Four of a's leases are being handed to b: b counts 4, a 1, c none.
    leases = [replace(x, lease_owner="b", checkpoint_owner="a") for x in leases[:4]] + leases[4:]
    observer.observe(leases, clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe(leases, clock.monotonic())
    plan = plan_assignments(scan, {"a", "b", "c"}, rng=random.Random(1), max_moves=3)
    assert plan.counts == {"a": 1, "b": 4, "c": 0}
    assert plan.moves == ()  # b is the giver, but nothing of it may move yet
    settled = [Lease(f"b-{i}", TRIM_HORIZON, "b", 1) for i in range(4)]
    observer.observe(settled, clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe(settled, clock.monotonic())
    kept = {"b-0", "b-1", "b-2"}
    plan = plan_assignments(scan, {"b", "c"}, rng=random.Random(1), max_moves=3, keep=kept)
    assert [m.lease.lease_key for m in plan.moves] == ["b-3"]


def test_load_moves_take_the_hot_shards_neighbour_not_the_hot_shard() -> None:
    observer, clock = LeaseObserver(TIMING), ManualClock()
    hot = Lease("hot", TRIM_HORIZON, "a", 1, throughput_kbps=100.0)
    cold = [Lease(f"cold-{i}", TRIM_HORIZON, "a", 1, throughput_kbps=10.0) for i in range(3)]
    observer.observe([hot, *cold], clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe([hot.bumped(), *(x.bumped() for x in cold)], clock.monotonic())
    plan = plan_assignments(scan, {"a", "b"}, rng=random.Random(2), max_moves=3, max_load_moves=3)
    assert plan.moves and {m.to for m in plan.moves} == {"b"}
    assert "hot" not in {m.lease.lease_key for m in plan.moves}
    one = plan_assignments(scan, {"a", "b"}, rng=random.Random(2), max_moves=9)
    assert len(one.moves) == 1  # max_load_moves (max_leases_to_steal) bounds the load path
    kept = plan_assignments(
        scan, {"a", "b"}, rng=random.Random(2), max_moves=3, max_load_moves=3,
        keep={"cold-0", "cold-1"},
    )  # fmt: skip
    assert [m.lease.lease_key for m in kept.moves] == ["cold-2"]


def test_no_lease_moves_between_two_workers_of_another_kcl() -> None:
    """Java KCL 3.x workers (metrics entities) were targets like ours: the leader moved leases
    from one to another while their own leader balanced them by CPU: two balancers over the
    same leases move them back and forth. Ours still give to them and take from them."""
    java = {"java-1", "java-2"}
    scan = scan_of({"java-1": 6, "java-2": 2, "ours": 4})
    plan = plan_assignments(scan, {*java, "ours"}, rng=random.Random(1), max_moves=3,
                            foreign=java)  # fmt: skip
    assert plan.moves and all(not (m.lease.lease_owner in java and m.to in java)
                              for m in plan.moves)  # fmt: skip
    assert [(m.lease.lease_owner, m.to) for m in plan.moves] == [
        ("java-1", "ours"), ("ours", "java-2")
    ]  # fmt: skip
    java_apart = scan_of({"java-1": 6, "java-2": 2, "ours": 5})  # only java-1 -> java-2 evens
    moves = plan_assignments(java_apart, {*java, "ours"}, rng=random.Random(1), max_moves=3,
                             foreign=java).moves  # fmt: skip
    assert all("ours" in (m.lease.lease_owner, m.to) for m in moves)
    observer, clock = LeaseObserver(TIMING), ManualClock()  # and by load
    hot = [Lease(f"j1-{i}", TRIM_HORIZON, "java-1", 1, throughput_kbps=50.0) for i in range(4)]
    cool = [Lease("j2-0", TRIM_HORIZON, "java-2", 1, throughput_kbps=1.0)]
    mine = [Lease(f"o-{i}", TRIM_HORIZON, "ours", 1, throughput_kbps=40.0) for i in range(3)]
    observer.observe(hot + cool + mine, clock.monotonic())
    clock.advance(1.0)
    by_load = observer.observe([x.bumped() for x in hot + cool + mine], clock.monotonic())
    load_plan = plan_assignments(by_load, {*java, "ours"}, rng=random.Random(3), max_moves=3,
                                 max_load_moves=3, foreign=java)  # fmt: skip
    assert all(not (m.lease.lease_owner in java and m.to in java) for m in load_plan.moves)


def test_load_moves_never_take_a_worker_past_its_max_leases_for_worker() -> None:
    """A target below the cap was given as many as max_leases_to_steal, past the cap (the
    worker-mode rule stopped at it)."""
    observer, clock = LeaseObserver(TIMING), ManualClock()
    a = [Lease(f"a-{i}", TRIM_HORIZON, "a", 1, throughput_kbps=10.0) for i in range(8)]
    b = [Lease(f"b-{i}", TRIM_HORIZON, "b", 1, throughput_kbps=0.0) for i in range(4)]
    observer.observe(a + b, clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe([x.bumped() for x in a + b], clock.monotonic())
    plan = plan_assignments(scan, {"a", "b"}, rng=random.Random(1), max_leases_for_worker=5,
                            max_moves=6, max_load_moves=3)  # fmt: skip
    assert plan.moves and 4 + sum(m.to == "b" for m in plan.moves) <= 5


def test_load_moves_follow_the_cpu_when_every_target_publishes_it() -> None:
    """By bytes 'a' (four leases of 1 KB/s) carries less than 'b' (three of 20 KB/s); its CPU says
    it is the busy one: the leader moves one of a's leases to b, and nothing while a figure is
    unsettled."""
    observer, clock = LeaseObserver(TIMING), ManualClock()
    leases = [Lease(f"a-{i}", TRIM_HORIZON, "a", 1, throughput_kbps=1.0) for i in range(4)]
    leases += [Lease(f"b-{i}", TRIM_HORIZON, "b", 1, throughput_kbps=20.0) for i in range(3)]
    observer.observe(leases, clock.monotonic())
    clock.advance(1.0)
    scan = observer.observe([x.bumped() for x in leases], clock.monotonic())
    by_bytes = plan_assignments(scan, {"a", "b"}, rng=random.Random(2))
    assert [m.to for m in by_bytes.moves] == ["a"]
    wall = 5_000.0  # the scan's wall time: both windows began after the first scan dated a, b
    after = wall - 0.5
    busy = FleetCpu({"a": CpuFigure(85.0, since=after), "b": CpuFigure(30.0, since=after)}, wall)
    plan = plan_assignments(scan, {"a", "b"}, rng=random.Random(2), cpu=busy)
    assert [(m.lease.lease_key[:2], m.to) for m in plan.moves] == [("a-", "b")], plan.reason
    before = wall - 2.0  # b's window began before the first scan dated it
    waiting = FleetCpu(
        {"a": CpuFigure(85.0, since=after), "b": CpuFigure(30.0, since=before)}, wall
    )
    assert plan_assignments(scan, {"a", "b"}, rng=random.Random(2), cpu=waiting).moves == ()


class LedFleet:
    """Workers on one table of owners in virtual time: every take interval the live workers
    renew; the leader (the first live worker) scans, assigns free leases (a take naming the
    target) and moves one lease (taken at once here: the handoff's two steps collapsed). Status
    records are written every other round and count as running for three rounds."""

    def __init__(self, leases: int, workers: int, seed: int) -> None:
        self.clock = ManualClock()
        self.table = {f"s{i:03d}": Lease(f"s{i:03d}", TRIM_HORIZON) for i in range(leases)}
        self.rng = random.Random(seed)
        self.alive = {f"w{i}": True for i in range(workers)}
        self.observer = LeaseObserver(TIMING)
        self.suspects = Suspects()
        self.leader = "w0"
        self.status = {w: self.clock.monotonic() for w in self.alive}  # worker -> written at

    def round(self) -> int:
        self.clock.advance(TIMING.take_interval)
        now = self.clock.monotonic()
        for key, lease in self.table.items():
            if lease.lease_owner is not None and self.alive[lease.lease_owner]:
                self.table[key] = lease.bumped()
        for w, up in self.alive.items():
            if up and (w not in self.status or int(now / TIMING.take_interval) % 2 == 0):
                self.status[w] = now
        if not self.alive[self.leader]:  # a new leader, with a fresh memory
            self.leader = min(w for w, up in self.alive.items() if up)
            self.observer, self.suspects = LeaseObserver(TIMING), Suspects()
        scan = self.observer.observe(list(self.table.values()), now)
        running = {w: t for w, t in self.status.items() if now - t <= 3 * TIMING.take_interval}
        targets = self.suspects.targets(scan, running)
        plan = plan_assignments(scan, targets, rng=random.Random(self.rng.random()))
        moved = 0
        for a in plan.assign + plan.moves:
            current = self.table[a.lease.lease_key]
            if current.lease_counter == a.lease.lease_counter:
                self.table[a.lease.lease_key] = current.bumped(lease_owner=a.to)
                self.observer.record_write(self.table[a.lease.lease_key], now)
                moved += current.lease_owner != a.to
        return moved

    def counts(self) -> dict[str, int]:
        counts = {w: 0 for w, up in self.alive.items() if up}
        for lease in self.table.values():
            assert lease.lease_owner in counts, f"{lease.lease_key}: {lease.lease_owner}"
            counts[lease.lease_owner] += 1
        return counts

    def settle(self, limit: int = 200) -> int:
        moved, still = 0, 0
        for _ in range(limit):
            changed = self.round()
            moved, still = moved + changed, (0 if changed else still + 1)
            if still >= 10:
                return moved
        raise AssertionError(f"no convergence: {self.counts()}")


@pytest.mark.parametrize(("leases", "workers"), [(10, 3), (7, 5), (1000, 4), (40, 50)])
def test_a_fresh_table_is_split_fairly_in_one_round_and_never_moves_again(
    leases: int, workers: int
) -> None:
    fleet = LedFleet(leases, workers, seed=leases + workers)
    assert fleet.round() == leases
    counts = fleet.counts().values()
    assert max(counts) - min(counts) <= 1
    assert fleet.settle() == 0


def test_a_dead_workers_leases_go_to_the_survivors_and_a_dead_leader_is_replaced() -> None:
    for dead in ("w1", "w0"):  # a worker, then the leader
        fleet = LedFleet(12, 3, seed=3)
        fleet.settle()
        fleet.alive[dead] = False
        fleet.settle()
        assert sorted(fleet.counts().values()) == [6, 6]


def test_a_joiner_gets_its_share_and_only_its_share_moves() -> None:
    fleet = LedFleet(12, 3, seed=4)
    fleet.settle()
    fleet.alive["w3"] = True
    assert fleet.settle() == 3
    assert sorted(fleet.counts().values()) == [3, 3, 3, 3]


def test_a_suspect_is_a_target_again_only_once_its_status_is_written_again() -> None:
    suspects = Suspects()
    stalled_scan = scan_of({"a": 1}, expired={"b": 1})
    assert suspects.targets(stalled_scan, {"a": 10.0, "b": 10.0}) == ["a"]
    moved_on = scan_of({"a": 2})
    assert suspects.targets(moved_on, {"a": 12.0, "b": 10.0}) == ["a"]  # its old status
    assert suspects.targets(moved_on, {"a": 14.0, "b": 15.0}) == ["a", "b"]  # it runs again


@pytest.mark.parametrize(
    ("assigning", "leases", "workers", "assigns"),
    [
        (False, 128, 8, True),  # both thresholds reached
        (False, 127, 50, False),
        (False, 10_000, 7, False),
        (True, 127, 7, True),  # once assigning, it keeps on down to three quarters
        (True, 96, 6, True),
        (True, 95, 50, False),
        (True, 10_000, 5, False),
        (False, 96, 6, False),  # and back only above the thresholds themselves
    ],
)
def test_an_auto_leader_assigns_from_the_thresholds_and_stops_below_three_quarters(
    assigning: bool, leases: int, workers: int, assigns: bool
) -> None:
    got = leader_assigns(assigning, leases, workers, from_leases=128, from_workers=8)
    assert got is assigns


# Two streams of one application (the KCL's multi-stream lease keys).
STREAM_A, STREAM_B = "111122223333:orders:1700000000", "111122223333:clicks:1700000001"


def two_stream_scan(
    live: dict[str, list[str]], free: list[str] = (), throughput: float | None = None
) -> ObservedScan:
    """A scan whose ``live`` leases (owner -> each lease's stream key) were renewed over a lease
    duration, and whose ``free`` ones (stream keys) were released."""
    observer, clock = LeaseObserver(TIMING), ManualClock()
    kbps = {} if throughput is None else {"throughput_kbps": throughput}
    before = [
        Lease(f"{stream}:shardId-{owner}{i:02d}", TRIM_HORIZON, owner, 1, **kbps)
        for owner, streams in live.items()
        for i, stream in enumerate(streams)
    ]
    before += [Lease(f"{s}:shardId-free{i:02d}", TRIM_HORIZON, "gone", 1) for i, s in
               enumerate(free)]  # fmt: skip
    observer.observe(before, clock.monotonic())
    clock.advance(TIMING.lease_duration + 1)
    after = [x.bumped(lease_owner=None) if "free" in x.lease_key else x.bumped() for x in before]
    return observer.observe(after, clock.monotonic())


def test_a_free_lease_goes_only_to_a_worker_that_consumes_its_stream() -> None:
    """The least loaded worker consumes only stream A: stream B's free leases went to it, it did
    not take them, and each waited out its expiry unread (then went to it again)."""
    scan = two_stream_scan({"a-only": [], "both": [STREAM_A, STREAM_B]}, [STREAM_B, STREAM_B])
    consumes = {"a-only": frozenset({STREAM_A})}  # "both" names none: every stream
    plan = plan_assignments(scan, {"a-only", "both"}, rng=random.Random(3), consumes=consumes)
    assert [a.to for a in plan.assign] == ["both", "both"]
    plan = plan_assignments(scan, {"a-only", "both"}, rng=random.Random(3))
    assert [a.to for a in plan.assign] == ["a-only", "a-only"]  # the rule without it


def test_a_free_lease_of_a_stream_nobody_consumes_is_left_and_said_so() -> None:
    scan = two_stream_scan({"a-only": []}, [STREAM_B, STREAM_A])
    consumes = {"a-only": frozenset({STREAM_A})}
    plan = plan_assignments(scan, {"a-only"}, rng=random.Random(3), consumes=consumes)
    assert [a.lease.stream_key for a in plan.assign] == [STREAM_A]
    assert plan.spillover == 1
    assert "1 left: no running worker consumes its stream" in plan.reason
    assert "max_leases_for_worker" not in plan.reason


def test_count_moves_go_only_to_a_worker_that_consumes_the_leases_stream() -> None:
    """A worker new to the fleet that consumes only stream A is the least loaded: only A's
    leases move to it, whatever the giver holds most of."""
    scan = two_stream_scan({"giver": [STREAM_B] * 5 + [STREAM_A], "a-only": []})
    consumes = {"a-only": frozenset({STREAM_A})}
    for seed in range(10):
        plan = plan_assignments(
            scan, {"giver", "a-only"}, rng=random.Random(seed), max_moves=3, consumes=consumes
        )
        assert [(m.to, m.lease.stream_key) for m in plan.moves] == [("a-only", STREAM_A)]
    only_b = two_stream_scan({"giver": [STREAM_B] * 6, "a-only": []})
    plan = plan_assignments(
        only_b, {"giver", "a-only"}, rng=random.Random(1), max_moves=3, consumes=consumes
    )
    assert plan.moves == () and plan.reason == "balanced by count"


def test_load_moves_go_only_to_a_worker_that_consumes_the_leases_stream() -> None:
    scan = two_stream_scan(
        {"giver": [STREAM_B] * 5 + [STREAM_A], "a-only": [STREAM_A]}, throughput=10.0
    )
    consumes = {"a-only": frozenset({STREAM_A})}
    for seed in range(10):
        plan = plan_assignments(
            scan, {"giver", "a-only"}, rng=random.Random(seed), max_moves=3, max_load_moves=3,
            consumes=consumes,
        )  # fmt: skip
        assert plan.moves, plan.reason
        assert {(m.to, m.lease.stream_key) for m in plan.moves} == {("a-only", STREAM_A)}


def test_a_worker_of_one_stream_gets_its_leases_though_the_busiest_holds_another_stream() -> None:
    """The busiest worker holds only stream B's leases: the new worker, consuming A, was
    dropped for the round, and stayed idle while the plan said "balanced by count"."""
    scan = two_stream_scan({"g1": [STREAM_B] * 10, "g2": [STREAM_A] * 9, "x": []})
    consumes = {"x": frozenset({STREAM_A})}
    for seed in range(10):
        plan = plan_assignments(
            scan, {"g1", "g2", "x"}, rng=random.Random(seed), max_moves=3, consumes=consumes
        )
        assert [(m.lease.lease_owner, m.to) for m in plan.moves] == [("g2", "x")], plan.reason
        assert plan.moves[0].lease.stream_key == STREAM_A


def test_load_moves_take_from_the_busiest_worker_holding_a_stream_the_thief_consumes() -> None:
    """The most loaded worker holds only stream B's leases and the least loaded consumes only A:
    the load rule chose that worker as its victim, found nothing it could take, and the new
    worker stayed idle beside a loaded worker of stream A."""
    scan = two_stream_scan({"g1": [STREAM_B] * 10, "g2": [STREAM_A] * 9, "x": []}, throughput=10.0)
    consumes = {"x": frozenset({STREAM_A})}
    for seed in range(10):
        plan = plan_assignments(
            scan, {"g1", "g2", "x"}, rng=random.Random(seed), max_moves=3, max_load_moves=3,
            consumes=consumes,
        )  # fmt: skip
        assert plan.moves, plan.reason
        assert {(m.lease.lease_owner, m.to, m.lease.stream_key) for m in plan.moves} == {
            ("g2", "x", STREAM_A)
        }


def test_a_worker_handing_a_lease_over_is_given_no_free_lease_past_its_cap() -> None:
    """Its lease being handed over counts for the thief, but it runs it until the handoff
    completes: the leader gave it a free lease at its cap, which it gave back, and the leader
    gave it again, until the handoff was done."""
    observer, clock = LeaseObserver(TIMING), ManualClock()
    before = [
        Lease("a", TRIM_HORIZON, "thief", 1, checkpoint_owner="w"),  # w hands it to thief
        Lease("b", TRIM_HORIZON, "w", 1),
        Lease("t", TRIM_HORIZON, "thief", 1),
        Lease("free", TRIM_HORIZON, "gone", 1),
    ]
    observer.observe(before, clock.monotonic())
    clock.advance(TIMING.lease_duration + 1)
    after = [x.bumped(lease_owner=None) if x.lease_key == "free" else x.bumped() for x in before]
    scan = observer.observe(after, clock.monotonic())
    plan = plan_assignments(scan, {"w", "thief"}, rng=random.Random(1), max_leases_for_worker=2)
    assert plan.assign == () and plan.spillover == 1, plan.reason
    for seed in range(10):  # a worker with room gets it
        plan = plan_assignments(
            scan, {"w", "thief", "other"}, rng=random.Random(seed), max_leases_for_worker=2
        )
        assert [a.to for a in plan.assign] == ["other"], plan.reason


def _held(key: str, owner: str, changed: float, *, stamped: bool = True, expired: bool = False,
          handing_to: str | None = None) -> ObservedLease:  # fmt: skip
    lease = Lease(key, TRIM_HORIZON, lease_owner=handing_to or owner, lease_counter=3,
                  checkpoint_owner=owner if handing_to else None,
                  written=WriteStamp(3, 1_000.0) if stamped else None)  # fmt: skip
    return ObservedLease(lease, changed, expired=expired, very_old=False)


@pytest.mark.parametrize(
    ("leases", "quiet_ones"),
    [
        ([_held("a1", "a", 95.0), _held("b1", "b", 90.0)], {"b"}),  # b: 10 s unrenewed
        ([_held("b1", "b", 90.0), _held("b2", "b", 99.0)], set()),  # one of its leases renewed
        ([_held("b1", "b", 95.1)], set()),  # a renewal 4.9 s ago: within the allowance
        ([_held("k1", "kcl", 80.0, stamped=False)], set()),  # a KCL worker's: dated by scans
        # A KCL worker renewing its own; a lease just moved to it still bears our stamp.
        ([_held("k1", "kcl", 99.0, stamped=False), _held("k2", "kcl", 90.0)], set()),
        ([_held("b1", "b", 80.0, expired=True)], set()),  # expired: stalled, the older rule
        # Mid-handoff the worker still processing it is judged, not its new owner.
        ([_held("b1", "b", 90.0, handing_to="c"), _held("c1", "c", 99.0)], {"b"}),
    ],
)
def test_a_worker_whose_leases_went_unrenewed_a_while_is_quiet(
    leases: list[ObservedLease], quiet_ones: set[str]
) -> None:
    assert quiet(ObservedScan(now=100.0, leases=tuple(leases)), after=5.0) == quiet_ones


def test_a_worker_killed_a_moment_ago_is_no_target_until_it_renews_again() -> None:
    """Its leases not yet expired, its status record fresh for two lease durations: a lease
    the leader gave it, or a stopping worker handed it, waited for its expiry again."""
    suspects = Suspects(quiet_after=5.0)
    running = {"a": 10.0, "b": 10.0}
    quiet_b = ObservedScan(now=100.0, leases=(_held("a1", "a", 98.0), _held("b1", "b", 93.0)))
    assert suspects.targets(quiet_b, running) == ["a"]
    assert suspects.quiet == {"b"} and "b" not in suspects  # the take rule still counts it
    assert suspects.targets(quiet_b, running, exempt={"b"}) == ["a", "b"]  # the leader itself
    renewed = ObservedScan(now=103.0, leases=(_held("a1", "a", 101.0), _held("b1", "b", 102.0)))
    assert suspects.targets(renewed, running) == ["a", "b"]
