"""Cleanup rules, the auditor, and the sync glue over a memory table (no mocks, no sleeps)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from checkpoint.base.errors import DependencyError, MalformedAnswerError
from checkpoint.lease import MAX_HASH_KEY, HashKeyRange, Lease
from checkpoint.sequence import (
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
)
from checkpoint.stores.memory import MemoryLeaseTable
from shard_sync.children import children_of_finished_parents
from shard_sync.cleanup import (
    LeaderMaintenance,
    completed_leases_to_delete,
    garbage_leases,
    oldest_descendants,
)
from shard_sync.false_ends import false_shard_ends
from shard_sync.shards import Shard
from shard_sync.syncer import ShardSyncer

HALF = MAX_HASH_KEY // 2


def shard(
    sid: str,
    start: int,
    end: int | None,
    lo: int = 0,
    hi: int = MAX_HASH_KEY,
    parent: str | None = None,
    adjacent: str | None = None,
) -> Shard:
    entry: dict[str, Any] = {
        "ShardId": sid,
        "HashKeyRange": {"StartingHashKey": str(lo), "EndingHashKey": str(hi)},
        "SequenceNumberRange": {"StartingSequenceNumber": str(start)},
    }
    if end is not None:
        entry["SequenceNumberRange"]["EndingSequenceNumber"] = str(end)
    if parent:
        entry["ParentShardId"] = parent
    if adjacent:
        entry["AdjacentParentShardId"] = adjacent
    return Shard.from_api(entry)


def lease(
    key: str,
    checkpoint: ExtendedSequenceNumber = TRIM_HORIZON,
    parents: tuple[str, ...] = (),
    children: tuple[str, ...] = (),
    lo: int = 0,
    hi: int = MAX_HASH_KEY,
) -> Lease:
    return Lease(
        key,
        checkpoint,
        parent_shard_ids=frozenset(parents),
        child_shard_ids=frozenset(children),
        hash_key_range=HashKeyRange(lo, hi),
    )


STARTED = ExtendedSequenceNumber("100")


@pytest.mark.parametrize(
    ("leases", "deletable"),
    [
        # A finished parent whose two children have started goes.
        (
            [lease("p", SHARD_END, children=("a", "b")), lease("a", STARTED), lease("b", STARTED)],
            ["p"],
        ),
        # One child not started yet: keep the parent (its child may still need its checkpoint).
        ([lease("p", SHARD_END, children=("a", "b")), lease("a", STARTED), lease("b")], []),
        # A child lease not created yet: keep.
        ([lease("p", SHARD_END, children=("a", "b")), lease("a", STARTED)], []),
        # No recorded children: keep.
        ([lease("p", SHARD_END)], []),
        # Not finished: keep.
        ([lease("p", STARTED, children=("a",)), lease("a", STARTED)], []),
        # The grandparent is still there: the parent waits for it to go first.
        (
            [
                lease("g", SHARD_END, children=("p",)),
                lease("p", SHARD_END, parents=("g",), children=("c",)),
                lease("c", STARTED, parents=("p",)),
            ],
            ["g"],
        ),
        # Multi-stream keys: children and parents are looked up with the same stream prefix.
        (
            [lease("acct:s:1:p", SHARD_END, children=("a",)), lease("acct:s:1:a", STARTED)],
            ["acct:s:1:p"],
        ),
    ],
)
def test_completed_leases_to_delete(leases: list[Lease], deletable: list[str]) -> None:
    assert [lease.lease_key for lease in completed_leases_to_delete(leases)] == deletable


def test_garbage_leases_are_those_of_unlisted_shards() -> None:
    leases = [lease("a"), lease("b"), lease("acct:s:1:c")]
    assert [x.lease_key for x in garbage_leases(leases, {"a", "c"})] == ["b"]


class ListedShards:
    """A ShardLister over a fixed listing, recording the filters it was asked for."""

    def __init__(self, shards: list[Shard]) -> None:
        self.shards = shards
        self.filters: list[Any] = []

    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        self.filters.append(shard_filter)
        return list(self.shards)


def split_listing() -> list[Shard]:
    return [
        shard("shardId-0", 1, 50),
        shard("shardId-1", 51, None, 0, HALF, parent="shardId-0"),
        shard("shardId-2", 52, None, HALF + 1, MAX_HASH_KEY, parent="shardId-0"),
    ]


def test_sync_on_empty_table_uses_the_filter_and_leases_every_listed_shard() -> None:
    table = MemoryLeaseTable()
    lister = ListedShards(split_listing())
    result = ShardSyncer(lister, table, InitialPosition.trim_horizon(), sleep=lambda _: None).sync()
    assert result.table_was_empty
    assert lister.filters == [{"Type": "AT_TRIM_HORIZON"}]
    assert result.created == ("shardId-0", "shardId-1", "shardId-2")
    assert all(x.checkpoint == TRIM_HORIZON for x in table.list_leases())
    again = ShardSyncer(lister, table, InitialPosition.trim_horizon()).sync()
    assert again.created == ()
    assert lister.filters[-1] is None  # a non-empty table lists everything


def test_an_empty_table_listing_with_holes_is_listed_again_and_then_creates_nothing() -> None:
    """The third listing with a hole was used: only the listed half was leased, the other left
    to the hole audit rounds later, at LATEST (its records in between never read)."""
    table = MemoryLeaseTable()
    lister = ListedShards([shard("shardId-1", 51, None, 0, HALF)])
    slept: list[float] = []
    syncer = ShardSyncer(lister, table, InitialPosition.latest(), sleep=slept.append)
    with pytest.raises(DependencyError, match=r"1 hash-range hole.*no lease created") as raised:
        syncer.sync()
    assert raised.value.retriable
    assert len(lister.filters) == 3 and len(slept) == 2  # no sleep after the last listing
    assert table.list_leases() == []
    lister.shards.append(shard("shardId-2", 52, None, HALF + 1, MAX_HASH_KEY))
    assert syncer.sync().created == ("shardId-1", "shardId-2")


class SplitWhileListed(ListedShards):
    """The first listing's pages straddle a split: the parent still open on one page, its
    children on the next; later listings see the split done."""

    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        self.filters.append(shard_filter)
        opened, *children = split_listing()
        if len(self.filters) == 1:
            return [shard(opened.shard_id, 1, None), *children]
        return children


def test_an_empty_table_listing_at_latest_that_overlaps_is_listed_again() -> None:
    """With ignore_unexpected_child_shards, a parent and its children listed open together
    were all leased at LATEST: the children waited for the parent's end, and what came to them
    before their first read was skipped. As the KCL, an overlap at LATEST is listed again."""
    table = MemoryLeaseTable()
    lister = SplitWhileListed([])
    syncer = ShardSyncer(lister, table, InitialPosition.latest(), sleep=lambda _: None,
                         ignore_unexpected_child_shards=True)  # fmt: skip
    assert syncer.sync().created == ("shardId-1", "shardId-2")
    assert len(lister.filters) == 2 and lister.filters[0] == {"Type": "AT_LATEST"}


def test_auditor_syncs_only_after_threshold_rounds_of_holes() -> None:
    table = MemoryLeaseTable()
    lister = ListedShards(
        [shard("shardId-1", 51, None, 0, HALF), shard("shardId-2", 52, None, HALF + 1)]
    )
    syncer = ShardSyncer(lister, table, InitialPosition.latest())
    # Someone deleted shardId-2's lease: half the hash range has no lease.
    table.create_lease_if_absent(lease("shardId-1", STARTED, lo=0, hi=HALF))
    maintenance = LeaderMaintenance(syncer, table, hole_threshold=3)
    first = maintenance.run_once()
    second = maintenance.run_once()
    assert (first.synced, second.synced) == (None, None)
    assert (first.holes, first.consecutive, second.consecutive) == (1, 1, 2)
    assert lister.filters == []  # no ListShards call while below the threshold
    third = maintenance.run_once()
    assert third.synced is not None
    assert third.synced.created == ("shardId-2",)
    # Covered now: the next rounds neither count nor sync.
    fourth = maintenance.run_once()
    assert (fourth.holes, fourth.consecutive, fourth.synced) == (0, 0, None)
    assert len(lister.filters) == 1


def test_finished_parent_without_child_leases_leaves_children_to_shard_end() -> None:
    # The KCL's non-empty rule gives open descendants of a leased shard no lease: the parent's
    # consumer creates them at SHARD_END (before it may checkpoint SHARD_END).
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("shardId-0", STARTED))
    result = ShardSyncer(ListedShards(split_listing()), table, InitialPosition.latest()).sync()
    assert result.created == ()


def test_auditor_deletes_finished_leases_with_conditional_deletes() -> None:
    table = MemoryLeaseTable()
    for x in (lease("p", SHARD_END, children=("a",)), lease("a", STARTED, parents=("p",))):
        table.create_lease_if_absent(x)
    maintenance = LeaderMaintenance(
        ShardSyncer(ListedShards([]), table, InitialPosition.latest()), table
    )
    assert maintenance.run_once().deleted == ("p",)
    assert [x.lease_key for x in table.list_leases()] == ["a"]


def test_garbage_leases_are_deleted_every_nth_round_from_a_full_listing() -> None:
    table = MemoryLeaseTable()
    lister = ListedShards([shard("shardId-1", 51, None)])
    for x in (lease("shardId-1", STARTED), lease("shardId-gone", STARTED, lo=0, hi=0)):
        table.create_lease_if_absent(x)
    syncer = ShardSyncer(lister, table, InitialPosition.latest())
    asked: list[str] = []
    maintenance = LeaderMaintenance(
        syncer, table, lister=lister, garbage_every=3,
        shard_gone=lambda x: not asked.append(x.lease_key),
    )  # fmt: skip
    assert [maintenance.run_once().deleted for _ in range(2)] == [(), ()]
    assert lister.filters == []  # no listing before the third round
    assert maintenance.run_once().deleted == ("shardId-gone",)
    assert asked == ["shardId-gone"]  # only the unlisted one is asked of Kinesis
    assert [x.lease_key for x in table.list_leases()] == ["shardId-1"]


GOOD = [lease("shardId-1", ExtendedSequenceNumber("4242"), lo=0, hi=HALF),
        lease("shardId-2", ExtendedSequenceNumber("4343"), lo=HALF + 1)]  # fmt: skip


@pytest.mark.parametrize(
    ("listing", "probed"),
    [
        ([], []),  # {"Shards": []}: a wrong answer, nothing even asked
        ([shard("shardId-9", 900, None)], ["shardId-1", "shardId-2"]),  # pages left out
    ],
)
def test_a_listing_that_leaves_live_shards_out_deletes_none_of_their_leases(
    listing: list[Shard], probed: list[str]
) -> None:
    """One listing was trusted: an empty or short answer deleted the leases (and checkpoints)
    of live shards, which the next sync re-created at the initial position."""
    table = MemoryLeaseTable()
    for x in GOOD:
        table.create_lease_if_absent(x)
    lister = ListedShards(listing)
    asked: list[str] = []
    maintenance = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, lister=lister,
        garbage_every=1, shard_gone=lambda x: bool(asked.append(x.lease_key)),
    )  # fmt: skip
    assert maintenance.run_once().deleted == ()
    assert asked == probed
    assert [(x.lease_key, x.checkpoint) for x in table.list_leases()] == [
        ("shardId-1", ExtendedSequenceNumber("4242")), ("shardId-2", ExtendedSequenceNumber("4343"))
    ]  # fmt: skip


def test_a_garbage_lease_whose_probe_fails_stays_and_probes_take_turns() -> None:
    table = MemoryLeaseTable()
    keys = [f"shardId-gone-{i}" for i in range(5)]
    for key in keys:
        table.create_lease_if_absent(lease(key, STARTED, lo=0, hi=0))
    table.create_lease_if_absent(lease("shardId-1", STARTED))
    lister = ListedShards([shard("shardId-1", 51, None)])
    asked: list[str] = []

    def gone(x: Lease) -> bool:
        asked.append(x.lease_key)
        if x.lease_key == keys[0]:
            raise DependencyError("throttled")
        return x.lease_key != keys[1]  # keys[1]'s shard exists after all

    maintenance = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, lister=lister,
        garbage_every=1, shard_gone=gone, max_garbage_probes=2,
    )  # fmt: skip
    assert maintenance.run_once().deleted == ()  # keys 0 and 1: unknown, and exists
    assert asked == keys[:2]
    assert maintenance.run_once().deleted == (keys[2], keys[3])  # the next two take their turn
    assert maintenance.run_once().deleted == (keys[4],)  # the last one's turn comes too
    assert len(asked) == 6
    assert sorted(x.lease_key for x in table.list_leases()) == ["shardId-1", keys[0], keys[1]]


@pytest.mark.parametrize(
    ("key", "stream", "sibling"),
    [
        ("shardId-1", None, "shardId-2"),
        ("123456789012:orders:1700000000:shardId-1", "123456789012:orders:1700000000",
         "123456789012:orders:1700000000:shardId-2"),
    ],
)  # fmt: skip
def test_lease_keys_name_their_stream_and_siblings(
    key: str, stream: str | None, sibling: str
) -> None:
    x = lease(key)
    assert (x.stream_key, x.sibling_key("shardId-2"), x.shard_id) == (stream, sibling, "shardId-1")


# --- false shard ends (#49 item 2) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("leases", "listing", "false"),
    [
        # An open shard at SHARD_END: false.
        ([lease("shardId-1", SHARD_END)], [shard("shardId-1", 51, None)], ["shardId-1"]),
        # A closed shard at SHARD_END: a true end.
        ([lease("shardId-1", SHARD_END)], [shard("shardId-1", 51, 90)], []),
        # An open shard still being read: nothing to say.
        ([lease("shardId-1", STARTED)], [shard("shardId-1", 51, None)], []),
        # Listed open but a listed child names it as a parent: the listing is doubtful (a
        # reshard under way); leave the end alone.
        (
            [lease("shardId-0", SHARD_END)],
            [shard("shardId-0", 1, None), shard("shardId-1", 51, None, parent="shardId-0")],
            [],
        ),
        (
            [lease("shardId-0", SHARD_END)],
            [shard("shardId-0", 1, None), shard("shardId-1", 51, None, adjacent="shardId-0")],
            [],
        ),
        # Not listed at all (aged out): garbage, not a false end.
        ([lease("shardId-7", SHARD_END)], [shard("shardId-1", 51, None)], []),
        # It recorded children (from the service's ChildShards), or a lease names it as a
        # parent: it did end, and the listing is the doubtful one.
        (
            [lease("shardId-1", SHARD_END, children=("shardId-5",))],
            [shard("shardId-1", 51, None)],
            [],
        ),
        (
            [lease("shardId-1", SHARD_END), lease("shardId-5", parents=("shardId-1",))],
            [shard("shardId-1", 51, None)],
            [],
        ),
        # Multi-stream keys: matched by shard id within the syncer's stream.
        (
            [lease("1:s:9:shardId-1", SHARD_END)],
            [shard("shardId-1", 51, None)],
            ["1:s:9:shardId-1"],
        ),
    ],
)
def test_false_shard_ends(leases: list[Lease], listing: list[Shard], false: list[str]) -> None:
    assert [x.lease_key for x in false_shard_ends(leases, listing)] == false


def test_a_false_shard_end_is_reopened_at_trim_horizon_once_the_audit_syncs() -> None:
    """The lease's hole makes the auditor sync after its threshold; the sync sees the shard
    open and reopens the lease (conditional on its counter), which closes the hole."""
    table = MemoryLeaseTable()
    lister = ListedShards(
        [shard("shardId-1", 51, None, 0, HALF), shard("shardId-2", 52, None, HALF + 1)]
    )
    table.create_lease_if_absent(lease("shardId-1", STARTED, lo=0, hi=HALF))
    table.create_lease_if_absent(lease("shardId-2", SHARD_END, lo=HALF + 1))
    maintenance = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, hole_threshold=2
    )
    assert maintenance.run_once().synced is None
    synced = maintenance.run_once().synced
    assert synced is not None and synced.reopened == ("shardId-2",) and synced.created == ()
    after = table.get_lease("shardId-2")
    assert after is not None and after.checkpoint == TRIM_HORIZON and after.lease_owner is None
    assert after.lease_counter == 1  # one conditional write
    assert maintenance.run_once().holes == 0


def test_a_false_end_that_changed_since_the_scan_is_left_to_the_next_sync() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("shardId-1", SHARD_END))
    scanned = table.list_leases()
    stored = table.get_lease("shardId-1")
    assert stored is not None
    assert table.update_lease(stored) is not None  # someone wrote it after our scan
    syncer = ShardSyncer(ListedShards([shard("shardId-1", 51, None)]), table,
                         InitialPosition.latest())  # fmt: skip
    assert syncer.sync(scanned).reopened == ()
    assert syncer.sync().reopened == ("shardId-1",)


class FailingLister(ListedShards):
    """ListShards fails while ``failing``."""

    failing = True

    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        if self.failing:
            raise DependencyError("ListShards throttled for a minute")
        return super().list_shards(shard_filter)


class DeletesRefused(MemoryLeaseTable):
    def delete_lease(self, lease: Lease) -> bool:
        raise DependencyError("DeleteItem refused")


def test_only_a_failed_sync_is_a_sync_failure() -> None:
    """The leader is not ready while its sync fails (#49 item 10); a round's other steps (a
    refused delete of a finished lease) are not a sync failure."""
    table = DeletesRefused()
    lister = FailingLister(split_listing())
    maintenance = LeaderMaintenance(ShardSyncer(lister, table, InitialPosition.latest()), table)
    with pytest.raises(DependencyError):
        maintenance.run_once()  # an empty table: a sync, which fails
    assert maintenance.sync_failure == "ListShards throttled for a minute"
    lister.failing = False
    maintenance.run_once()
    assert maintenance.sync_failure is None
    table.create_lease_if_absent(lease("p", SHARD_END, children=("a",)))
    table.create_lease_if_absent(lease("a", STARTED, parents=("p",)))
    with pytest.raises(DependencyError, match="DeleteItem"):
        maintenance.run_once()
    assert maintenance.sync_failure is None


def test_a_shard_graph_no_stream_can_have_fails_the_sync_as_a_malformed_answer() -> None:
    """The rule's ValueError escaped the worker's round (which handles the error root only),
    skipping the other streams' sync and never shown as the sync's failure."""
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("shardId-9", STARTED, lo=0, hi=0))  # a hole: sync
    cycle = [shard("shardId-1", 1, 5, parent="shardId-2"),
             shard("shardId-2", 2, 6, parent="shardId-1"),
             shard("shardId-3", 3, None, parent="shardId-1")]  # fmt: skip
    maintenance = LeaderMaintenance(
        ShardSyncer(ListedShards(cycle), table, InitialPosition.latest()), table, hole_threshold=1
    )
    with pytest.raises(MalformedAnswerError, match=r"the shard listing: .*descendant"):
        maintenance.run_once()
    assert maintenance.sync_failure is not None and "descendant" in maintenance.sync_failure


def test_leases_without_a_hash_range_cost_one_listing_not_one_every_third_round() -> None:
    """KCL 1.x leases carry no hash range: every audit saw a hole and listed the whole stream
    again every third round, for ever. The KCL writes the ranges in once; here the last
    listing's ranges serve the audit."""
    table = MemoryLeaseTable()
    old = Lease("shardId-1", STARTED)  # no hash range
    table.create_lease_if_absent(old)
    lister = ListedShards([shard("shardId-1", 1, None)])
    maintenance = LeaderMaintenance(ShardSyncer(lister, table, InitialPosition.latest()), table)
    results = [maintenance.run_once() for _ in range(9)]
    assert len(lister.filters) == 1
    assert [r.synced is not None for r in results].count(True) == 1
    assert results[-1].holes == 0 and results[-1].consecutive == 0
    assert table.get_lease("shardId-1") == old  # the lease itself is not written


