"""A lease just moved to another worker (handed off, assigned, taken) has two lease durations to
be renewed by it before it counts as expired (pure, a manual clock)."""

from __future__ import annotations

import random

from checkpoint.lease import Lease, WriteStamp
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.sequence import TRIM_HORIZON
from kclpy_spark.moves.rules.observer import LeaseObserver
from kclpy_spark.moves.rules.take_rule import plan_takes

WALL0 = 1_700_000_000.0
TIMING = LeaseTiming(failover=10.0, max_clock_skew=1.0)


def lease(owner: str, counter: int, stamped: float | None = None, key: str = "shardId-1") -> Lease:
    stamp = None if stamped is None else WriteStamp(counter, stamped)
    return Lease(key, TRIM_HORIZON, lease_owner=owner, lease_counter=counter, written=stamp)


def busy(counter: int) -> list[Lease]:
    return [lease("kcl-K", counter, key=f"shardId-{i}") for i in (2, 3)]


def taken_by_q(
    observer: LeaseObserver, leases: list[Lease], now: float, ours: frozenset[str] = frozenset()
) -> bool:
    scan = observer.observe(leases, now=now, wall=WALL0 + now, stamping={"Q", *ours})
    plan = plan_takes(scan, "Q", rng=random.Random(0), workers={"kcl-K"})
    return "shardId-1" in {x.lease_key for x in plan.take}


def test_a_lease_handed_to_a_kcl_worker_waits_for_its_discovery_and_first_renewal() -> None:
    """A KCL 3.x worker finds a lease handed to it through the owner index about a failover
    time later and renews it up to a third of one after: at 11 s another worker took it back,
    and the records K had processed meanwhile were delivered twice."""
    observer = LeaseObserver(TIMING)
    observer.observe([lease("A", 5, WALL0), *busy(1)], now=0.0, wall=WALL0)
    handed = [lease("kcl-K", 6, WALL0 + 0.5), *busy(5)]  # A completed the hand-off at 0.5 s
    assert not taken_by_q(observer, handed, 12.0)
    assert not taken_by_q(observer, handed, 20.0)
    assert taken_by_q(observer, [lease("kcl-K", 6, WALL0 + 0.5), *busy(9)], 22.0)  # never came


def test_after_its_first_renewal_a_moved_lease_expires_after_one_lease_duration() -> None:
    observer = LeaseObserver(TIMING)
    observer.observe([lease("A", 5, WALL0), *busy(1)], now=0.0, wall=WALL0)
    assert not taken_by_q(observer, [lease("kcl-K", 6, WALL0 + 0.5), *busy(5)], 12.0)
    renewed = [lease("kcl-K", 7, WALL0 + 13.0), *busy(9)]  # K's first renewal at 13 s
    assert not taken_by_q(observer, renewed, 14.0)
    assert taken_by_q(observer, [lease("kcl-K", 7, WALL0 + 13.0), *busy(20)], 25.5)


def test_a_lease_assigned_from_unowned_to_a_kcl_worker_waits_for_its_first_renewal() -> None:
    """A KCL 3.x leader assigns the children of a reshard (created unowned) to its workers:
    seen going from no owner to K, the lease got one lease duration and was taken at 11 s."""
    observer = LeaseObserver(TIMING)
    observer.observe([Lease("shardId-1", TRIM_HORIZON), *busy(1)], now=0.0, wall=WALL0)
    assigned = [lease("kcl-K", 1, WALL0 + 0.5), *busy(5)]
    assert not taken_by_q(observer, assigned, 12.0)
    assert taken_by_q(observer, [lease("kcl-K", 1, WALL0 + 0.5), *busy(9)], 22.0)


def test_a_worker_that_first_sees_a_lease_just_handed_to_a_kcl_worker_waits_for_it_too() -> None:
    """A worker started (or a leader newly leading) after A handed the lease to K: the lease
    carried A's stamp of the hand-off's counter, dated as K's own renewal, and was taken at 11 s,
    as K began to process it (a review's finding). K stamps nothing of its own, so a stamp on
    its lease's counter was written by a move."""
    observer = LeaseObserver(TIMING)
    handed = [lease("kcl-K", 6, WALL0 + 0.5), *busy(5)]  # A completed the hand-off at 0.5 s
    assert not taken_by_q(observer, handed, 5.0)
    assert not taken_by_q(observer, [lease("kcl-K", 6, WALL0 + 0.5), *busy(9)], 12.0)
    assert taken_by_q(observer, [lease("kcl-K", 6, WALL0 + 0.5), *busy(13)], 22.0)  # never came


def test_a_lease_of_ours_first_seen_expires_one_lease_duration_after_its_stamp() -> None:
    """Our workers stamp their own renewals: a stamped lease of one first seen is judged from
    its stamp by one lease duration, so a killed worker's leases fail over as before."""
    observer = LeaseObserver(TIMING)
    ours = frozenset({"B"})
    assert not taken_by_q(observer, [lease("B", 6, WALL0 + 0.5), *busy(5)], 5.0, ours)
    assert taken_by_q(observer, [lease("B", 6, WALL0 + 0.5), *busy(9)], 12.0, ours)
