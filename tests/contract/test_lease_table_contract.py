"""One contract for every lease table: memory (the reference), SQLite, and DynamoDB on LocalStack.

Each test states the port's promise for one method, won and lost: a lost race returns None/False
and writes nothing (read back and compared), a won write returns the lease as now stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import CheckpointRegressionError
from checkpoint.lease import MAX_HASH_KEY, HashKeyRange, Lease, OwnerFigures
from checkpoint.port import CoordinationRecord
from checkpoint.sequence import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
)
from checkpoint.stores.dynamodb import DynamoDBLeaseTable
from checkpoint.stores.memory import MemoryLeaseTable
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.spark.pieces import InFlight, PendingState, PieceKey
from kclpy_spark.spark.settings import MAX_STATE_PIECES

SEQ_1 = "49590338271490256608559692538361571095921575989136588898"
SEQ_2 = "49590338271490256608559692540925702759324208523137515618"
KEY = "shardId-000000000001"


@pytest.fixture(
    params=["memory", "sqlite", pytest.param("dynamodb", marks=pytest.mark.integration)]
)
def table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh, empty lease table of each implementation."""
    if request.param == "memory":
        yield MemoryLeaseTable()
    elif request.param == "sqlite":
        store = SQLiteLeaseTable(tmp_path / "leases.db", namespace="contract-app")
        store.ensure_table()
        yield store
        store.close()
    else:
        # getfixturevalue: only this parameter needs (and starts) LocalStack.
        client = request.getfixturevalue("dynamodb_client")
        name = request.getfixturevalue("unique_name")
        dynamo = DynamoDBLeaseTable(client, name)
        dynamo.ensure_table()
        yield dynamo
        client.delete_table(TableName=name)
        client.delete_table(TableName=dynamo.records.table_name)


def lease(key: str = KEY, **fields: Any) -> Lease:
    return Lease(lease_key=key, checkpoint=fields.pop("checkpoint", TRIM_HORIZON), **fields)


def stored(table: Any, lease_or_key: Lease | str = KEY) -> Lease:
    key = lease_or_key if isinstance(lease_or_key, str) else lease_or_key.lease_key
    found = table.get_lease(key)
    assert found is not None, f"lease {key} is missing"
    return found  # type: ignore[no-any-return]


def full_lease(key: str = KEY) -> Lease:
    """A lease with every field set to a non-default value."""
    return Lease(
        lease_key=key,
        checkpoint=ExtendedSequenceNumber(SEQ_1, 7),
        lease_owner="worker-a",
        lease_counter=42,
        pending_checkpoint=ExtendedSequenceNumber(SEQ_2, 3),
        pending_checkpoint_state=b"\x00\xffapp state\n",
        owner_switches_since_checkpoint=5,
        parent_shard_ids=frozenset({"shardId-000000000000", "shardId-000000000002"}),
        child_shard_ids=frozenset({"shardId-000000000005", "shardId-000000000006"}),
        hash_key_range=HashKeyRange(2**127, MAX_HASH_KEY),
        checkpoint_owner="worker-old",
        closed_until=1_700_000_123.25,
        closed_count=3,
        start_timestamp=1_700_000_000.5,
    )


# -- create, get, list, is_empty ------------------------------------------------------------------


def test_create_if_absent_twice_keeps_the_first(table: Any) -> None:
    first = lease(lease_owner="a")
    assert table.create_lease_if_absent(first) is True
    assert table.create_lease_if_absent(lease(lease_owner="b", lease_counter=9)) is False
    assert stored(table) == first


def test_get_missing_lease_is_none(table: Any) -> None:
    assert table.get_lease("shardId-999") is None


def test_is_empty_follows_creates_and_deletes(table: Any) -> None:
    assert table.is_empty() is True
    table.create_lease_if_absent(lease())
    assert table.is_empty() is False
    assert table.delete_lease(stored(table)) is True
    assert table.is_empty() is True


def test_list_leases_returns_every_lease(table: Any) -> None:
    leases = [lease(f"shardId-00{i}", lease_owner=f"w{i % 2}") for i in range(5)]
    for one in leases:
        assert table.create_lease_if_absent(one)
    assert sorted(table.list_leases(), key=lambda x: x.lease_key) == leases


def test_list_leases_on_an_empty_table(table: Any) -> None:
    assert table.list_leases() == []


