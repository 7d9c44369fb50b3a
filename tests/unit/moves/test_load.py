"""Load-aware balancing (kclpy_spark/moves/rules/load.py): weights, the steal rule table-driven, and
fleets of simulated workers that must converge without moving a lease back and forth."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from kclpy_spark.moves.rules import ObservedLease, ObservedScan, plan_takes
from kclpy_spark.moves.rules.load import (
    FLOOR_KBPS,
    CpuFigure,
    FleetCpu,
    ema,
    has_load,
    plan_load_steal,
    weights,
)

ME = "me"


def scan(owned: dict[str, list[float | None]]) -> ObservedScan:
    """Every lease live (renewed lately); ``owned``: worker -> throughput of each lease."""
    leases = [
        Lease(f"{owner}-{i:02d}", TRIM_HORIZON, owner, 1, throughput_kbps=kbps)
        for owner, values in owned.items()
        for i, kbps in enumerate(values)
    ]
    observed = tuple(ObservedLease(x, 0.0, expired=False, very_old=False) for x in leases)
    counts = Counter(x.lease_owner for x in leases if x.lease_owner)
    return ObservedScan(now=100.0, leases=observed, owner_counts=dict(counts))


def test_ema_is_the_kcl3_moving_average() -> None:
    assert ema(None, 10.0) == 10.0
    assert ema(10.0, 20.0) == 15.0
    assert ema(10.0, 20.0, alpha=0.25) == 12.5


def test_weights_add_the_floor_and_give_unmeasured_leases_the_mean() -> None:
    leases = [
        Lease("a", TRIM_HORIZON, throughput_kbps=10.0),
        Lease("b", TRIM_HORIZON, throughput_kbps=0.0),
        Lease("c", TRIM_HORIZON),
    ]
    assert weights(leases) == {"a": 10 + FLOOR_KBPS, "b": FLOOR_KBPS, "c": 5 + FLOOR_KBPS}
    assert weights([Lease("c", TRIM_HORIZON)]) == {"c": FLOOR_KBPS}


# name, leases (worker -> throughputs), stolen lease keys (None: no steal)
CASES = [
    ("hot lease: a cold one moves", {"a": [10.0, 1.0], ME: [1.0]}, ["a-01"]),
    ("hot lease alone: never moved", {"a": [10.0], ME: [1.0, 1.0]}, []),
    ("idle fleet: by count", {"a": [0.0, 0.0, 0.0, 0.0], ME: []}, ["a-0?"]),
    ("idle fleet 2/1: stable", {"a": [0.0, 0.0], ME: [0.0]}, []),
    ("within 10% of the average: nothing", {"a": [10.0, 10.5], ME: [19.0]}, []),
    ("victim within 10%: nothing", {"a": [10.0], "b": [10.0], ME: [8.0]}, []),
    ("the heaviest that fits 60% of the gap", {"a": [8.0, 4.0, 1.0], ME: []}, ["a-00"]),
    ("too heavy for 60% of the gap", {"a": [20.0, 3.0], ME: [9.0]}, ["a-01"]),
    ("pending handoff is skipped", {"a": [5.0, 5.0], ME: []}, ["a-0?"]),
]


@pytest.mark.parametrize(("name", "owned", "stolen"), CASES, ids=[c[0] for c in CASES])
def test_the_load_steal_rule(
    name: str, owned: dict[str, list[float | None]], stolen: list[str]
) -> None:
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(3))
    keys = [x.lease_key for x in decided.steal]
    assert len(keys) == len(stolen), decided.reason
    for key, pattern in zip(keys, stolen, strict=True):
        assert key[:-1] == pattern[:-1] and (pattern[-1] == "?" or key == pattern)
    assert decided.reason


def test_a_lease_being_handed_over_is_not_stolen_by_load() -> None:
    base = scan({"a": [5.0, 5.0, 5.0], ME: []})
    leases = tuple(
        o if o.key == "a-02" else ObservedLease(
            Lease(o.key, TRIM_HORIZON, "a", 1, checkpoint_owner="z", throughput_kbps=5.0),
            0.0, expired=False, very_old=False,
        )
        for o in base.leases
    )  # fmt: skip
    decided = plan_load_steal(
        ObservedScan(base.now, leases, owner_counts=base.owner_counts), ME, rng=random.Random(1)
    )
    assert [x.lease_key for x in decided.steal] == ["a-02"]


def test_load_mode_needs_a_measured_lease() -> None:
    assert not has_load(scan({"a": [None, None], ME: [None]}))
    assert has_load(scan({"a": [None, 2.0], ME: [None]}))


def test_plan_takes_steals_by_load_even_over_the_count_target() -> None:
    """Counts say 'me' (3 cold leases) is over target, so the count rule steals nothing; the
    loads say 'a' (2 hot) carries far more: one hot lease moves, and 'a' does not take it back."""
    plan = plan_takes(scan({"a": [20.0, 20.0], ME: [0.0, 0.0, 0.0]}), ME, rng=random.Random(1))
    assert [x.lease_key for x in plan.steal] in (["a-00"], ["a-01"])
    assert "load" in plan.reason
    after = scan({"a": [20.0], ME: [0.0, 0.0, 0.0, 20.0]})
    assert plan_takes(after, "a", rng=random.Random(1)).steal == ()


def simulate(throughputs: list[float], workers: int, seed: int, rounds: int = 300) -> list[int]:
    """Workers take turns (random order) planning on the same table; returns the number of
    moves per round. Every lease starts on worker 0 (the others just joined)."""
    rng = random.Random(seed)
    owner = {f"s{i:02d}": "w0" for i in range(len(throughputs))}
    kbps = {f"s{i:02d}": t for i, t in enumerate(throughputs)}
    names = [f"w{i}" for i in range(workers)]
    moves = []
    for _ in range(rounds):
        moved = 0
        for w in rng.sample(names, len(names)):
            leases = [
                Lease(k, TRIM_HORIZON, o, 1, throughput_kbps=kbps[k]) for k, o in owner.items()
            ]
            observed = tuple(ObservedLease(x, 0.0, expired=False, very_old=False) for x in leases)
            counts = Counter(owner.values())
            plan = plan_takes(ObservedScan(0.0, observed, owner_counts=dict(counts)), w, rng=rng)
            for lease in plan.steal:
                owner[lease.lease_key] = w
                moved += 1
        moves.append(moved)
    final = Counter(owner.values())
    assert set(final) <= set(names)
    simulate.final = owner  # type: ignore[attr-defined]
    return moves


@pytest.mark.parametrize("seed", range(5))
def test_one_hot_shard_four_shards_two_workers_converges_and_stays(seed: int) -> None:
    moves = simulate([50.0, 5.0, 5.0, 5.0], workers=2, seed=seed)
    assert sum(moves[50:]) == 0, "leases still moving after 50 rounds"
    owner = simulate.final  # type: ignore[attr-defined]
    hot_worker = owner["s00"]
    assert [k for k, o in owner.items() if o == hot_worker] == ["s00"]


@pytest.mark.parametrize(("workers", "leases", "seed"), [(3, 12, 1), (5, 40, 2), (4, 9, 3)])
def test_random_loads_converge_without_oscillating(workers: int, leases: int, seed: int) -> None:
    rng = random.Random(seed)
    throughputs = [rng.choice([0.0, 1.0, 5.0, 20.0, 100.0]) * rng.random() for _ in range(leases)]
    moves = simulate(throughputs, workers=workers, seed=seed)
    assert sum(moves[100:]) == 0, f"still moving after 100 rounds: {moves[100:110]}"
    assert sum(moves) <= 3 * leases  # every move lowers the sum of squared loads


def test_load_steals_stop_at_max_leases_for_worker() -> None:
    owned = {"a": [20.0, 20.0, 1.0, 1.0], ME: [0.0]}
    assert plan_takes(scan(owned), ME, rng=random.Random(1), max_leases_for_worker=1).steal == ()
    assert plan_takes(scan(owned), ME, rng=random.Random(1), max_leases_for_worker=2).steal


# --- by CPU -------------------------------------------------------------------------------------


def cpus(**percent: float | None) -> FleetCpu:
    return FleetCpu({w: CpuFigure(p) for w, p in percent.items()})


# name, leases (worker -> throughputs), CPU figures, stolen lease keys, measured by CPU
CPU_CASES = [
    ("no CPU figures: by throughput", {"a": [10.0, 10.0, 10.0], ME: [1.0]}, None, ["a-0?"], False),
    ("a worker without a figure: by throughput", {"a": [10.0, 10.0, 10.0], ME: [1.0]},
     FleetCpu({ME: CpuFigure(30.0)}), ["a-0?"], False),
    ("fleet below the floor: by throughput", {"a": [10.0, 10.0, 10.0], ME: [1.0]},
     cpus(a=15.0, me=5.0), ["a-0?"], False),
    ("bytes say steal, CPU says even", {"a": [10.0, 10.0, 10.0], ME: [1.0]},
     cpus(a=50.0, me=48.0), [], True),
    ("bytes say even, CPU says steal", {"a": [1.0, 1.0, 1.0, 1.0], ME: [10.0, 10.0]},
     cpus(a=80.0, me=30.0), ["a-0?"], True),
    ("CPU: less than the noise gap", {"a": [1.0, 1.0, 1.0, 1.0], ME: [1.0]},
     cpus(a=25.5, me=20.6), [], True),
    ("CPU: just over the noise gap", {"a": [1.0] * 10, ME: []},
     cpus(a=26.0, me=20.5), ["a-0?"], True),
    ("CPU: a hot lease alone never moves", {"a": [50.0], ME: [1.0, 1.0, 1.0]},
     cpus(a=90.0, me=30.0), [], True),
    ("CPU: the costliest that fits 60% of the gap", {"a": [20.0, 4.0, 1.0, 1.0], ME: []},
     cpus(a=80.0, me=2.0), ["a-01"], True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "owned", "figures", "stolen", "by_cpu"), CPU_CASES, ids=[c[0] for c in CPU_CASES]
)
def test_the_load_steal_rule_by_cpu(
    name: str,
    owned: dict[str, list[float | None]],
    figures: FleetCpu | None,
    stolen: list[str],
    by_cpu: bool,
) -> None:
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(3), cpu=figures)
    keys = [x.lease_key for x in decided.steal]
    assert len(keys) == len(stolen), decided.reason
    for key, pattern in zip(keys, stolen, strict=True):
        assert key[:-1] == pattern[:-1] and (pattern[-1] == "?" or key == pattern)
    assert decided.by_cpu is by_cpu and decided.reason
    if by_cpu:
        assert figures is not None
        assert "% CPU" in decided.reason and decided.loads[ME] == figures.figures[ME].percent


@pytest.mark.parametrize(
    "figures",
    [
        {"a": CpuFigure(80.0, settled=False), ME: CpuFigure(10.0)},
        {"a": CpuFigure(80.0), ME: CpuFigure(10.0, settled=False)},
        {"a": CpuFigure(80.0), ME: CpuFigure(None, settled=False)},  # no window measured yet
    ],
)
def test_an_unsettled_cpu_figure_holds_every_move_by_load(figures: dict[str, CpuFigure]) -> None:
    """A figure measured while its worker started or ended a consumer describes neither its old
    leases nor its new ones: judging on it would move again before the last move shows."""
    owned: dict[str, list[float | None]] = {"a": [5.0, 5.0, 5.0, 5.0], ME: []}
    fleet = FleetCpu(figures)
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=fleet)
    assert decided.steal == () and "current" in decided.reason
    # ... and the count rule does not step in: the taker's load path is the one deciding.
    assert plan_takes(scan(owned), ME, rng=random.Random(1), cpu=fleet).steal == ()


@pytest.mark.parametrize(
    ("moved", "ago", "steals"),
    [
        ("a", 10.0, False),
        (ME, 10.0, False),
        ("a", 30.0, True),
        ("b", 1.0, True),
        ("a", 20.5, False),
        ("a", 21.5, True),
    ],  # a second of skew: after the move by 1 s or more
)
def test_a_figure_from_before_the_last_lease_move_holds_moves_by_load(
    moved: str, ago: float, steals: bool
) -> None:
    """Figures whose windows began 20 s ago: a move the scan saw 10 s ago (to or from the thief
    or the victim) makes them describe the leases before it; one 30 s ago does not, nor a move
    of a third worker's."""
    owned: dict[str, list[float | None]] = {"a": [5.0, 5.0, 5.0, 5.0], ME: []}
    base = scan(owned)
    seen = ObservedScan(base.now, base.leases, owner_counts=base.owner_counts,
                        moved_at={moved: base.now - ago})  # fmt: skip
    wall = 1_000.0  # the wall time of the scan (base.now on the monotonic clock)
    figures = {"a": CpuFigure(80.0, since=wall - 20.0), ME: CpuFigure(10.0, since=wall - 20.0)}
    decided = plan_load_steal(seen, ME, rng=random.Random(1), cpu=FleetCpu(figures, wall, 1.0))
    assert bool(decided.steal) is steals, decided.reason