def test_a_child_whose_lease_went_missing_after_its_parent_finished_is_leased_again() -> None:
    """Its leased parent counted as covering it and the parent's shard end had passed: the
    audit synced every third round for ever, creating nothing, and the child was never read."""
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("shardId-0", SHARD_END, children=("shardId-1", "shardId-2")))
    table.create_lease_if_absent(lease("shardId-1", STARTED, parents=("shardId-0",), lo=0, hi=HALF))
    listing = [
        shard("shardId-0", 1, 50),
        shard("shardId-1", 51, None, 0, HALF, parent="shardId-0"),
        shard("shardId-2", 52, None, HALF + 1, MAX_HASH_KEY, parent="shardId-0"),
    ]
    lister = ListedShards(listing)
    maintenance = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, hole_threshold=3
    )
    results = [maintenance.run_once() for _ in range(4)]
    created = table.get_lease("shardId-2")
    assert created is not None and created.checkpoint == TRIM_HORIZON
    assert created.parent_shard_ids == {"shardId-0"}
    assert [r.synced.created for r in results if r.synced] == [("shardId-2",)]
    assert results[-1].holes == 0


@pytest.mark.parametrize(
    ("leases", "expected"),
    [
        # The parent is still being read: its shard end leases the child.
        ([lease("p", STARTED)], []),
        # A merge: one parent finished, the other still read.
        ([lease("p", SHARD_END), lease("q", STARTED)], []),
        # Both finished: the merge child is leased from its start.
        ([lease("p", SHARD_END), lease("q", SHARD_END)], ["c"]),
        # One finished, the other gone with its shard (not listed, no lease).
        ([lease("p", SHARD_END)], ["c"]),
        # The child's own child has a lease already: leave the line alone.
        ([lease("p", SHARD_END), lease("q", SHARD_END), lease("g", STARTED)], []),
    ],
)
def test_children_of_finished_parents(leases: list[Lease], expected: list[str]) -> None:
    listing = [shard("p", 1, 5), shard("c", 9, None, parent="p", adjacent="q"),
               shard("g", 12, None, parent="c")]  # fmt: skip
    if any(x.lease_key == "q" for x in leases):
        listing.append(shard("q", 2, 6))
    leased = {x.shard_id for x in leases}
    finished = {x.shard_id for x in leases if x.checkpoint.is_shard_end}
    found = children_of_finished_parents(listing, leased, finished)
    assert [x.shard_id for x in found] == expected
    assert all(x.checkpoint == TRIM_HORIZON for x in found)


