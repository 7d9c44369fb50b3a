"""A held lease whose item vanished from the table comes back from where its holder left it
(#49 item 3): before, the holder only reported it lost and shard sync re-created it a minute later
at the initial position, which at LATEST skipped what was written in between."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError
from checkpoint.lease import Lease
from checkpoint.leasing.held_lease import LeaseLoss
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.leasing.vanished import put_back, restore_if_vanished, resumed_from
from checkpoint.sequence import LATEST, SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from tests.unit.leasing.test_holder import DURATION, KEY, stored, take

AT_7 = ExtendedSequenceNumber("7")
AT_9 = ExtendedSequenceNumber("9")


def held_at(checkpoint: ExtendedSequenceNumber, **changes: object) -> Lease:
    lease = Lease(KEY, checkpoint, lease_owner="worker-a", lease_counter=4)
    return replace(lease, **changes)  # type: ignore[arg-type]


def test_put_back_is_the_last_write_unowned_with_its_counter_moved_on() -> None:
    last = held_at(AT_7, pending_checkpoint=AT_9, checkpoint_owner="worker-b",
                   parent_shard_ids=frozenset({"shardId-0"}))  # fmt: skip
    again = put_back(last)
    assert again == replace(last, lease_owner=None, checkpoint_owner=None, lease_counter=5)
    assert put_back(held_at(SHARD_END)) is None  # a finished lease's deletion is the cleanup's


@pytest.mark.parametrize(
    ("found", "last", "moved"),
    [
        # Re-created by shard sync at LATEST, unowned: moved to our position.
        (Lease(KEY, LATEST), held_at(AT_7), True),
        (Lease(KEY, TRIM_HORIZON), held_at(AT_7), True),
        # We had not read anything yet (TRIM_HORIZON) and sync chose LATEST: ours loses nothing.
        (Lease(KEY, LATEST), held_at(TRIM_HORIZON), True),
        # Already where we were: nothing to write.
        (Lease(KEY, AT_7), held_at(AT_7), False),
        (Lease(KEY, TRIM_HORIZON), held_at(TRIM_HORIZON), False),
        # Taken by someone, or already read past the start: theirs now.
        (Lease(KEY, LATEST, lease_owner="worker-b"), held_at(AT_7), False),
        (Lease(KEY, AT_9), held_at(AT_7), False),
        # We had finished it.
        (Lease(KEY, LATEST), held_at(SHARD_END), False),
    ],
)
def test_resumed_from(found: Lease, last: Lease, moved: bool) -> None:
    result = resumed_from(found, last)
    assert (result is not None) is moved
    if result is not None:
        assert (result.checkpoint, result.lease_owner) == (last.checkpoint, None)
        assert result.lease_counter == found.lease_counter  # update_lease's condition


def test_restore_if_vanished_only_when_the_item_is_gone() -> None:
    table = MemoryLeaseTable()
    last = held_at(AT_7)
    assert restore_if_vanished(table, last)  # gone: created again
    assert stored(table).checkpoint == AT_7 and stored(table).lease_owner is None
    assert not restore_if_vanished(table, last)  # there: a plain lost write, nothing to do


def test_restore_if_vanished_moves_a_lease_sync_re_created_at_the_initial_position() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(Lease(KEY, LATEST))

    class GoneOnce(MemoryLeaseTable):
        """Answers the first read as if the item were gone (sync re-creates it right after)."""

        reads = 0

        def get_lease(self, lease_key: str) -> Lease | None:
            self.reads += 1
            return None if self.reads == 1 else table.get_lease(lease_key)

        def create_lease_if_absent(self, lease: Lease) -> bool:
            return table.create_lease_if_absent(lease)

        def update_lease(self, lease: Lease) -> Lease | None:
            return table.update_lease(lease)

    assert restore_if_vanished(GoneOnce(), held_at(AT_7))
    assert stored(table).checkpoint == AT_7


def test_a_failing_table_is_logged_and_the_lease_stays_lost() -> None:
    class Down(MemoryLeaseTable):
        def get_lease(self, lease_key: str) -> Lease | None:
            raise DependencyError("down")

    assert not restore_if_vanished(Down(), held_at(AT_7))


def test_a_renewal_that_finds_the_item_deleted_puts_it_back_at_the_last_checkpoint() -> None:
    table = MemoryLeaseTable()
    told: list[str] = []
    holder = LeaseHolder(table, "worker-a", ManualClock(), DURATION, on_restored=told.append)
    held = holder.add_taken(take(table, "worker-a"))
    write = holder.update(KEY, held.token, lambda x: table.update_checkpoint(x, AT_7))
    assert write.lease is not None
    assert table.delete_lease(stored(table))  # an operator deletes the item
    report = holder.renew_all()
    assert [x.lease_key for x in report.lost] == [KEY] and told == [KEY]
    back = stored(table)
    assert (back.checkpoint, back.lease_owner) == (AT_7, None)
    assert back.lease_counter > write.lease.lease_counter


def test_a_checkpoint_that_finds_the_item_deleted_puts_it_back_as_last_written() -> None:
    table = MemoryLeaseTable()
    told: list[str] = []
    holder = LeaseHolder(table, "worker-a", ManualClock(), DURATION, on_restored=told.append)
    held = holder.add_taken(take(table, "worker-a"))
    assert holder.update(KEY, held.token, lambda x: table.update_checkpoint(x, AT_7)).lease
    assert table.delete_lease(stored(table))
    result = holder.update(KEY, held.token, lambda x: table.update_checkpoint(x, AT_9))
    assert result.loss is LeaseLoss.WRITE_LOST and told == [KEY]
    assert stored(table).checkpoint == AT_7  # the lost checkpoint write is not made up


def test_a_lost_write_to_a_lease_another_worker_took_restores_nothing() -> None:
    table = MemoryLeaseTable()
    told: list[str] = []
    holder = LeaseHolder(table, "worker-a", ManualClock(), DURATION, on_restored=told.append)
    holder.add_taken(take(table, "worker-a"))
    assert table.take_lease(stored(table), "worker-b") is not None
    holder.renew_all()
    assert told == [] and stored(table).lease_owner == "worker-b"


def test_a_lease_whose_shard_is_gone_is_not_put_back() -> None:
    """The leader's garbage cleanup deletes leases of shards gone from the stream, held or not:
    putting one back would only start the cleanup and the repair fighting."""
    table = MemoryLeaseTable()
    told: list[str] = []
    asked: list[str] = []

    def restorable(lease: Lease) -> bool:
        asked.append(lease.lease_key)
        return False

    holder = LeaseHolder(table, "worker-a", ManualClock(), DURATION, on_restored=told.append,
                         restorable=restorable)  # fmt: skip
    holder.add_taken(take(table, "worker-a"))
    assert table.delete_lease(stored(table))
    holder.renew_all()
    assert asked == [KEY] and told == [] and table.get_lease(KEY) is None


@pytest.mark.parametrize(
    ("child_checkpoint", "restored"),
    [
        (ExtendedSequenceNumber("300"), False),  # a child read on: another worker finished ours
        (LATEST, False),  # at LATEST the cleanup counts a child started (the KCL's rule)
        (TRIM_HORIZON, True),  # children made but not started: the cleanup does not delete then
    ],
)
def test_a_lease_another_worker_finished_and_the_cleanup_deleted_stays_gone(
    child_checkpoint: ExtendedSequenceNumber, restored: bool
) -> None:
    """A holder stalled past its lease's expiry: another worker took the lease, read the shard to
    its end, its children started and the leader's cleanup deleted it. The stalled holder's write
    then lost, found the item gone, and put it back at its own old checkpoint: the shard's records
    from there were read again, after its children's."""
    table = MemoryLeaseTable()
    child = Lease("shardId-000000000007", child_checkpoint, parent_shard_ids=frozenset({KEY}))
    table.create_lease_if_absent(child)
    assert restore_if_vanished(table, held_at(AT_7)) is restored
    assert (table.get_lease(KEY) is not None) is restored