def simulate_cpu(
    kbps: list[float],
    speed: dict[str, float],
    seed: int,
    rounds: int = 200,
    by_cpu: bool = True,
    every: int = 3,
    trust_stale: bool = False,
    swing: float = 0.0,
    log: list[tuple[int, str, str, str]] | None = None,
) -> tuple[list[int], dict[str, float]]:
    """A fleet whose CPU is not its bytes: worker w spends ``speed[w]`` points per unit of
    (0.5 per lease polled + 0.3 per KB/s), plus a 2-point base and +-1 point of noise. Figures
    lag, as published ones do: a new window ends every ``every`` rounds, each figure describes
    the owners as they were at its start, says when it began, and is unsettled when its worker's
    leases changed within it. A round is a second on both clocks; the scan dates each move
    (``trust_stale``: as if it did not, so only the settled flag guards). Every lease starts on the
    first worker. ``swing``: the traffic rises and falls by that fraction over 60 rounds (the
    fleet's average crossing the CPU floor, with ``kbps`` chosen around it). Returns the moves per
    round and the final CPU figures."""
    rng = random.Random(seed)
    names = sorted(speed)
    owner = {f"s{i:02d}": names[0] for i in range(len(kbps))}
    rate = {f"s{i:02d}": k for i, k in enumerate(kbps)}

    tide = [1.0]

    def cpu_of(w: str) -> float:
        work = sum(0.5 + 0.3 * rate[k] * tide[0] for k, o in owner.items() if o == w)
        return min(100.0, 2.0 + speed[w] * work)

    moves: list[int] = []
    start = {w: cpu_of(w) for w in names}  # the open window: CPU as of its start
    changed: set[str] = set()  # workers whose leases changed in the open window
    figures: dict[str, CpuFigure] = {}
    moved_at: dict[str, float] = {}
    began = 0.0
    for r in range(rounds):
        tide[0] = 1.0 + swing * math.sin(2 * math.pi * r / 60)
        if r % every == 0:
            figures = {
                w: CpuFigure(start[w] + rng.uniform(-1, 1), w not in changed, since=began)
                for w in names
            }
            start, changed, began = {w: cpu_of(w) for w in names}, set(), float(r)
        moved = 0
        for w in rng.sample(names, len(names)):
            leases = [
                Lease(k, TRIM_HORIZON, o, 1, throughput_kbps=rate[k]) for k, o in owner.items()
            ]
            observed = tuple(ObservedLease(x, 0.0, expired=False, very_old=False) for x in leases)
            counts = Counter(owner.values())
            dated = {} if trust_stale else dict(moved_at)
            seen = ObservedScan(float(r), observed, owner_counts=dict(counts), moved_at=dated)
            fleet = FleetCpu(figures, wall=float(r)) if by_cpu else None
            plan = plan_takes(seen, w, rng=rng, cpu=fleet)
            for lease in plan.steal:
                if log is not None:
                    log.append((r, lease.lease_key, owner[lease.lease_key], w))
                changed |= {owner[lease.lease_key], w}
                moved_at.update({owner[lease.lease_key]: float(r), w: float(r)})
                owner[lease.lease_key] = w
                moved += 1
        moves.append(moved)
    return moves, {w: cpu_of(w) for w in names}