# From a review of shard sync (each failed on the code before its fix).


def two_shards() -> list[Shard]:
    return [shard("a", 1, None, 0, HALF), shard("b", 1, None, HALF + 1, MAX_HASH_KEY)]


def test_sync_failure_clears_once_the_hole_is_gone() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("a", STARTED, lo=0, hi=HALF))  # b's range is a hole
    lister = FailingLister(two_shards())
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, hole_threshold=1
    )
    with pytest.raises(DependencyError):
        m.run_once()  # hole -> sync -> ListShards fails
    assert m.sync_failure is not None  # leader reported not ready: fair
    lister.failing = False
    # The hole is closed by someone else (the next leader's sync, a shard end, an operator).
    table.create_lease_if_absent(lease("b", STARTED, lo=HALF + 1, hi=MAX_HASH_KEY))
    for _ in range(5):
        result = m.run_once()
        assert result.holes == 0 and result.synced is None
    # Nothing is failing any more, yet readiness keeps saying "shard sync failed" for ever.
    assert m.sync_failure is None, m.sync_failure


def test_cleanup_runs_while_the_sync_fails() -> None:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("p", SHARD_END, children=("a",), lo=0, hi=HALF))
    table.create_lease_if_absent(lease("a", STARTED, parents=("p",), lo=0, hi=HALF))
    lister = FailingLister(two_shards())  # b unleased: a hole; ListShards keeps failing
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()), table, hole_threshold=1
    )
    for _ in range(5):
        with pytest.raises(DependencyError):
            m.run_once()
    # p's children started and it has no parent lease: the KCL's cleanup would have deleted it.
    assert table.get_lease("p") is None


