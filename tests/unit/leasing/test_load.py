"""Load-aware balancing (checkpoint/leasing/load.py): weights, the steal rule table-driven, and
fleets of simulated workers that must converge without moving a lease back and forth."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from checkpoint.lease import Lease
from checkpoint.leasing import ObservedLease, ObservedScan, plan_takes
from checkpoint.leasing.load import FLOOR_KBPS, ema, has_load, plan_load_steal, weights
from checkpoint.sequence import TRIM_HORIZON

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