def _slow_worker_fleet(seed: int) -> tuple[list[float], dict[str, float]]:
    rng = random.Random(seed)
    return [rng.uniform(5.0, 30.0) for _ in range(24)], {"w0": 1.0, "w1": 2.0, "w2": 1.0}


@pytest.mark.parametrize("seed", range(8))
def test_a_slower_worker_is_given_less_by_cpu_and_nothing_oscillates(seed: int) -> None:
    """Three workers, one twice as slow per record (a smaller machine, a busier JVM): balancing
    the bytes leaves it with nearly twice the CPU of the others; by CPU it gets less, the spread
    shrinks, and moves stop: noise of +-1 point may tip one borderline pair over once, never
    back and forth."""
    kbps, speed = _slow_worker_fleet(seed)
    moves, by_cpu = simulate_cpu(kbps, speed, seed, rounds=600)
    assert sum(moves[120:]) <= 1 and sum(moves[300:]) == 0, [i for i, n in enumerate(moves) if n]
    assert sum(moves) <= len(kbps)
    _, by_bytes = simulate_cpu(kbps, speed, seed, by_cpu=False)
    spread = max(by_cpu.values()) - min(by_cpu.values())
    assert spread < 0.5 * (max(by_bytes.values()) - min(by_bytes.values())), (by_cpu, by_bytes)


