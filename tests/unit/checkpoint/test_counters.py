"""Lease states and parking (Lease.state, Lease.parked), and Data Prepper's counters."""

from __future__ import annotations

import threading

import pytest

from checkpoint.counters import CoordinationCounters, Counter
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
    ("value", "state"),
    [
        (lease("s"), LeaseState.UNASSIGNED),
        (lease("s", "w1"), LeaseState.ASSIGNED),
        (lease("s", "w1", done=True), LeaseState.COMPLETED),
        (lease("s", done=True, closed_until=NOW + 60), LeaseState.COMPLETED),
        (lease("s", closed_until=NOW + 60), LeaseState.CLOSED),
        (lease("s", "w1", closed_until=NOW + 60), LeaseState.CLOSED),
        (lease("s", closed_until=NOW), LeaseState.UNASSIGNED),  # reopen time has come
        (lease("s", "w1", closed_until=NOW - 1), LeaseState.ASSIGNED),
    ],
)
def test_lease_state(value: Lease, state: LeaseState) -> None:
    assert value.state(NOW) is state


def test_parking() -> None:
    original = lease("s", "w1")
    parked = original.parked(NOW + 60)
    assert (parked.closed_until, parked.closed_count) == (NOW + 60, 1)
    assert parked.lease_counter == original.lease_counter  # the store bumps it on write
    assert parked.state(NOW) is LeaseState.CLOSED
    again = parked.parked(NOW + 120)
    assert again.closed_count == 2
    assert again.state(NOW + 121) is LeaseState.ASSIGNED


def test_a_completed_lease_cannot_be_parked() -> None:
    with pytest.raises(ValueError, match="completed"):
        lease("s", done=True).parked(NOW + 60)


def test_parking_is_written_with_update_lease() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(Lease("s", ExtendedSequenceNumber("5")))
    current = table.get_lease("s")
    assert current is not None
    mine = table.take_lease(current, "w1")
    assert mine is not None
    written = table.update_lease(mine.parked(NOW + 60))
    assert written is not None and table.get_lease("s") == written
    assert written.state(NOW) is LeaseState.CLOSED and written.closed_count == 1
    assert table.update_lease(mine.parked(NOW + 60)) is None  # stale counter: lost, not raised


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