def test_children_of_an_aged_out_leased_parent_start_at_their_start() -> None:
    """Workers down longer than the retention, across a split: garbage cleanup deleted the
    parent's lease and the next sync leased its children as roots at LATEST, skipping all they
    held (the Spark source reads them from their start)."""
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("p", ExtendedSequenceNumber("5")))  # mid-shard checkpoint
    lister = ListedShards(
        [  # p (closed) has aged out: only its children are listed
            shard("c1", 100, None, 0, HALF, parent="p"),
            shard("c2", 100, None, HALF + 1, MAX_HASH_KEY, parent="p"),
        ]
    )
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()),
        table,
        hole_threshold=3,
        lister=lister,
        shard_gone=lambda x: x.shard_id == "p",
        garbage_every=10,
    )
    for _ in range(13):
        m.run_once()
    made = {x.lease_key: x.checkpoint for x in table.list_leases()}
    assert "p" not in made  # deleted as garbage (shard not found)
    assert set(made) == {"c1", "c2"}
    assert made["c1"] == TRIM_HORIZON, made  # current code: LATEST -> reshard..now skipped


def test_leases_of_an_earlier_stream_of_the_same_name_are_deleted_on_garbage_rounds() -> None:
    """Multi-stream: a stream deleted and made again gets a new key; its old leases were left
    for good (every take round scanned them), as each cleanup looks at its own stream's key."""
    from shard_sync.cleanup import former_stream_leases

    now, old, newer, other = "1:s:200", "1:s:100", "1:s:300", "1:t:100"
    table = MemoryLeaseTable()
    for stream in (now, old, newer, other):
        table.create_lease_if_absent(lease(f"{stream}:shardId-0", STARTED))
    table.create_lease_if_absent(lease(f"{old}:shardId-1", SHARD_END))
    assert [x.lease_key for x in former_stream_leases(table.list_leases(), now)] == [
        f"{old}:shardId-0", f"{old}:shardId-1"
    ]  # fmt: skip
    assert former_stream_leases(table.list_leases(), None) == []  # one stream: no key
    lister = ListedShards([shard("shardId-0", 1, None, 0, MAX_HASH_KEY)])
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest(), stream_key=now), table,
        lister=lister, shard_gone=lambda x: False, garbage_every=2,
    )  # fmt: skip
    assert m.run_once().deleted == ()  # not a garbage round
    assert set(m.run_once().deleted) == {f"{old}:shardId-0", f"{old}:shardId-1"}
    assert {x.lease_key for x in table.list_leases()} == {
        f"{s}:shardId-0" for s in (now, newer, other)
    }