def test_without_dating_moves_balancing_by_cpu_oscillates() -> None:
    """Why the rule compares each figure's window with the worker's last lease move: figures
    from before a move (settled: the window closed before it) make the next thief steal again
    (and the victim steal back) on CPU that is no longer there."""
    kbps, speed = _slow_worker_fleet(0)
    moves, _ = simulate_cpu(kbps, speed, 0, rounds=300, trust_stale=True)
    assert sum(moves[120:]) > 20


def test_only_the_two_workers_a_move_changes_need_settled_figures() -> None:
    """A third worker in the middle of a change (a lease of its own just moved) holds back no
    move between two others whose figures are current: churn elsewhere never blocks balancing."""
    owned: dict[str, list[float | None]] = {"a": [5.0] * 4, "c": [5.0, 5.0], ME: []}
    figures = {"a": CpuFigure(90.0), "c": CpuFigure(50.0, settled=False), ME: CpuFigure(10.0)}
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=FleetCpu(figures))
    assert decided.by_cpu and decided.victim == "a" and len(decided.steal) == 1, decided.reason


def test_the_busiest_worker_with_a_current_figure_is_the_victim() -> None:
    """The busiest worker in the middle of a change (its figure is not current) does not stall
    balancing: the next busiest whose figure is current gives a lease."""
    owned: dict[str, list[float | None]] = {"a": [5.0] * 4, "b": [5.0] * 4, ME: []}
    figures = {"a": CpuFigure(95.0, settled=False), "b": CpuFigure(70.0), ME: CpuFigure(10.0)}
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=FleetCpu(figures))
    assert decided.victim == "b" and len(decided.steal) == 1, decided.reason