def test_a_table_scan_returns_the_leases_and_the_records_under_a_prefix(table: Any) -> None:
    leases = [lease(f"shardId-00{i}", lease_owner=f"w{i % 2}") for i in range(3)]
    for one in leases:
        assert table.create_lease_if_absent(one)
    later = time.time() + 60
    records = [CoordinationRecord(key, "w0", 1, later, "{}") for key in ("worker/a", "worker/b")]
    for record in [*records, CoordinationRecord("workers-not", None, 1, later, "{}")]:
        assert table.put_record(record, None)
    scan = table.scan_table("worker/")
    assert sorted(scan.leases, key=lambda x: x.lease_key) == leases
    assert sorted(scan.records, key=lambda r: r.key) == records
    assert table.scan_table("nothing/").records == ()


def test_lease_keys_by_owner(table: Any) -> None:
    for i, owner in enumerate(["a", "b", "a", None]):
        assert table.create_lease_if_absent(lease(f"shardId-{i}", lease_owner=owner))
    assert table.put_record(CoordinationRecord("worker/a", "a", 1, 100.0, "{}"), None)
    assert sorted(table.list_lease_keys_by_owner("a")) == ["shardId-0", "shardId-2"]
    assert table.list_lease_keys_by_owner("nobody") == []


# -- round trips ----------------------------------------------------------------------------------


def test_every_field_round_trips(table: Any) -> None:
    original = full_lease()
    assert table.create_lease_if_absent(original)
    assert stored(table) == original
    assert table.list_leases() == [original]


def test_minimal_lease_round_trips(table: Any) -> None:
    original = lease()
    table.create_lease_if_absent(original)
    back = stored(table)
    assert back == original
    assert back.lease_owner is None and back.parent_shard_ids == frozenset()
    assert back.hash_key_range is None and back.pending_checkpoint is None


@pytest.mark.parametrize(
    "hash_range",
    [HashKeyRange(0, MAX_HASH_KEY), HashKeyRange(MAX_HASH_KEY, MAX_HASH_KEY), HashKeyRange(0, 0)],
    ids=["whole", "top", "bottom"],
)
def test_huge_hash_keys_round_trip(table: Any, hash_range: HashKeyRange) -> None:
    original = lease(hash_key_range=hash_range)
    table.create_lease_if_absent(original)
    assert stored(table).hash_key_range == hash_range


@pytest.mark.parametrize(
    "checkpoint",
    [TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END, ExtendedSequenceNumber(SEQ_1, 2**40)],
    ids=["trim_horizon", "latest", "at_timestamp", "shard_end", "sequence"],
)
def test_checkpoints_round_trip(table: Any, checkpoint: ExtendedSequenceNumber) -> None:
    table.create_lease_if_absent(lease(checkpoint=checkpoint))
    assert stored(table).checkpoint == checkpoint


def test_empty_pending_state_round_trips(table: Any) -> None:
    original = lease(pending_checkpoint=ExtendedSequenceNumber(SEQ_1), pending_checkpoint_state=b"")
    table.create_lease_if_absent(original)
    assert stored(table) == original


# -- renew ----------------------------------------------------------------------------------------


def test_renew_by_owner_bumps_only_the_counter(table: Any) -> None:
    table.create_lease_if_absent(full_lease())
    before = stored(table)
    renewed = table.renew_lease(before)
    assert renewed == replace(before, lease_counter=before.lease_counter + 1)
    assert stored(table) == renewed


def test_renew_with_a_stale_counter_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    assert table.renew_lease(before) is not None
    after = stored(table)
    assert table.renew_lease(before) is None
    assert stored(table) == after


def test_renew_by_another_owner_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    assert table.renew_lease(replace(before, lease_owner="b")) is None
    assert stored(table) == before


def test_renew_of_an_unowned_lease_loses(table: Any) -> None:
    table.create_lease_if_absent(lease())
    before = stored(table)
    assert table.renew_lease(before) is None
    assert stored(table) == before


# -- take -----------------------------------------------------------------------------------------


def test_take_counts_owner_switches(table: Any) -> None:
    table.create_lease_if_absent(lease())
    unowned = stored(table)
    by_a = table.take_lease(unowned, "a")
    # As in the KCL, unowned -> owned is not a switch; one owner to another is.
    assert by_a == replace(unowned, lease_owner="a", lease_counter=1,
                           owner_switches_since_checkpoint=0)  # fmt: skip
    by_b = table.take_lease(by_a, "b")
    assert by_b == replace(by_a, lease_owner="b", lease_counter=2,
                           owner_switches_since_checkpoint=1)  # fmt: skip
    again = table.take_lease(by_b, "b")
    assert again == replace(by_b, lease_counter=3)  # same owner: no switch
    assert stored(table) == again