class LapsingLister(ListedShards):
    """The leader stalls during its listing (ListShards retried, a paused VM): when the answer
    comes, another worker leads."""

    def __init__(self, shards: list[Shard], leading: list[bool]) -> None:
        super().__init__(shards)
        self.leading = leading

    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        self.leading[0] = False
        return super().list_shards(shard_filter)


def test_a_leader_that_lapsed_during_its_round_writes_nothing_from_its_old_scan() -> None:
    """Its scan showed an empty table; meanwhile the next leader leased the stream, the parent
    was read to its end and its lease deleted: the old leader's round leased the parent again at
    TRIM_HORIZON (every record of it delivered twice, after its children's)."""
    from shard_sync.syncer import LeaderOnlyWrites, LeadershipLapsed

    table, leading = MemoryLeaseTable(), [True]
    writes = LeaderOnlyWrites(table, lambda: leading[0])
    syncer = ShardSyncer(
        LapsingLister(split_listing(), leading), writes, InitialPosition.trim_horizon(),
        sleep=lambda _: None,
    )  # fmt: skip
    maintenance = LeaderMaintenance(syncer, writes)
    with pytest.raises(LeadershipLapsed):
        maintenance.run_once()
    assert table.list_leases() == [] and maintenance.sync_failure is None


def test_a_leader_that_lapsed_deletes_nothing() -> None:
    from shard_sync.syncer import LeaderOnlyWrites, LeadershipLapsed

    table = MemoryLeaseTable()
    for x in (lease("p", SHARD_END, children=("a",)), lease("a", STARTED, parents=("p",))):
        table.create_lease_if_absent(x)
    writes = LeaderOnlyWrites(table, lambda: False)
    syncer = ShardSyncer(ListedShards([]), writes, InitialPosition.latest())
    with pytest.raises(LeadershipLapsed):
        LeaderMaintenance(syncer, writes).run_once()
    assert {x.lease_key for x in table.list_leases()} == {"p", "a"}


