"""Coordination view: lease states, parking, acquisition order, Data Prepper's counters."""

from __future__ import annotations

import threading

import pytest

from checkpoint.counters import (
    CoordinationCounters,
    Counter,
    choose_leases_to_acquire,
    lease_state,
    park,
    reopen,
)
from checkpoint.lease import Lease, LeaseState
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable

NOW = 1_700_000_000.0


def lease(
    key: str,
    owner: str | None = None,
    *,
    closed_until: float | None = None,
    done: bool = False,
) -> Lease:
    return Lease(
        key,
        SHARD_END if done else TRIM_HORIZON,
        lease_owner=owner,
        closed_until=closed_until,
        closed_count=0 if closed_until is None else 1,
    )


@pytest.mark.parametrize(
    ("value", "owner_expired", "state"),
    [
        (lease("s"), False, LeaseState.UNASSIGNED),
        (lease("s", "w1"), False, LeaseState.ASSIGNED),
        (lease("s", "w1"), True, LeaseState.UNASSIGNED),  # its owner stopped renewing
        (lease("s", "w1", done=True), True, LeaseState.COMPLETED),
        (lease("s", done=True, closed_until=NOW + 60), False, LeaseState.COMPLETED),
        (lease("s", closed_until=NOW + 60), False, LeaseState.CLOSED),
        (lease("s", "w1", closed_until=NOW + 60), True, LeaseState.CLOSED),
        (lease("s", closed_until=NOW), False, LeaseState.UNASSIGNED),  # reopen time has come
        (lease("s", "w1", closed_until=NOW - 1), False, LeaseState.ASSIGNED),
    ],
)
def test_lease_state(value: Lease, owner_expired: bool, state: LeaseState) -> None:
    assert lease_state(value, NOW, owner_expired=owner_expired) is state


def test_park_and_reopen() -> None:
    original = lease("s", "w1")
    parked = park(original, NOW + 60)
    assert (parked.closed_until, parked.closed_count) == (NOW + 60, 1)
    assert parked.lease_counter == original.lease_counter  # the store bumps it on write
    assert lease_state(parked, NOW) is LeaseState.CLOSED
    again = park(reopen(parked), NOW + 120)
    assert again.closed_count == 2
    reopened = reopen(again)
    assert reopened.closed_until is None and reopened.closed_count == 2
    assert lease_state(reopened, NOW) is LeaseState.ASSIGNED


def test_a_completed_lease_cannot_be_parked() -> None:
    with pytest.raises(ValueError, match="completed"):
        park(lease("s", done=True), NOW + 60)


def test_parking_is_written_with_update_lease() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(Lease("s", ExtendedSequenceNumber("5")))
    current = table.get_lease("s")
    assert current is not None
    mine = table.take_lease(current, "w1")
    assert mine is not None
    written = table.update_lease(park(mine, NOW + 60))
    assert written is not None and table.get_lease("s") == written
    assert written.state(NOW) is LeaseState.CLOSED and written.closed_count == 1
    assert table.update_lease(park(mine, NOW + 60)) is None  # stale counter: lost, not raised
    reopened = table.update_lease(reopen(written))
    assert reopened is not None and reopened.state(NOW) is LeaseState.ASSIGNED


def test_acquisition_order() -> None:
    leases = [
        lease("unowned-1"),
        lease("done", done=True),
        lease("parked-later", closed_until=NOW - 1),
        lease("alive", "w2"),
        lease("orphan-1", "w3"),
        lease("still-closed", closed_until=NOW + 1),
        lease("parked-earlier", closed_until=NOW - 100),
        lease("unowned-2"),
        lease("orphan-2", "w4"),
        lease("orphan-done", "w4", done=True),
        lease("orphan-closed", "w4", closed_until=NOW + 5),
    ]
    expired = {"orphan-1", "orphan-2", "orphan-done", "orphan-closed"}
    chosen = choose_leases_to_acquire(leases, expired, NOW, limit=100)
    assert [c.lease_key for c in chosen] == [
        "orphan-1",
        "orphan-2",
        "parked-earlier",
        "parked-later",
        "unowned-1",
        "unowned-2",
    ]


@pytest.mark.parametrize(("limit", "count"), [(-1, 0), (0, 0), (1, 1), (2, 2), (5, 3)])
def test_acquisition_limit(limit: int, count: int) -> None:
    leases = [lease("a"), lease("b", "w9"), lease("c", closed_until=NOW - 1)]
    chosen = choose_leases_to_acquire(leases, {"b"}, NOW, limit)
    assert [c.lease_key for c in chosen] == ["b", "c", "a"][:count]


def test_counters_have_data_preppers_names() -> None:
    counters = CoordinationCounters()
    assert counters.snapshot() == {
        "partitionsCreated": 0,
        "partitionsAcquired": 0,
        "partitionsCompleted": 0,
        "noPartitionsAcquired": 0,
        "partitionNotOwnedErrors": 0,
        "partitionUpdateErrors": 0,
    }
    counters.increment(Counter.PARTITIONS_CREATED, 3)
    counters.increment(Counter.PARTITION_NOT_OWNED_ERRORS)
    snap = counters.snapshot()
    assert snap["partitionsCreated"] == 3 and snap["partitionNotOwnedErrors"] == 1
    assert counters.get(Counter.PARTITIONS_CREATED) == 3
    with pytest.raises(ValueError, match="only go up"):
        counters.increment(Counter.PARTITIONS_CREATED, -1)


def test_counters_are_thread_safe() -> None:
    counters = CoordinationCounters()

    def bump() -> None:
        for _ in range(10_000):
            counters.increment(Counter.PARTITIONS_ACQUIRED)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counters.snapshot()["partitionsAcquired"] == 40_000