def test_take_clears_the_checkpoint_owner(table: Any) -> None:
    table.create_lease_if_absent(full_lease())
    before = stored(table)
    taken = table.take_lease(before, "worker-c")
    assert taken is not None
    assert taken.checkpoint_owner is None
    expected = replace(
        before,
        lease_owner="worker-c",
        lease_counter=before.lease_counter + 1,
        owner_switches_since_checkpoint=before.owner_switches_since_checkpoint + 1,
        checkpoint_owner=None,
    )
    assert taken == expected == stored(table)


def test_take_with_a_stale_counter_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    winner = table.take_lease(before, "b")
    assert winner is not None
    assert table.take_lease(before, "c") is None
    assert stored(table) == winner


def test_take_ignores_the_owner_it_is_given(table: Any) -> None:
    """take_lease's condition is the counter alone: the KCL steals leases this way."""
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    assert table.take_lease(before, "b") is not None


# -- evict ----------------------------------------------------------------------------------------


def test_evict_removes_the_owner(table: Any) -> None:
    table.create_lease_if_absent(replace(full_lease(), checkpoint_owner=None))
    before = stored(table)
    evicted = table.evict_lease(before)
    assert evicted == replace(before, lease_owner=None, lease_counter=before.lease_counter + 1)
    assert stored(table) == evicted


def test_evict_with_a_stale_counter_or_another_owner_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a", lease_counter=4))
    before = stored(table)
    assert table.evict_lease(replace(before, lease_counter=3)) is None
    assert table.evict_lease(replace(before, lease_owner="b")) is None
    assert table.evict_lease(replace(before, lease_owner=None)) is None
    assert stored(table) == before


# -- update_checkpoint ----------------------------------------------------------------------------


def test_update_checkpoint_resets_owner_switches(table: Any) -> None:
    table.create_lease_if_absent(full_lease())
    before = stored(table)
    target = ExtendedSequenceNumber(SEQ_2, 9)
    updated = table.update_checkpoint(before, target)
    expected = replace(
        before,
        checkpoint=target,
        pending_checkpoint=None,
        pending_checkpoint_state=None,
        owner_switches_since_checkpoint=0,
        lease_counter=before.lease_counter + 1,
        start_timestamp=None,  # only an AT_TIMESTAMP checkpoint keeps its start time
    )
    assert updated == expected == stored(table)