def test_a_steal_by_bytes_that_cpu_contradicts_is_refused() -> None:
    """Below the CPU floor the bytes decide, but from a quarter of it (5%), where both workers
    publish CPU, no lease moves that would leave the thief more than a point busier by CPU than
    its victim (that would undo what balancing by CPU did), none while the thief's figure is not
    current, and none from a victim whose figure is not; an idle fleet (under 5%) and a thief
    holding nothing are not held back."""
    owned: dict[str, list[float | None]] = {"a": [10.0, 10.0, 10.0], ME: [1.0]}
    busy = FleetCpu({"a": CpuFigure(4.0), ME: CpuFigure(12.0)})
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=busy).steal == ()
    slow = FleetCpu({"a": CpuFigure(12.0), ME: CpuFigure(10.0)})  # 5 per lease of ours, 4 of a's
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=slow)
    assert decided.steal == (), decided.reason  # 10 + 55 vs 12 - 4: far busier after
    even = FleetCpu({"a": CpuFigure(12.0), ME: CpuFigure(0.5)})
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=even).steal
    moving = FleetCpu({"a": CpuFigure(12.0), ME: CpuFigure(0.5, settled=False)})
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=moving).steal == ()
    their_move = FleetCpu({"a": CpuFigure(12.0, settled=False), ME: CpuFigure(0.5)})
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=their_move).steal == ()
    idle = FleetCpu({"a": CpuFigure(3.0), ME: CpuFigure(4.0, settled=False)})  # average 3.5%
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=idle).steal
    empty: dict[str, list[float | None]] = {"a": [10.0, 10.0, 10.0], ME: []}
    joiner = FleetCpu({"a": CpuFigure(4.0), ME: CpuFigure(8.0)})  # a smaller machine's idle CPU
    assert plan_load_steal(scan(empty), ME, rng=random.Random(1), cpu=joiner).steal
    # An idle fleet (the hot-shard benchmark's: polling, not records): a flip within a point is
    # noise, and the bytes decide: the hot shard's worker gives its cold lease away.
    hot: dict[str, list[float | None]] = {"a": [23.0, 2.3], ME: [2.3, 2.3]}
    idle = FleetCpu({"a": CpuFigure(1.6), ME: CpuFigure(1.3)})
    decided = plan_load_steal(scan(hot), ME, rng=random.Random(1), cpu=idle)
    assert [x.lease_key for x in decided.steal] == ["a-01"], decided.reason


