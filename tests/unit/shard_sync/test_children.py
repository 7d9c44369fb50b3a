"""create_child_leases at a shard end: what it creates, when a merge child waits for its other
parent's lease, and what it reads of the table (the leases it names, not a scan)."""

from __future__ import annotations

from typing import Any

from checkpoint.lease import MAX_HASH_KEY, Lease
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from shard_sync.children import create_child_leases

MID = ExtendedSequenceNumber("5")


class CountingTable(MemoryLeaseTable):
    """Counts the items its scans return and its reads by key."""

    def __init__(self) -> None:
        super().__init__()
        self.scanned = 0
        self.gets = 0

    def list_leases(self) -> list[Lease]:
        found = super().list_leases()
        self.scanned += len(found)
        return found

    def get_lease(self, lease_key: str) -> Lease | None:
        self.gets += 1
        return super().get_lease(lease_key)


def child(shard_id: str, *parents: str) -> dict[str, Any]:
    every_key = {"StartingHashKey": "0", "EndingHashKey": str(MAX_HASH_KEY)}
    return {"ShardId": shard_id, "ParentShards": list(parents), "HashKeyRange": every_key}


def test_a_reshard_reads_the_leases_each_shard_end_names_not_the_table() -> None:
    """Each shard end scanned the whole table to look up at most four keys: doubling a stream
    of N shards cost N scans of ~2N items."""
    table, n = CountingTable(), 200
    parents = [Lease(f"p{i}", MID) for i in range(n)]
    for lease in parents:
        table.create_lease_if_absent(lease)
    for i, lease in enumerate(parents):
        made = create_child_leases(table, lease, [child(f"c{i}a", lease.lease_key),
                                                  child(f"c{i}b", lease.lease_key)])  # fmt: skip
        assert made.created == (f"c{i}a", f"c{i}b")
    assert table.scanned == 0 and table.gets == 3 * n
    assert table.get_lease("c7b") is not None
    assert table.get_lease("c7b").checkpoint == TRIM_HORIZON  # type: ignore[union-attr]


def test_a_merge_child_waits_for_its_other_parents_lease_unless_that_shard_is_gone() -> None:
    table = CountingTable()
    left = Lease("left", SHARD_END)
    table.create_lease_if_absent(left)
    merged = [child("m", "left", "right")]
    blocked = create_child_leases(table, left, merged)
    assert blocked.blocked_on == ("right",) and table.get_lease("m") is None
    table.create_lease_if_absent(Lease("right", MID))
    assert create_child_leases(table, left, merged).created == ("m",)
    again = create_child_leases(table, left, merged)  # a retry: already there
    assert again.created == () and not again.blocked
    alone = CountingTable()
    alone.create_lease_if_absent(left)
    gone = create_child_leases(alone, left, merged, gone_parents={"right"})
    assert gone.created == ("m",) and alone.scanned == 0