def test_update_checkpoint_with_a_pending_checkpoint(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a", pending_checkpoint_state=b"st"))
    before = stored(table)
    pending = ExtendedSequenceNumber(SEQ_2, 1)
    updated = table.update_checkpoint(before, ExtendedSequenceNumber(SEQ_1), pending)
    assert updated is not None
    assert updated.pending_checkpoint == pending
    assert updated.pending_checkpoint_state == b"st"
    assert stored(table) == updated
    cleared = table.update_checkpoint(updated, ExtendedSequenceNumber(SEQ_2, 1))
    assert cleared is not None
    assert cleared.pending_checkpoint is None and cleared.pending_checkpoint_state is None
    assert stored(table) == cleared


def test_the_largest_pending_state_the_spark_sink_writes_is_stored(table: Any) -> None:
    """A lease's pending checkpoint names every piece of its batches in flight (worker scope:
    every lease of each batch), at most ``MAX_STATE_PIECES`` twice over (a former owner's pieces
    re-formed beside its own), here with multi-stream lease keys of the longest stream name:
    DynamoDB stores it (its items end at 400 KB; 1,400 leases in each of two batches do not)."""
    prefix = f"123456789012:{'s' * 128}:1700000000:"
    at = ExtendedSequenceNumber(SEQ_2, 2**63 - 1)
    group = tuple(
        PieceKey(f"{prefix}shardId-{i:012d}", at, at) for i in range(MAX_STATE_PIECES // 2)
    )
    state = PendingState((InFlight(group, None),) * 4).encode()
    table.create_lease_if_absent(lease(lease_owner="a"))
    updated = table.update_lease(
        replace(stored(table), pending_checkpoint=at, pending_checkpoint_state=state)
    )
    assert updated is not None and stored(table).pending_checkpoint_state == state


def test_update_checkpoint_is_fenced_by_the_counter(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    mine = stored(table)
    stolen = table.take_lease(mine, "b")
    assert stolen is not None
    assert table.update_checkpoint(mine, ExtendedSequenceNumber(SEQ_1)) is None
    assert stored(table) == stolen  # nothing written


def test_update_checkpoint_by_another_owner_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    assert table.update_checkpoint(replace(before, lease_owner="b"), SHARD_END) is None
    assert stored(table) == before


def test_update_checkpoint_never_moves_backwards(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a", checkpoint=ExtendedSequenceNumber(SEQ_2)))
    before = stored(table)
    for back in (ExtendedSequenceNumber(SEQ_1), ExtendedSequenceNumber(SEQ_1, 5), TRIM_HORIZON):
        with pytest.raises(CheckpointRegressionError):
            table.update_checkpoint(before, back)
    assert stored(table) == before
    ended = table.update_checkpoint(before, SHARD_END)
    assert ended is not None
    with pytest.raises(CheckpointRegressionError):
        table.update_checkpoint(ended, ExtendedSequenceNumber(SEQ_2, 1))
    assert stored(table) == ended


def test_update_checkpoint_is_conditional_on_the_stored_checkpoint(table: Any) -> None:
    """A caller whose lease has the right counter but a stale checkpoint writes nothing: the
    store compares the stored checkpoint itself, not only the caller's copy of it."""
    table.create_lease_if_absent(lease(lease_owner="a", checkpoint=ExtendedSequenceNumber(SEQ_2)))
    before = stored(table)
    stale = replace(before, checkpoint=ExtendedSequenceNumber(SEQ_1))
    assert table.update_checkpoint(stale, ExtendedSequenceNumber(SEQ_1, 9)) is None
    assert stored(table) == before


def test_start_timestamp_lives_only_while_the_checkpoint_is_at_timestamp_or_latest(
    table: Any,
) -> None:
    table.create_lease_if_absent(
        lease(lease_owner="a", checkpoint=AT_TIMESTAMP, start_timestamp=1_700_000_000.25)
    )
    before = stored(table)
    assert before.start_timestamp == 1_700_000_000.25
    pending = table.update_checkpoint(before, AT_TIMESTAMP, ExtendedSequenceNumber(SEQ_1))
    assert pending is not None and pending.start_timestamp == 1_700_000_000.25
    moved = table.update_checkpoint(pending, ExtendedSequenceNumber(SEQ_1))
    assert moved is not None and moved.start_timestamp is None
    assert stored(table) == moved
    reset = table.update_lease(replace(moved, checkpoint=AT_TIMESTAMP, start_timestamp=7.5))
    assert reset is not None and stored(table).start_timestamp == 7.5
    # A LATEST lease's pinned first read: kept by a checkpoint at LATEST (one before delivery).
    pinned = table.update_lease(replace(stored(table), checkpoint=LATEST, start_timestamp=9.5))
    assert pinned is not None and stored(table).start_timestamp == 9.5
    again = table.update_checkpoint(pinned, LATEST)
    assert again is not None and stored(table).start_timestamp == 9.5
    assert stored(table).checkpoint == LATEST


# -- update_lease ---------------------------------------------------------------------------------


def test_update_lease_writes_child_shards_and_parking_fields(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    changed = replace(
        before,
        checkpoint=SHARD_END,
        child_shard_ids=frozenset({"shardId-7", "shardId-8"}),
        closed_until=1_700_000_500.5,
        closed_count=2,
    )
    updated = table.update_lease(changed)
    assert updated == replace(changed, lease_counter=before.lease_counter + 1)
    assert stored(table) == updated
    reopened = table.update_lease(
        replace(updated, child_shard_ids=frozenset(), closed_until=None, closed_count=0)
    )
    assert reopened == replace(
        updated,
        child_shard_ids=frozenset(),
        closed_until=None,
        closed_count=0,
        lease_counter=updated.lease_counter + 1,
    )
    assert stored(table) == reopened


def test_update_lease_leaves_identity_fields_alone(table: Any) -> None:
    """Only progress fields are written: owner, parents, hash range, checkpoint owner stay."""
    table.create_lease_if_absent(full_lease())
    before = stored(table)
    sneaky = replace(
        before,
        parent_shard_ids=frozenset({"other"}),
        hash_key_range=HashKeyRange(0, 1),
        lease_owner="sneaky",  # the condition is on the actual owner, the checkpoint owner here
        owner_switches_since_checkpoint=0,
    )
    updated = table.update_lease(sneaky)
    assert updated == replace(
        before, owner_switches_since_checkpoint=0, lease_counter=before.lease_counter + 1
    )


def test_update_lease_with_a_stale_counter_or_another_owner_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a", lease_counter=2))
    before = stored(table)
    assert table.update_lease(replace(before, lease_counter=1, closed_count=5)) is None
    assert table.update_lease(replace(before, lease_owner="b", closed_count=5)) is None
    assert table.update_lease(replace(before, lease_owner=None, closed_count=5)) is None
    assert stored(table) == before


def test_update_lease_of_an_unowned_lease(table: Any) -> None:
    """The owner condition with no owner: the stored lease must have none either."""
    table.create_lease_if_absent(lease())
    before = stored(table)
    updated = table.update_lease(replace(before, closed_count=1))
    assert updated == replace(before, closed_count=1, lease_counter=1)


# -- delete ---------------------------------------------------------------------------------------


def test_delete_with_a_stale_counter_loses(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    before = stored(table)
    renewed = table.renew_lease(before)
    assert table.delete_lease(before) is False
    assert stored(table) == renewed
    assert table.delete_lease(renewed) is True
    assert table.get_lease(KEY) is None
    assert table.delete_lease(renewed) is False


# -- writes on a lease that does not exist --------------------------------------------------------


def test_every_write_on_a_missing_lease_loses(table: Any) -> None:
    ghost = lease(lease_owner="a")
    assert table.renew_lease(ghost) is None
    assert table.take_lease(ghost, "b") is None
    assert table.evict_lease(ghost) is None
    assert table.update_lease(ghost) is None
    assert table.update_checkpoint(ghost, SHARD_END) is None
    assert table.delete_lease(ghost) is False
    assert table.is_empty()
    assert table.get_lease(KEY) is None


# -- coordination records -------------------------------------------------------------------------


def test_record_put_if_absent(table: Any) -> None:
    assert table.get_record("leader") is None
    first = CoordinationRecord("leader", "worker-a", 1, 1_700_000_010.5, '{"epoch": 1}')
    assert table.put_record(first, None) is True
    assert table.put_record(replace(first, owner="worker-b"), None) is False
    assert table.get_record("leader") == first


def test_record_update_by_version_and_lost_race(table: Any) -> None:
    first = CoordinationRecord("leader", "worker-a", 1, 100.0)
    table.put_record(first, None)
    second = replace(first, version=2, expires_at=200.0)
    assert table.put_record(second, 1) is True
    loser = replace(first, owner="worker-b", version=2, expires_at=300.0)
    assert table.put_record(loser, 1) is False
    assert table.get_record("leader") == second
    released = replace(second, owner=None, version=3, data="")
    assert table.put_record(released, 2) is True
    assert table.get_record("leader") == released
    assert table.put_record(replace(released, key="absent", version=2), 1) is False
    assert table.get_record("absent") is None


def test_record_delete_by_version(table: Any) -> None:
    """What pruning the records of workers long gone uses: a record written since is kept."""
    first = CoordinationRecord("worker/a", None, 3, 100.0, '{"updated_at": 100.0}')
    table.put_record(first, None)
    assert table.delete_record("worker/a", 2) is False  # another version: kept
    assert table.get_record("worker/a") == first
    assert table.delete_record("worker/a", 3) is True
    assert table.get_record("worker/a") is None
    assert table.delete_record("worker/a", 3) is False  # already gone
    assert table.delete_record("never", 1) is False


def test_an_eventually_consistent_record_read_returns_what_was_written(table: Any) -> None:
    record = CoordinationRecord("leader", "worker-a", 1, 100.0, '{"assigns": "worker-a"}')
    assert table.put_record(record, None)
    deadline = time.monotonic() + 5.0  # DynamoDB may answer from a replica a moment behind
    while table.get_record("leader", consistent=False) != record:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert table.get_record("absent", consistent=False) is None


def test_records_are_not_leases(table: Any) -> None:
    table.put_record(CoordinationRecord("shard-sync-leader", "a", 1, 1.0), None)
    assert table.is_empty() is True
    assert table.list_leases() == []
    table.create_lease_if_absent(lease())
    assert [x.lease_key for x in table.list_leases()] == [KEY]
    assert table.get_record("shard-sync-leader") is not None


# -- graceful handoff (KCL 3.x: checkpointOwner) -------------------------------------------------


def owned(table: Any, owner: str = "a", counter: int = 5) -> Lease:
    table.create_lease_if_absent(
        lease(lease_owner=owner, lease_counter=counter, checkpoint=ExtendedSequenceNumber(SEQ_1))
    )
    return stored(table)


def test_initiate_handoff_names_both_owners_and_keeps_the_counter(table: Any) -> None:
    before = owned(table)
    pending = table.initiate_handoff(before, "b")
    assert pending == replace(before, lease_owner="b", checkpoint_owner="a")
    assert pending == stored(table)
    assert pending.actual_owner == "a" and pending.handoff_pending


@pytest.mark.parametrize("case", ["unowned", "owner_changed", "already_pending", "missing"])
def test_initiate_handoff_loses(table: Any, case: str) -> None:
    if case == "missing":
        assert table.initiate_handoff(lease(lease_owner="a"), "b") is None
        assert table.get_lease(KEY) is None
        return
    before = (
        owned(table)
        if case != "unowned"
        else (table.create_lease_if_absent(lease()), stored(table))[1]
    )
    view = before
    if case == "owner_changed":
        before = table.take_lease(before, "c")
    elif case == "already_pending":
        before = table.initiate_handoff(before, "c")
    assert table.initiate_handoff(view, "b") is None
    assert stored(table) == before


def test_the_old_owner_renews_and_checkpoints_until_it_completes_the_handoff(table: Any) -> None:
    mine = owned(table)  # a's view, from before the handoff began
    table.initiate_handoff(mine, "b")
    renewed = table.renew_lease(mine)
    assert renewed == replace(mine, lease_owner="b", checkpoint_owner="a",
                              lease_counter=mine.lease_counter + 1)  # fmt: skip
    moved = table.update_checkpoint(renewed, ExtendedSequenceNumber(SEQ_2))
    assert moved is not None and moved.checkpoint == ExtendedSequenceNumber(SEQ_2)
    assert moved.checkpoint_owner == "a" and moved.lease_owner == "b"
    # The new owner may not act on it yet: a renewal in its name loses.
    assert table.renew_lease(replace(moved, checkpoint_owner=None)) is None
    done = table.complete_handoff(moved)
    assert done == replace(moved, checkpoint_owner=None, lease_counter=moved.lease_counter + 1,
                           owner_switches_since_checkpoint=1)  # fmt: skip
    assert stored(table) == done
    # Nothing of the old tenure writes any more; the new owner takes it.
    assert table.renew_lease(moved) is None
    assert table.update_checkpoint(moved, ExtendedSequenceNumber(SEQ_2, 1)) is None
    assert table.evict_lease(moved) is None
    assert stored(table) == done
    taken = table.take_lease(done, "b")
    assert taken == replace(done, lease_counter=done.lease_counter + 1)


@pytest.mark.parametrize("case", ["stale_counter", "no_handoff", "other_checkpoint_owner"])
def test_complete_handoff_loses(table: Any, case: str) -> None:
    before = owned(table)
    pending = table.initiate_handoff(before, "b")
    view = pending
    if case == "stale_counter":
        table.renew_lease(pending)
    elif case == "no_handoff":
        view = before
    else:
        view = replace(pending, checkpoint_owner="z")
    after = stored(table)
    assert table.complete_handoff(view) is None
    assert stored(table) == after


def test_evict_mid_handoff_passes_the_lease_to_the_new_owner(table: Any) -> None:
    pending = table.initiate_handoff(owned(table), "b")
    evicted = table.evict_lease(pending)
    assert evicted == replace(
        pending, checkpoint_owner=None, lease_counter=pending.lease_counter + 1
    )
    assert stored(table) == evicted


def test_evict_with_a_view_from_before_the_handoff_loses(table: Any) -> None:
    """Removing the owner while a handoff is pending would leave a checkpoint owner without a
    lease owner: the old owner learns of the handoff first (its renewal shows it)."""
    before = owned(table)
    pending = table.initiate_handoff(before, "b")
    assert table.evict_lease(before) is None
    assert stored(table) == pending


def test_take_after_the_old_owner_died_mid_handoff_clears_it(table: Any) -> None:
    pending = table.initiate_handoff(owned(table), "b")
    taken = table.take_lease(pending, "c")
    assert taken is not None and taken.lease_owner == "c" and taken.checkpoint_owner is None
    assert taken.lease_counter == pending.lease_counter + 1


def test_take_with_a_view_from_before_a_handoff_counts_the_switch(table: Any) -> None:
    """The hand-off keeps the counter, so a take from the view before it wins; the switch from
    the owner that view names is counted, as the KCL's takeLease counts (SQLite and the memory
    store counted from the stored owner, the hand-off's target: 0)."""
    before = owned(table)
    assert table.initiate_handoff(before, "b") is not None
    taken = table.take_lease(before, "b")
    assert taken is not None and taken.lease_owner == "b"
    assert taken.owner_switches_since_checkpoint == before.owner_switches_since_checkpoint + 1
    assert stored(table) == taken


# -- throughput (KCL 3.x throughputKBps, written at renewal) -------------------------------------


def test_renew_records_the_throughput_it_is_given_and_only_renew_does(table: Any) -> None:
    before = owned(table)
    assert before.throughput_kbps is None
    renewed = table.renew_lease(replace(before, throughput_kbps=3.25))
    assert renewed == replace(before, lease_counter=before.lease_counter + 1, throughput_kbps=3.25)
    assert stored(table) == renewed
    kept = table.renew_lease(replace(renewed, throughput_kbps=None))  # not measured: kept
    assert kept is not None and kept.throughput_kbps == 3.25
    updated = table.update_lease(replace(kept, throughput_kbps=99.0, closed_count=1))
    assert updated is not None and updated.throughput_kbps == 3.25 and updated.closed_count == 1
    assert stored(table) == updated


def test_renew_records_the_owners_figures_and_keeps_them_when_not_measured(table: Any) -> None:
    before = owned(table)
    assert before.figures is None and before.owner_figures is None
    figures = OwnerFigures("a", 1_700_000_000.5, 1_234_567, 0)
    renewed = table.renew_lease(replace(before, figures=figures, throughput_kbps=1.5))
    expected = replace(before, lease_counter=before.lease_counter + 1, figures=figures,
                       throughput_kbps=1.5)  # fmt: skip
    assert renewed == expected == stored(table)
    assert renewed.owner_figures == figures  # measured by its owner
    later = table.renew_lease(replace(renewed, figures=None))  # not measured: kept
    assert later is not None and later.figures == figures
    moved = table.update_checkpoint(
        replace(later, figures=replace(figures, records=5)), ExtendedSequenceNumber(SEQ_2)
    )  # only renewals write the figures
    assert moved is not None and moved.figures == figures
    taken = table.take_lease(moved, "worker-2")
    assert taken is not None and taken.figures == figures  # kept, but no longer the owner's:
    assert taken.owner_figures is None  # readers fall back on what the new owner publishes


# -- write stamps (kclpy-spark's, for faster failover) --------------------------------------------


def test_every_counter_move_is_stamped_with_the_new_counter_and_the_writers_wall_time(
    table: Any,
) -> None:
    table.create_lease_if_absent(lease())
    assert stored(table).write_time is None  # created, never written since
    writes = [
        lambda x: table.take_lease(x, "a"),
        table.renew_lease,
        lambda x: table.update_checkpoint(x, ExtendedSequenceNumber(SEQ_1)),
        lambda x: table.update_lease(replace(x, closed_count=1)),
        lambda x: table.complete_handoff(table.initiate_handoff(x, "b")),
        table.evict_lease,
    ]
    for write in writes:
        before, current = time.time(), stored(table)
        new = write(current)
        after = time.time()
        assert new is not None and new.lease_counter == current.lease_counter + 1
        read = stored(table)
        for found in (new, read):
            assert found.written is not None and found.written.counter == new.lease_counter
            assert found.write_time is not None and before <= found.write_time <= after


def test_a_stamp_speaks_only_for_its_counter_and_is_not_part_of_equality(table: Any) -> None:
    table.create_lease_if_absent(lease(lease_owner="a"))
    renewed = table.renew_lease(stored(table))
    assert renewed is not None and renewed.write_time is not None
    # A handoff begun moves no counter: the stamp still dates the current counter.
    begun = table.initiate_handoff(renewed, "b")
    assert begun is not None and begun.write_time == renewed.write_time
    assert replace(begun, written=None) == begun
    # A counter moved by a writer that does not stamp (a KCL worker) leaves a stale stamp.
    stale = replace(begun, lease_counter=begun.lease_counter + 1)
    assert stale.written == begun.written and stale.write_time is None