@pytest.mark.parametrize("with_range", [True, False])
def test_grandchildren_of_an_aged_out_parent_whose_children_aged_out_too_start_at_their_start(
    with_range: bool,
) -> None:
    """As above, two levels down: p split into c1 and c2, c1 into g1 and g2, and p and c1 both
    aged out. Only c2 was leased at TRIM_HORIZON; g1 and g2, whose parent c1 is neither listed
    nor leased, were leased as roots at LATEST by the next sync, skipping what they held. A
    shard outside p's hash range is not p's (left to the sync as before), nor are g1 and g2 for
    a lease without a hash range (an old KCL's)."""
    table = MemoryLeaseTable()
    parent = lease("p", ExtendedSequenceNumber("5"), hi=HALF)
    table.create_lease_if_absent(parent if with_range else replace(parent, hash_key_range=None))
    quarter = HALF // 2
    lister = ListedShards(
        [
            shard("c2", 100, None, quarter + 1, HALF, parent="p"),
            shard("g1", 300, None, 0, quarter // 2, parent="c1"),
            shard("g2", 300, None, quarter // 2 + 1, quarter, parent="c1"),
            shard("o1", 50, None, HALF + 1, MAX_HASH_KEY, parent="q"),  # q: neither p's nor leased
        ]
    )
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()),
        table,
        hole_threshold=3,
        lister=lister,
        shard_gone=lambda x: x.shard_id in ("p", "c1"),  # both aged out
        garbage_every=10,
    )
    for _ in range(13):
        m.run_once()
    made = {x.lease_key: x.checkpoint for x in table.list_leases()}
    assert "p" not in made
    grandchildren = TRIM_HORIZON if with_range else LATEST
    assert made == {
        "c2": TRIM_HORIZON, "g1": grandchildren, "g2": grandchildren, "o1": LATEST
    }, made  # fmt: skip