def test_a_slower_thief_is_not_given_more_than_the_gap() -> None:
    """What a lease gives the thief is judged at the thief's own CPU per unit of weight: a thief
    twice as slow per byte as its victim takes a lease only if it lowers the sum of the squared
    loads as the thief would carry it."""
    owned: dict[str, list[float | None]] = {"a": [5.0] * 4, ME: [5.0, 5.0]}
    fast_victim = FleetCpu({"a": CpuFigure(40.0), ME: CpuFigure(20.0)})  # 10 vs 6.67 per lease
    slow_thief = FleetCpu({"a": CpuFigure(40.0), ME: CpuFigure(40.0 * 2 / 4 * 2)})  # even, 2x
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=fast_victim).steal
    assert plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=slow_thief).steal == ()
    thief_rate = FleetCpu({"a": CpuFigure(48.0), ME: CpuFigure(30.0)})  # 12 per lease, 15 here
    decided = plan_load_steal(scan(owned), ME, rng=random.Random(1), cpu=thief_rate)
    assert decided.steal == (), decided.reason  # 30 + 15 > 48 - 12: it would end up busier


@pytest.mark.parametrize("seed", range(4))
def test_a_fleet_whose_cpu_wanders_across_the_floor_does_not_move_leases_back_and_forth(
    seed: int,
) -> None:
    """Traffic rising and falling by half takes the fleet's average CPU above and below the 20%
    floor every minute: by CPU above it, by bytes below it. The two disagree (one worker is twice
    as slow per record), yet moves stop: a steal by bytes waits for current figures and is
    not made where it would leave the thief busier by CPU than its victim."""
    rng = random.Random(seed)
    kbps = [rng.uniform(2.0, 6.0) for _ in range(18)]
    log: list[tuple[int, str, str, str]] = []
    moves, _ = simulate_cpu(kbps, {"w0": 1.0, "w1": 2.0, "w2": 1.0}, seed, rounds=600,
                            swing=0.5, log=log)  # fmt: skip
    late = [(r, key) for r, key, _, _ in log if r >= 100]
    assert len(late) <= 3, late  # ten cycles of the traffic: a settled fleet stays settled
    assert len({key for _, key in late}) == len(late), late  # no lease moves twice
    assert sum(moves[500:]) == 0