def test_a_sibling_of_a_leased_child_is_leased_though_their_parent_lies_above_it() -> None:
    """A sync leased x and not its sibling z (throttled, a lapsed leadership, a crash), y their
    parent listed, its own parent aged out: y counted as under x's unfinished lease (a lease of
    its descendant), so z waited for a shard end nobody would make, until y aged out."""
    shards = [
        shard("y", 10, 50, 0, MAX_HASH_KEY, parent="p"),  # p aged out
        shard("x", 60, None, 0, HALF, parent="y"),
        shard("z", 61, None, HALF + 1, MAX_HASH_KEY, parent="y"),
    ]
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("x", LATEST, parents=("y",), hi=HALF))
    lister = ListedShards(shards)
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.latest()),
        table,
        hole_threshold=3,
        lister=lister,
        shard_gone=lambda x: False,
    )
    for _ in range(6):
        m.run_once()
    assert {x.lease_key for x in table.list_leases()} >= {"x", "z"}


def test_a_child_a_listing_left_out_is_not_passed_over_by_the_garbage_cleanup() -> None:
    """One listing lost the page of c1 (p's child, still in retention): the cleanup leased c1's
    children at TRIM_HORIZON in its stead and deleted p, so c1 was never read and its children
    were read before it. A missing parent must be confirmed gone first."""
    quarter = HALF // 2
    full = [
        shard("c1", 100, 200, 0, quarter, parent="p"),
        shard("c2", 100, None, quarter + 1, HALF, parent="p"),
        shard("g1", 300, None, 0, quarter // 2, parent="c1"),
        shard("g2", 300, None, quarter // 2 + 1, quarter, parent="c1"),
        shard("o", 50, None, HALF + 1, MAX_HASH_KEY),
    ]
    table = MemoryLeaseTable()
    table.create_lease_if_absent(lease("p", ExtendedSequenceNumber("5"), hi=HALF))
    table.create_lease_if_absent(lease("o", ExtendedSequenceNumber("60"), lo=HALF + 1))
    lister = ListedShards([s for s in full if s.shard_id != "c1"])  # c1's page lost
    m = LeaderMaintenance(
        ShardSyncer(lister, table, InitialPosition.trim_horizon()),
        table,
        lister=lister,
        shard_gone=lambda x: x.shard_id == "p",
        garbage_every=1,
    )
    m.run_once()
    assert table.get_lease("p") is not None and table.get_lease("g1") is None
    lister.shards = full
    for _ in range(12):
        m.run_once()
    assert "c1" in {x.lease_key for x in table.list_leases()}


@pytest.mark.parametrize("child", [True, False])
def test_a_descendant_read_to_its_end_is_not_leased_again_for_a_later_aged_out_lease(
    child: bool,
) -> None:
    """Two unfinished leases of one line of descent aged out, cleaned in two garbage rounds (a
    probe throttled, more candidates than probes): the first round leased their descendant d;
    d was read to its end, its children started and its lease was deleted; the second round
    leased d again at TRIM_HORIZON: its records came twice, after its children's. A shard with
    a leased descendant is left out, whether it is the aged-out lease's child or a shard in its
    range whose parents are neither listed nor leased (``child`` False)."""
    listed = {
        "d": shard("d", 40, 50, parent="g" if child else "p4", adjacent=None if child else "p5"),
        "d1": shard("d1", 51, None, 0, HALF, parent="d"),
        "d2": shard("d2", 52, None, HALF + 1, MAX_HASH_KEY, parent="d"),
    }
    aged_out = lease("g")
    assert oldest_descendants(aged_out, listed, leased=set()) == ["d"]
    assert oldest_descendants(aged_out, listed, leased={"d1", "d2"}) == []
    assert oldest_descendants(aged_out, listed, leased={"d2"}) == []
