"""What only one store has to prove: SQLite's durability, process safety and namespaces; DynamoDB's
KCL schema compatibility, error mapping and retries (on LocalStack, through a fault-injecting
wrapper of the real client)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import (
    CorruptLeaseError,
    DependencyError,
    InvalidStateError,
    ResourceNotFoundError,
    ThrottledError,
)
from checkpoint.base.retry import RetryPolicy
from checkpoint.lease import MAX_HASH_KEY, HashKeyRange, Lease, OwnerFigures
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.port import CoordinationRecord, KclWorkerSighting
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores import dynamo_codec, dynamo_kcl_workers
from checkpoint.stores.dynamodb import OWNER_INDEX, DynamoDBLeaseTable
from checkpoint.stores.sqlite import SQLiteLeaseTable
from checkpoint.stores.sqlite_pool import POOL_SIZE
from tests.resources import descriptors_under

SEQ = "49590338271490256608559692538361571095921575989136588898"
FAST = RetryPolicy(base_delay=0.001, max_delay=0.01, max_attempts=4, max_elapsed=30.0)


def no_sleep(_: float) -> None:
    return None


# == SQLite =======================================================================================


def open_sqlite(path: Path, **kwargs: Any) -> SQLiteLeaseTable:
    store = SQLiteLeaseTable(path, **kwargs)
    store.ensure_table()
    return store


def test_sqlite_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "leases.db"
    first = open_sqlite(path, namespace="app")
    first.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    first.create_lease_if_absent(Lease("shardId-1", TRIM_HORIZON, parent_shard_ids=frozenset("0")))
    taken = first.take_lease(first.get_lease("shardId-0"), "worker-a")  # type: ignore[arg-type]
    assert taken is not None
    done = first.update_checkpoint(taken, ExtendedSequenceNumber(SEQ, 3))
    first.put_record(CoordinationRecord("leader", "worker-a", 1, 123.0), None)
    before = sorted(first.list_leases(), key=lambda x: x.lease_key)
    first.close()

    second = SQLiteLeaseTable(path, namespace="app", create_if_missing=False)
    second.ensure_table()
    assert sorted(second.list_leases(), key=lambda x: x.lease_key) == before
    assert second.get_lease("shardId-0") == done
    assert second.get_record("leader") == CoordinationRecord("leader", "worker-a", 1, 123.0)
    second.close()


def test_sqlite_namespaces_isolate_applications(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    app_a = open_sqlite(path, namespace="app-a")
    app_b = open_sqlite(path, namespace="app-b")
    assert app_a.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    assert app_b.is_empty()
    assert app_b.create_lease_if_absent(Lease("shardId-0", SHARD_END))
    assert app_a.get_lease("shardId-0") == Lease("shardId-0", TRIM_HORIZON, lease_owner="a")
    assert app_b.delete_lease(Lease("shardId-0", SHARD_END))
    assert app_b.is_empty() and not app_a.is_empty()
    assert app_a.put_record(CoordinationRecord("leader", "a", 1, 1.0), None)
    assert app_b.get_record("leader") is None


def _race_worker(path: str, name: str, rounds: int, barrier: Any, results: Any) -> None:
    store = SQLiteLeaseTable(path, namespace="race")
    for _ in range(rounds):
        barrier.wait()
        seen = store.get_lease("shardId-0")
        barrier.wait()  # both hold the same version now
        assert seen is not None
        won = store.take_lease(seen, name)
        results.put((seen.lease_counter, name, won is not None))
    store.close()


def test_sqlite_two_processes_race_and_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    setup = open_sqlite(path, namespace="race")
    setup.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    setup.close()
    rounds = 25
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(str(path), f"w{i}", rounds, barrier, results))
        for i in range(2)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in range(2 * rounds)]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    by_round: dict[int, list[bool]] = {}
    for counter, _, won in outcomes:
        by_round.setdefault(counter, []).append(won)
    assert sorted(by_round) == list(range(rounds))
    assert all(sorted(wins) == [False, True] for wins in by_round.values())
    final = open_sqlite(path, namespace="race").get_lease("shardId-0")
    assert final is not None and final.lease_counter == rounds


def test_sqlite_threads_share_one_table_object(tmp_path: Path) -> None:
    """Eight threads take the same version through one store object: one wins."""
    store = open_sqlite(tmp_path / "leases.db")
    store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    seen = store.get_lease("shardId-0")
    start = threading.Barrier(8)
    wins: list[bool] = []

    def take(name: str) -> None:
        start.wait()
        wins.append(store.take_lease(seen, name) is not None)  # type: ignore[arg-type]

    threads = [threading.Thread(target=take, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == [False] * 7 + [True]
    assert store.get_lease("shardId-0").lease_counter == 1  # type: ignore[union-attr]
    store.close()


def test_sqlite_connections_are_bounded_by_the_pool_not_by_threads(tmp_path: Path) -> None:
    """Issue 14, finding 1: a thread per batch used to leave a connection (two descriptors with
    WAL) behind each; 300 short-lived threads now leave at most the pool's few."""
    store = open_sqlite(tmp_path / "leases.db")
    store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="w"))

    def one_write() -> None:
        lease = store.get_lease("shardId-0")
        assert lease is not None and store.renew_lease(lease) is not None

    def run_threads(count: int) -> None:
        for _ in range(count):
            thread = threading.Thread(target=one_write)
            thread.start()
            thread.join()

    run_threads(20)
    descriptors = descriptors_under(tmp_path)  # the store's: not other tests' leftovers
    assert descriptors >= 2  # the database and its log, at least
    run_threads(300)
    assert store.open_connections <= POOL_SIZE
    assert descriptors_under(tmp_path) <= descriptors  # nothing per thread that ever ran
    lease = store.get_lease("shardId-0")
    assert lease is not None and lease.lease_counter == 320
    store.close()
    assert store.open_connections == 0


def test_sqlite_connections_not_used_lately_are_closed(tmp_path: Path) -> None:
    """Soak run 3: the connections went 2 -> 3 late and stayed (the most ever in use at once).
    Now a connection idle for the pool's idle time is closed when the pool is next used, so
    after a burst of three a single user keeps one."""
    from checkpoint.stores.sqlite_pool import ConnectionPool

    now = [0.0]
    pool = ConnectionPool(
        tmp_path / "pool.db", create=True, busy_timeout=1.0, idle_seconds=30.0,
        monotonic=lambda: now[0],
    )  # fmt: skip
    with pool.connection(), pool.connection(), pool.connection():
        assert pool.open_connections == 3
    for _ in range(5):  # one at a time, the latest returned one each time
        now[0] += 10.0
        with pool.connection() as conn:
            conn.execute("SELECT 1").fetchone()
    assert pool.open_connections == 1
    pool.close()
    assert pool.open_connections == 0


def test_sqlite_a_busy_pool_is_a_retriable_dependency_error(tmp_path: Path) -> None:
    store = open_sqlite(
        tmp_path / "leases.db", busy_timeout=0.05, retry=RetryPolicy(max_attempts=1)
    )
    with contextlib.ExitStack() as held:
        for _ in range(POOL_SIZE):
            held.enter_context(store._pool.connection())
        with pytest.raises(DependencyError, match="busy"):
            store.list_leases()
    assert store.list_leases() == []


@pytest.mark.parametrize(
    "dropped",
    [
        ("figures", "written_at", "written_counter", "throughput_kbps", "start_timestamp"),
        ("figures", "written_at", "written_counter", "throughput_kbps"),
        ("figures", "written_at", "written_counter"),
        ("figures",),
    ],
    ids=["first-release", "before-throughput", "before-stamps", "before-figures"],
)
def test_sqlite_a_database_of_an_earlier_version_gains_the_new_columns(
    tmp_path: Path, dropped: tuple[str, ...]
) -> None:
    path = tmp_path / "old.db"
    store = open_sqlite(path, namespace="app")
    store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    store.close()
    with sqlite3.connect(path) as conn:  # what an earlier release created
        for column in dropped:
            conn.execute(f"ALTER TABLE kclpy_spark_leases DROP COLUMN {column}")
    again = open_sqlite(path, namespace="app")
    assert again.get_lease("shardId-0") == Lease("shardId-0", TRIM_HORIZON)
    new = Lease("shardId-1", TRIM_HORIZON, start_timestamp=5.0, throughput_kbps=2.5)
    again.create_lease_if_absent(new)
    assert again.get_lease("shardId-1") == new
    taken = again.take_lease(new, "a")
    assert taken is not None and taken.write_time is not None  # the added columns are written
    figures = OwnerFigures("a", 1.5, 3, 4)
    renewed = again.renew_lease(replace(taken, figures=figures))
    assert renewed is not None and renewed.figures == figures


def test_sqlite_missing_file_with_creation_disabled(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "leases.db"
    store = SQLiteLeaseTable(path, create_if_missing=False)
    with pytest.raises(ResourceNotFoundError, match=re.escape(str(path))):
        store.ensure_table()
    assert not path.exists()


def test_sqlite_file_without_tables_and_creation_disabled(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    sqlite3.connect(path).close()
    with pytest.raises(ResourceNotFoundError, match=re.escape(str(path))):
        SQLiteLeaseTable(path, create_if_missing=False).ensure_table()


def test_sqlite_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a database, " * 100)
    with pytest.raises(InvalidStateError, match=re.escape(str(path))):
        SQLiteLeaseTable(path).ensure_table()
    assert path.read_bytes() == b"this is not a database, " * 100


def test_sqlite_table_with_wrong_columns(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE kclpy_spark_leases (namespace TEXT, lease_key TEXT, x INT)")
        conn.execute("CREATE TABLE kclpy_spark_records (namespace TEXT, key TEXT)")
    with pytest.raises(InvalidStateError, match=re.escape(str(path))):
        SQLiteLeaseTable(path).ensure_table()


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("lease_counter", None, "lease_counter"),
        ("lease_counter", "seven", "lease_counter"),
        ("checkpoint", None, "checkpoint"),
        ("checkpoint", "12abc", "not a sequence number"),
        ("parent_shard_ids", "not json", "parent_shard_ids"),
        ("starting_hash_key", str(MAX_HASH_KEY + 1), "hash key range"),
        # #49 item 6: counters no write can move on (negative, out of a long's range)
        ("lease_counter", -1, "lease_counter is out of range"),
        ("owner_switches", -2, "owner_switches is out of range"),
        ("lease_counter", 1.5, "lease_counter"),
    ],
)
def test_sqlite_corrupt_rows_name_the_lease(
    tmp_path: Path, column: str, value: Any, problem: str
) -> None:
    path = tmp_path / "leases.db"
    store = open_sqlite(path)
    store.create_lease_if_absent(
        Lease("shardId-bad", TRIM_HORIZON, hash_key_range=HashKeyRange(0, MAX_HASH_KEY))
    )
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE kclpy_spark_leases SET {column} = ?", (value,))
    for read in (lambda: store.get_lease("shardId-bad"), store.list_leases):
        with pytest.raises(CorruptLeaseError, match=problem) as caught:
            read()
        assert caught.value.lease_key == "shardId-bad"
    assert store.create_lease_if_absent(Lease("shardId-bad", SHARD_END)) is False


def test_sqlite_a_locked_database_is_a_retriable_dependency_error(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    store = open_sqlite(path, busy_timeout=0.01, retry=RetryPolicy(max_attempts=2), sleep=no_sleep)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DependencyError, match="locked") as caught:
            store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
        assert caught.value.retriable
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.is_empty()


def test_sqlite_retries_until_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    patient = RetryPolicy(base_delay=0.02, max_delay=0.1, max_attempts=50, max_elapsed=30.0)
    store = open_sqlite(path, busy_timeout=0.01, retry=patient)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: blocker.execute("ROLLBACK"))
    release.start()
    try:
        assert store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON)) is True
    finally:
        release.join()
        blocker.close()
    assert not store.is_empty()


# == DynamoDB (LocalStack) ========================================================================


class FaultyClient:
    """Wraps a real client; the first ``failures[op]`` calls of ``op`` fail with ``code``.

    ``after_call`` makes the real call first and fails afterwards: a write whose outcome the caller
    cannot know (a 500 after DynamoDB applied it). ``hidden_retry`` imitates botocore retrying
    such a write by itself: the call lands, is sent again, and that real second answer (a failed
    condition) is returned, marked with ``RetryAttempts`` as botocore marks it; with ``code``,
    botocore's last try failed with that error instead (a throttle after its first try landed).
    """

    def __init__(
        self,
        real: Any,
        failures: dict[str, int],
        code: str = "",
        *,
        after_call: bool = False,
        hidden_retry: bool = False,
    ) -> None:
        self._real = real
        self._failures = dict(failures)
        self._code = code
        self._after_call = after_call
        self._hidden_retry = hidden_retry
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)

        def call(**kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self._failures.get(name, 0) <= 0:
                return method(**kwargs)
            self._failures[name] -= 1
            if self._hidden_retry and self._code:
                method(**kwargs)
                error = {"Error": {"Code": self._code, "Message": "injected"},
                         "ResponseMetadata": {"RetryAttempts": 2}}  # fmt: skip
                raise ClientError(error, name)  # type: ignore[arg-type]
            if self._hidden_retry:
                method(**kwargs)
                try:
                    return method(**kwargs)
                except ClientError as exc:
                    response: dict[str, Any] = exc.response  # type: ignore[assignment]
                    response.setdefault("ResponseMetadata", {})["RetryAttempts"] = 1
                    raise
            if self._after_call:
                method(**kwargs)
            error = {"Error": {"Code": self._code, "Message": "injected"}}
            raise ClientError(error, name)  # type: ignore[arg-type]

        return call


@pytest.fixture
def dynamo(dynamodb_client: Any, unique_name: str) -> Iterator[DynamoDBLeaseTable]:
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, retry=FAST, sleep=no_sleep)
    table.ensure_table()
    yield table
    dynamodb_client.delete_table(TableName=unique_name)
    dynamodb_client.delete_table(TableName=table.records.table_name)


def raw_item(client: Any, table: str, key: str) -> dict[str, Any]:
    found = client.get_item(TableName=table, Key={"leaseKey": {"S": key}}, ConsistentRead=True)
    return dict(found["Item"])


def test_dynamodb_reads_an_item_the_java_kcl_wrote(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    kcl_item = {
        "leaseKey": {"S": "shardId-000000000003"},
        "leaseOwner": {"S": "kcl-worker-1"},
        "leaseCounter": {"N": "1234"},
        "ownerSwitchesSinceCheckpoint": {"N": "2"},
        "checkpoint": {"S": SEQ},
        "checkpointSubSequenceNumber": {"N": "5"},
        "pendingCheckpoint": {"S": SEQ},
        "pendingCheckpointSubSequenceNumber": {"N": "6"},
        "pendingCheckpointState": {"B": b"state"},
        "parentShardId": {"SS": ["shardId-000000000001", "shardId-000000000002"]},
        "childShardIds": {"SS": ["shardId-000000000004"]},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": str(MAX_HASH_KEY)},
        "throughputKBps": {"N": "12.5"},  # KCL 3.x, not modelled: ignored and kept
        "checkpointOwner": {"S": "kcl-worker-0"},
    }
    dynamodb_client.put_item(TableName=dynamo.table_name, Item=kcl_item)
    expected = Lease(
        lease_key="shardId-000000000003",
        checkpoint=ExtendedSequenceNumber(SEQ, 5),
        lease_owner="kcl-worker-1",
        lease_counter=1234,
        pending_checkpoint=ExtendedSequenceNumber(SEQ, 6),
        pending_checkpoint_state=b"state",
        owner_switches_since_checkpoint=2,
        parent_shard_ids=frozenset({"shardId-000000000001", "shardId-000000000002"}),
        child_shard_ids=frozenset({"shardId-000000000004"}),
        hash_key_range=HashKeyRange(0, MAX_HASH_KEY),
        checkpoint_owner="kcl-worker-0",
        throughput_kbps=12.5,
    )
    assert dynamo.get_lease("shardId-000000000003") == expected
    assert dynamo.list_leases() == [expected]
    assert dynamo.list_lease_keys_by_owner("kcl-worker-1") == ["shardId-000000000003"]
    updated = dynamo.update_checkpoint(expected, SHARD_END)
    assert updated is not None and updated.checkpoint == SHARD_END
    after = raw_item(dynamodb_client, dynamo.table_name, "shardId-000000000003")
    assert after["throughputKBps"] == {"N": "12.5"}
    assert after["leaseCounter"] == {"N": "1235"}
    assert "pendingCheckpoint" not in after and "pendingCheckpointState" not in after


def test_dynamodb_tolerates_the_kcl_pending_state_bug(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """The KCL's toDynamoRecord writes the sub-sequence number (an N) as pendingCheckpointState."""
    item = {
        "leaseKey": {"S": "shardId-0"},
        "leaseCounter": {"N": "0"},
        "checkpoint": {"S": "TRIM_HORIZON"},
        "checkpointSubSequenceNumber": {"N": "0"},
        "ownerSwitchesSinceCheckpoint": {"N": "0"},
        "pendingCheckpointState": {"N": "0"},
    }
    dynamodb_client.put_item(TableName=dynamo.table_name, Item=item)
    assert dynamo.get_lease("shardId-0") == Lease("shardId-0", TRIM_HORIZON)


def test_dynamodb_writes_exactly_the_kcl_attributes(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    full = Lease(
        lease_key="shardId-1",
        checkpoint=ExtendedSequenceNumber(SEQ, 7),
        lease_owner="w",
        lease_counter=3,
        pending_checkpoint=ExtendedSequenceNumber(SEQ, 8),
        pending_checkpoint_state=b"s",
        owner_switches_since_checkpoint=1,
        parent_shard_ids=frozenset({"shardId-0"}),
        child_shard_ids=frozenset({"shardId-2"}),
        hash_key_range=HashKeyRange(0, MAX_HASH_KEY),
        checkpoint_owner="v",
    )
    dynamo.create_lease_if_absent(full)
    item = raw_item(dynamodb_client, dynamo.table_name, "shardId-1")
    types = {name: next(iter(value)) for name, value in item.items()}
    assert types == {
        "leaseKey": "S", "leaseOwner": "S", "leaseCounter": "N", "checkpoint": "S",
        "checkpointSubSequenceNumber": "N", "pendingCheckpoint": "S",
        "pendingCheckpointSubSequenceNumber": "N", "pendingCheckpointState": "B",
        "ownerSwitchesSinceCheckpoint": "N", "parentShardId": "SS", "childShardIds": "SS",
        "startingHashKey": "S", "endingHashKey": "S", "checkpointOwner": "S",
    }  # fmt: skip
    assert item["endingHashKey"] == {"S": str(MAX_HASH_KEY)}
    assert item["checkpoint"] == {"S": SEQ} and item["leaseCounter"] == {"N": "3"}

    dynamo.create_lease_if_absent(Lease("shardId-9", TRIM_HORIZON))
    minimal = raw_item(dynamodb_client, dynamo.table_name, "shardId-9")
    assert set(minimal) == {
        "leaseKey", "leaseCounter", "checkpoint", "checkpointSubSequenceNumber",
        "ownerSwitchesSinceCheckpoint",
    }  # fmt: skip

    parked = dynamo.update_lease(replace(full, closed_until=1_700_000_000.5, closed_count=2))
    assert parked is not None
    item = raw_item(dynamodb_client, dynamo.table_name, "shardId-1")
    assert item["kclpySparkClosedUntil"] == {"N": "1700000000.5"}
    assert item["kclpySparkClosedCount"] == {"N": "2"}
    evicted = dynamo.evict_lease(parked)  # mid-handoff: the lease goes to the new owner
    assert evicted is not None
    item = raw_item(dynamodb_client, dynamo.table_name, "shardId-1")
    assert "checkpointOwner" not in item and item["leaseOwner"] == {"S": "w"}
    assert dynamo.evict_lease(evicted) is not None
    assert "leaseOwner" not in raw_item(dynamodb_client, dynamo.table_name, "shardId-1")

    # A multi-stream lease also carries the KCL's streamName and shardId (a Java multi-stream
    # worker given a lease without them failed every loop of its scheduler), kept by updates.
    key = "123456789012:orders:1700000000:shardId-000000000001"
    dynamo.create_lease_if_absent(Lease(key, TRIM_HORIZON))
    item = raw_item(dynamodb_client, dynamo.table_name, key)
    assert item["streamName"] == {"S": "123456789012:orders:1700000000"}
    assert item["shardId"] == {"S": "shardId-000000000001"}
    got = dynamo.get_lease(key)
    assert got is not None
    assert dynamo.update_lease(replace(got, checkpoint=ExtendedSequenceNumber(SEQ))) is not None
    assert raw_item(dynamodb_client, dynamo.table_name, key)["shardId"] == item["shardId"]
    # A lease made before they were written gets them at its next write (as the KCL's do).
    dynamodb_client.update_item(
        TableName=dynamo.table_name, Key={"leaseKey": {"S": key}},
        UpdateExpression="REMOVE streamName, shardId",
    )  # fmt: skip
    old = dynamo.get_lease(key)
    assert old is not None and dynamo.take_lease(old, "w2") is not None
    again = raw_item(dynamodb_client, dynamo.table_name, key)
    assert (again["streamName"], again["shardId"]) == (item["streamName"], item["shardId"])


def test_dynamodb_a_scan_shows_the_kcl_fleet_s_client_version(
    dynamo: DynamoDBLeaseTable,
    dynamodb_client: Any,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Migration3.0 item's ``cv``: in the lease table since KCL 3.5, in
    ``<application>-CoordinatorState`` before (a fleet there still migrating from KCL 2.x does
    not follow hand-offs)."""
    assert dynamo.scan_table("").kcl_client_version is None
    coordinator = f"{unique_name}-CoordinatorState"
    dynamodb_client.create_table(
        TableName=coordinator, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    )  # fmt: skip
    try:
        dynamodb_client.get_waiter("table_exists").wait(TableName=coordinator)
        dynamodb_client.put_item(TableName=coordinator, Item={
            "key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_UPGRADE_FROM_2X"},
            "mb": {"S": "kcl-a"}, "mts": {"N": "1764000000"},
        })  # fmt: skip
        monkeypatch.setattr(dynamo_kcl_workers, "PROBE_EVERY", 0.0)  # looked for again now
        assert dynamo.scan_table("").kcl_client_version == "CLIENT_VERSION_UPGRADE_FROM_2X"
        # KCL 3.5's single table: the entity in the lease table is read first.
        dynamodb_client.put_item(TableName=dynamo.table_name, Item={
            "leaseKey": {"S": "Migration3.0"}, "entityType": {"S": "CLIENT_VERSION_MIGRATION"},
            "cv": {"S": "CLIENT_VERSION_3X"},
        })  # fmt: skip
        scan = dynamo.scan_table("")
        assert scan.kcl_client_version == "CLIENT_VERSION_3X" and scan.leases == ()
    finally:
        dynamodb_client.delete_table(TableName=coordinator)


class ScanRecorder:
    """The DynamoDB client, recording what each Scan read."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.scanned: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def scan(self, **kwargs: Any) -> Any:
        answer = self._client.scan(**kwargs)
        self.scanned.append(int(answer["ScannedCount"]))
        return answer


def test_dynamodb_is_empty_reads_one_small_page(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """It read a whole page (up to 1 MB, charged by the items read) at every call."""
    for n in range(40):
        dynamo.create_lease_if_absent(Lease(f"shardId-{n}", TRIM_HORIZON))
    recorder = ScanRecorder(dynamodb_client)
    table = DynamoDBLeaseTable(recorder, dynamo.table_name, retry=FAST, sleep=no_sleep)
    assert table.is_empty() is False
    assert len(recorder.scanned) == 1 and recorder.scanned[0] <= 10


def test_dynamodb_table_matches_the_kcl_table(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    table = dynamodb_client.describe_table(TableName=dynamo.table_name)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "leaseKey", "KeyType": "HASH"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    (index,) = table["GlobalSecondaryIndexes"]
    assert index["IndexName"] == OWNER_INDEX
    assert index["KeySchema"] == [
        {"AttributeName": "leaseOwner", "KeyType": "HASH"},
        {"AttributeName": "leaseKey", "KeyType": "RANGE"},
    ]
    assert index["Projection"]["ProjectionType"] == "KEYS_ONLY"
    dynamo.ensure_table()  # idempotent


def test_dynamodb_skips_other_kcl_entities(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    other = {"leaseKey": {"S": "worker-1"}, "entityType": {"S": "WORKER_METRIC_STATS"}}
    dynamodb_client.put_item(TableName=dynamo.table_name, Item=other)
    assert dynamo.is_empty() and dynamo.list_leases() == []
    assert dynamo.get_lease("worker-1") is None
    lease_item = {
        "leaseKey": {"S": "shardId-0"}, "entityType": {"S": "LEASE"}, "leaseCounter": {"N": "1"},
        "checkpoint": {"S": "LATEST"},
    }  # fmt: skip
    dynamodb_client.put_item(TableName=dynamo.table_name, Item=lease_item)
    assert dynamo.list_leases() == [
        Lease("shardId-0", ExtendedSequenceNumber("LATEST"), lease_counter=1)
    ]


def test_dynamodb_a_scan_shows_the_kcl3_workers_metrics_entities(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """KCL 3.5's single-table format: a worker's metrics entity, as the Java KCL writes it, is no
    lease but tells a live KCL 3.x worker (``lut``); an entity without ``lut`` tells nothing."""
    java = {
        "leaseKey": {"S": "kcl-java-1"}, "entityType": {"S": "WORKER_METRIC_STATS"},
        "lut": {"N": "1764000000"}, "sts": {"M": {"C": {"L": [{"N": "41.5"}]}}},
        "opr": {"M": {"C": {"L": [{"N": "100"}]}}}, "sup": {"N": "1"},
        "slu": {"N": "1764000000"}, "properties": {"M": {}},
    }  # fmt: skip
    no_lut = {"leaseKey": {"S": "kcl-java-2"}, "entityType": {"S": "WORKER_METRIC_STATS"}}
    leader = {"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "lut": {"N": "5"}}
    for item in (java, no_lut, leader):
        dynamodb_client.put_item(TableName=dynamo.table_name, Item=item)
    dynamo.create_lease_if_absent(Lease("shardId-0", ExtendedSequenceNumber("LATEST")))
    scan = dynamo.scan_table("")
    assert [x.lease_key for x in scan.leases] == ["shardId-0"]
    assert scan.kcl_workers == (KclWorkerSighting("kcl-java-1", 1764000000.0),)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"leaseCounter": None}, "leaseCounter"),
        ({"checkpoint": None}, "checkpoint"),
        ({"checkpoint": {"N": "12"}}, "checkpoint"),
        ({"checkpoint": {"S": "12abc"}}, "not a sequence number"),
        ({"pendingCheckpoint": {"S": "next"}}, "pendingCheckpoint"),
        ({"leaseCounter": {"S": "7"}}, "leaseCounter"),
        ({"leaseCounter": {"N": "1.5"}}, "leaseCounter"),
        # #49 item 6: 38 digits (every write that moves it is refused), negative, -1.5
        ({"leaseCounter": {"N": "9" * 38}}, "'leaseCounter' is out of range"),
        ({"ownerSwitchesSinceCheckpoint": {"N": "9" * 38}}, "ownerSwitchesSinceCheckpoint"),
        ({"leaseCounter": {"N": "-1"}}, "'leaseCounter' is out of range"),
        ({"leaseCounter": {"N": "-1.5"}}, "leaseCounter"),
        ({"parentShardId": {"S": "shardId-0"}}, "parentShardId"),
        ({"endingHashKey": None}, "endingHashKey"),
    ],
)
def test_dynamodb_corrupt_items_name_the_lease(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any, change: dict[str, Any], problem: str
) -> None:
    item: dict[str, Any] = {
        "leaseKey": {"S": "shardId-bad"},
        "leaseCounter": {"N": "4"},
        "checkpoint": {"S": SEQ},
        "startingHashKey": {"S": "0"},
        "endingHashKey": {"S": "10"},
    }
    for name, value in change.items():
        if value is None:
            del item[name]
        else:
            item[name] = value
    dynamodb_client.put_item(TableName=dynamo.table_name, Item=item)
    before = raw_item(dynamodb_client, dynamo.table_name, "shardId-bad")
    for read in (lambda: dynamo.get_lease("shardId-bad"), dynamo.list_leases):
        with pytest.raises(CorruptLeaseError, match=problem) as caught:
            read()
        assert caught.value.lease_key == "shardId-bad"
    assert dynamo.create_lease_if_absent(Lease("shardId-bad", TRIM_HORIZON)) is False
    assert raw_item(dynamodb_client, dynamo.table_name, "shardId-bad") == before


def test_dynamodb_missing_table_with_creation_disabled(
    dynamodb_client: Any, unique_name: str
) -> None:
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
    with pytest.raises(ResourceNotFoundError, match=unique_name):
        table.ensure_table()
    with pytest.raises(ResourceNotFoundError, match=unique_name):
        table.get_lease("shardId-0")
    names = dynamodb_client.list_tables()["TableNames"]
    assert unique_name not in names


def test_dynamodb_table_with_a_wrong_key_schema(dynamodb_client: Any, unique_name: str) -> None:
    dynamodb_client.create_table(
        TableName=unique_name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        dynamodb_client.get_waiter("table_exists").wait(TableName=unique_name)
        table = DynamoDBLeaseTable(dynamodb_client, unique_name, ttl_attribute="expires")
        with pytest.raises(InvalidStateError, match=unique_name):
            table.ensure_table()
        assert dynamodb_client.scan(TableName=unique_name)["Count"] == 0
        ttl = dynamodb_client.describe_time_to_live(TableName=unique_name)
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] == "DISABLED"
    finally:
        dynamodb_client.delete_table(TableName=unique_name)


def test_dynamodb_ttl_attribute(dynamodb_client: Any, unique_name: str) -> None:
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, ttl_attribute="expiresAt")
    table.ensure_table()
    try:
        records = f"{unique_name}-KclpySparkState"
        ttl = dynamodb_client.describe_time_to_live(TableName=records)["TimeToLiveDescription"]
        assert ttl["TimeToLiveStatus"] in {"ENABLED", "ENABLING"}
        table.ensure_table()  # already enabled: nothing to do
        table.put_record(CoordinationRecord("leader", "a", 1, 1_700_000_000.2), None)
        records = table.records.table_name  # TTL is the coordination table's: records expire
        assert records == f"{unique_name}-KclpySparkState"
        ttl = dynamodb_client.describe_time_to_live(TableName=records)["TimeToLiveDescription"]
        assert ttl["AttributeName"] == "expiresAt"
        item = raw_item(dynamodb_client, records, "__kclpy_spark__/leader")
        assert item["expiresAt"] == {"N": str(1_700_000_001 + 86_400)}
        assert item["entityType"] == {"S": "KCLPY_SPARK_COORDINATION"}
        leases_table = dynamodb_client.scan(TableName=unique_name)["Items"]
        assert leases_table == []  # the lease table holds leases only
    finally:
        dynamodb_client.delete_table(TableName=unique_name)
        dynamodb_client.delete_table(TableName=f"{unique_name}-KclpySparkState")


def test_dynamodb_throttling_is_retried(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    lease = dynamo.get_lease("shardId-0")
    assert lease is not None
    faulty = FaultyClient(
        dynamodb_client, {"update_item": 3}, "ProvisionedThroughputExceededException"
    )
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="checkpoint.base.retry"):
        renewed = table.renew_lease(lease)
    assert renewed is not None and renewed.lease_counter == 1
    assert faulty.calls == {"update_item": 4}
    retries = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == 3
    assert all("renew lease 'shardId-0'" in r.getMessage() for r in retries)
    assert "ProvisionedThroughputExceededException" in retries[0].getMessage()


def test_dynamodb_throttling_gives_up_after_the_last_attempt(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    faulty = FaultyClient(dynamodb_client, {"get_item": 99}, "ThrottlingException")
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    with pytest.raises(ThrottledError, match=dynamo.table_name):
        table.get_lease("shardId-0")
    assert faulty.calls == {"get_item": FAST.max_attempts}


def test_dynamodb_lost_race_is_not_retried(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    faulty = FaultyClient(dynamodb_client, {})
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    stale = Lease("shardId-0", TRIM_HORIZON, lease_owner="a", lease_counter=7)
    assert table.renew_lease(stale) is None
    assert table.take_lease(stale, "b") is None
    assert table.delete_lease(stale) is False
    assert faulty.calls == {"update_item": 2, "delete_item": 1}


def test_dynamodb_non_retriable_errors_are_not_retried(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    faulty = FaultyClient(dynamodb_client, {"update_item": 1}, "ValidationException")
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    with pytest.raises(InvalidStateError, match="UpdateItem"):
        table.renew_lease(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    assert faulty.calls == {"update_item": 1}


def test_dynamodb_a_write_that_landed_before_an_error_still_wins(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """A 500 after DynamoDB applied the write: the retry fails its condition, the re-read shows
    our own write, so the result is a win (as the KCL's renewLease recovers)."""
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    lease = dynamo.get_lease("shardId-0")
    assert lease is not None
    faulty = FaultyClient(
        dynamodb_client, {"update_item": 1}, "InternalServerError", after_call=True
    )
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    done = table.update_checkpoint(lease, ExtendedSequenceNumber(SEQ))
    assert done == replace(lease, checkpoint=ExtendedSequenceNumber(SEQ), lease_counter=1)
    assert faulty.calls == {"update_item": 2}  # the failed condition returned the item
    # Someone else's write after an unknown outcome is still a lost race.
    faulty2 = FaultyClient(dynamodb_client, {"update_item": 1}, "InternalServerError")
    other = DynamoDBLeaseTable(faulty2, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    assert dynamo.take_lease(done, "b") is not None
    assert other.update_checkpoint(done, SHARD_END) is None


def test_dynamodb_a_take_answered_late_wins_though_a_handoff_was_asked_of_it_since(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """Our take landed unanswered; before the retry the leader asked a handoff of us (to "c").
    The retry's failed condition finds the lease owner renamed and a checkpoint owner: still our
    take (it was judged lost, the lease left ours in the table while we thought it gone)."""
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    lease = dynamo.get_lease("shardId-0")
    assert lease is not None

    def leader_moves_it(_: float) -> None:  # between the attempts
        taken = dynamo.get_lease("shardId-0")
        assert taken is not None and taken.lease_owner == "b"
        assert dynamo.initiate_handoff(taken, "c") is not None

    faulty = FaultyClient(
        dynamodb_client, {"update_item": 1}, "InternalServerError", after_call=True
    )
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=leader_moves_it)  # type: ignore[arg-type]
    taken = table.take_lease(lease, "b")
    assert taken is not None
    assert (taken.actual_owner, taken.lease_owner, taken.lease_counter) == ("b", "c", 1)
    assert faulty.calls == {"update_item": 2}
    # A take of someone else's after the unknown outcome is still a lost race.
    faulty2 = FaultyClient(dynamodb_client, {"update_item": 1}, "InternalServerError")
    other = DynamoDBLeaseTable(faulty2, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    assert dynamo.take_lease(taken, "d") is not None
    assert other.take_lease(taken, "b") is None


def test_dynamodb_a_write_botocore_retried_into_a_throttle_after_it_landed_still_wins(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """A client with SDK retries: its first try landed unanswered, its last was throttled. Our
    retry's failed condition finds our own write: a win (it was taken for a refusal before any
    write, and the lease, renewed in the table, was dropped here)."""
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    lease = dynamo.get_lease("shardId-0")
    assert lease is not None
    faulty = FaultyClient(dynamodb_client, {"update_item": 1},
                          "ProvisionedThroughputExceededException", hidden_retry=True)  # fmt: skip
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    assert table.renew_lease(lease) == replace(lease, lease_counter=1)
    assert faulty.calls == {"update_item": 2}


@pytest.mark.parametrize("operation", ["renew", "take", "evict", "create", "delete", "record"])
def test_dynamodb_a_write_botocore_retried_after_it_landed_still_wins(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any, operation: str
) -> None:
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON, lease_owner="a"))
    dynamo.put_record(CoordinationRecord("leader", "a", 1, 10.0), None)
    lease = dynamo.get_lease("shardId-0")
    assert lease is not None
    op = {"create": "put_item", "record": "put_item", "delete": "delete_item"}
    faulty = FaultyClient(dynamodb_client, {op.get(operation, "update_item"): 1}, hidden_retry=True)
    table = DynamoDBLeaseTable(faulty, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    if operation == "renew":
        assert table.renew_lease(lease) == replace(lease, lease_counter=1)
    elif operation == "take":
        taken = table.take_lease(lease, "b")
        assert taken == replace(lease, lease_owner="b", lease_counter=1,
                                owner_switches_since_checkpoint=1)  # fmt: skip
    elif operation == "evict":
        assert table.evict_lease(lease) == replace(lease, lease_owner=None, lease_counter=1)
    elif operation == "create":
        assert table.create_lease_if_absent(Lease("shardId-1", TRIM_HORIZON)) is True
    elif operation == "delete":
        assert table.delete_lease(lease) is True
    else:
        assert table.put_record(CoordinationRecord("leader", "b", 2, 20.0), 1) is True
    assert sum(faulty.calls.values()) == 1  # one call from our side; no extra read


class AnswersLost:
    """Wraps a real client: of the next ``left`` UpdateItems, the first is applied and then
    answered with a 500, the rest fail before reaching the table, so the store gives up without
    ever hearing that its write landed (a timeout that outlasts every retry)."""

    def __init__(self, real: Any, left: int) -> None:
        self._real = real
        self.left = left
        self._applied = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name != "update_item":
            return method

        def call(**kwargs: Any) -> Any:
            if self.left <= 0:
                return method(**kwargs)
            self.left -= 1
            if not self._applied:
                self._applied = True
                method(**kwargs)
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "x"}}, name)

        return call


def test_dynamodb_a_holder_keeps_a_lease_whose_checkpoint_landed_unheard(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """The store gave up on a checkpoint write that DynamoDB had applied, and put the write's stamp
    on its error. The next renewal loses its condition on our own write, reads the lease, finds
    our owner, the next counter and that stamp, and goes on from it: the lease stays held and the
    checkpoint stays where it landed."""
    dynamo.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    first = dynamo.get_lease("shardId-0")
    assert first is not None
    taken = dynamo.take_lease(first, "worker-a")
    assert taken is not None
    lossy = AnswersLost(dynamodb_client, FAST.max_attempts)
    table = DynamoDBLeaseTable(lossy, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    holder = LeaseHolder(table, "worker-a", ManualClock(), 10.0)
    held = holder.add_taken(taken)
    position = ExtendedSequenceNumber(SEQ)
    with pytest.raises(DependencyError) as raised:
        holder.update("shardId-0", held.token, lambda x: table.update_checkpoint(x, position))
    assert lossy.left == 0
    landed = dynamo.get_lease("shardId-0")
    assert landed is not None and landed.checkpoint == position
    assert raised.value.sent_stamp == landed.written  # how the holder knows its own write
    report = holder.renew_all(wait=10)
    assert report.renewed == ("shardId-0",) and report.lost == ()
    after = dynamo.get_lease("shardId-0")
    assert after is not None and after.lease_owner == "worker-a"
    assert after.checkpoint == position and after.lease_counter == 3
    holder.close()


def test_dynamodb_owner_index_lists_an_owners_leases(dynamo: DynamoDBLeaseTable) -> None:
    for i, owner in enumerate(["a", "b", "a", None]):
        dynamo.create_lease_if_absent(Lease(f"shardId-{i}", TRIM_HORIZON, lease_owner=owner))
    assert sorted(dynamo.list_lease_keys_by_owner("a")) == ["shardId-0", "shardId-2"]
    assert dynamo.list_lease_keys_by_owner("nobody") == []


def test_dynamodb_scans_paginate(dynamo: DynamoDBLeaseTable, dynamodb_client: Any) -> None:
    big_state = b"x" * 300_000  # ~3 items per 1 MB scan page
    for i in range(8):
        dynamo.create_lease_if_absent(
            Lease(f"shardId-{i}", TRIM_HORIZON, pending_checkpoint=ExtendedSequenceNumber(SEQ),
                  pending_checkpoint_state=big_state)
        )  # fmt: skip
    page = dynamodb_client.scan(TableName=dynamo.table_name)
    assert "LastEvaluatedKey" in page  # the table really needs several pages
    assert len(dynamo.list_leases()) == 8


class SecondPageThrottled:
    """Wraps a real client: the first Scan call that asks for a later page is throttled."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.first_pages = 0
        self.throttled = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name != "scan":
            return method

        def scan(**kwargs: Any) -> Any:
            if "ExclusiveStartKey" not in kwargs:
                self.first_pages += 1
            elif not self.throttled:
                self.throttled = True
                code = "ProvisionedThroughputExceededException"
                raise ClientError({"Error": {"Code": code, "Message": "injected"}}, "Scan")
            return method(**kwargs)

        return scan


def test_dynamodb_a_failed_scan_page_is_asked_again_not_the_pages_before_it(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any
) -> None:
    """A throttled page sent the whole scan back to its first page (the read units spent again
    on the pages read, at each retry)."""
    for i in range(8):
        dynamo.create_lease_if_absent(
            Lease(f"shardId-{i}", TRIM_HORIZON, pending_checkpoint=ExtendedSequenceNumber(SEQ),
                  pending_checkpoint_state=b"x" * 300_000)
        )  # fmt: skip
    client = SecondPageThrottled(dynamodb_client)
    table = DynamoDBLeaseTable(client, dynamo.table_name, retry=FAST, sleep=no_sleep)  # type: ignore[arg-type]
    assert sorted(lease.lease_key for lease in table.list_leases()) == [
        f"shardId-{i}" for i in range(8)
    ]
    assert client.throttled and client.first_pages == 1


@pytest.mark.parametrize(
    ("counter", "at", "expected"),
    [
        ({"N": "4"}, {"N": "1700000000.25"}, 1_700_000_000.25),
        ({"N": "3"}, {"N": "1700000000.25"}, None),  # names another counter: a KCL write since
        (None, {"N": "1700000000.25"}, None),
        ({"N": "4"}, None, None),
        ({"S": "4"}, {"N": "1700000000.25"}, None),
        ({"N": "4.5"}, {"N": "1700000000.25"}, None),
        ({"N": "4"}, {"S": "soon"}, None),
    ],
)
def test_dynamodb_a_missing_or_malformed_write_stamp_is_ignored_not_corrupt(
    counter: Any, at: Any, expected: float | None
) -> None:
    item: dict[str, Any] = {
        "leaseKey": {"S": "shardId-0"}, "leaseCounter": {"N": "4"}, "checkpoint": {"S": SEQ},
    }  # fmt: skip
    for name, value in (("kclpySparkWrittenCounter", counter), ("kclpySparkWrittenAt", at)):
        if value is not None:
            item[name] = value
    assert dynamo_codec.lease_from_item(item).write_time == expected


def test_sqlite_a_database_with_a_newer_versions_columns_is_used_as_it_is(tmp_path: Path) -> None:
    """A newer version added a column: this one keeps using the file (a rolling downgrade, or an
    older worker restarting next to a newer one) and leaves that column alone."""
    path = tmp_path / "newer.db"
    store = open_sqlite(path, namespace="app")
    store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE kclpy_spark_leases ADD COLUMN from_the_future TEXT")
        conn.execute("UPDATE kclpy_spark_leases SET from_the_future = 'kept'")
    again = open_sqlite(path, namespace="app")
    taken = again.take_lease(again.get_lease("shardId-0"), "a")  # type: ignore[arg-type]
    assert taken is not None and taken.lease_owner == "a"
    again.create_lease_if_absent(Lease("shardId-1", TRIM_HORIZON))
    assert [x.lease_key for x in again.list_leases()] == ["shardId-0", "shardId-1"]
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT from_the_future FROM kclpy_spark_leases ORDER BY lease_key"
        ).fetchall() == [("kept",), (None,)]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"S": "1700000000.5 42 7 worker a"}, OwnerFigures("worker a", 1_700_000_000.5, 42, 7)),
        ({"S": "1700000000.5 42 - w"}, OwnerFigures("w", 1_700_000_000.5, 42, None)),
        ({"S": "1700000000.5 4.5 7 w"}, None),
        ({"S": "nan 1 2 w"}, None),
        ({"S": "1 2 3"}, None),
        ({"N": "42"}, None),
        (None, None),
    ],
)
def test_dynamodb_missing_or_malformed_owner_figures_are_ignored_not_corrupt(
    value: Any, expected: OwnerFigures | None
) -> None:
    item: dict[str, Any] = {
        "leaseKey": {"S": "shardId-0"}, "leaseCounter": {"N": "4"}, "checkpoint": {"S": SEQ},
    }  # fmt: skip
    if value is not None:
        item[dynamo_codec.FIGURES] = value
    assert dynamo_codec.lease_from_item(item).figures == expected


class EatsUpdates:
    """A DynamoDB client behind a broken proxy: its next ``eat`` UpdateItem calls are answered
    200 ``{}`` (``land``: after the real call was made) instead of the real answer."""

    def __init__(self, inner: Any, eat: int, *, land: bool) -> None:
        self._inner, self.eat, self.land = inner, eat, land

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def update_item(self, **kw: Any) -> Any:
        if self.eat <= 0:
            return self._inner.update_item(**kw)
        self.eat -= 1
        if self.land:
            self._inner.update_item(**kw)
        return {}


@pytest.mark.parametrize("land", [False, True])
def test_dynamodb_a_200_without_the_written_item_is_asked_again(
    dynamodb_client: Any, unique_name: str, land: bool
) -> None:
    """#49's poor list: a fake 200 from UpdateItem (a KeyError on 'Attributes', records
    redelivered while ready). Now a malformed answer: retried, and judged as after a timeout
    (an earlier attempt that landed counts, once)."""
    real = DynamoDBLeaseTable(dynamodb_client, unique_name, retry=FAST, sleep=no_sleep)
    real.ensure_table()
    try:
        real.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
        taken = real.take_lease(real.list_leases()[0], "w1")
        assert taken is not None
        client = EatsUpdates(dynamodb_client, 2, land=land)
        store = DynamoDBLeaseTable(client, unique_name, retry=FAST, sleep=no_sleep)
        moved = store.update_checkpoint(taken, ExtendedSequenceNumber(SEQ))
        assert moved is not None and moved.checkpoint == ExtendedSequenceNumber(SEQ)
        assert client.eat == 0
        stored = real.get_lease("shardId-0")
        assert stored is not None and stored.checkpoint == ExtendedSequenceNumber(SEQ)
        assert stored.lease_counter == taken.lease_counter + 1  # written once
    finally:
        dynamodb_client.delete_table(TableName=unique_name)


def test_dynamodb_coordination_table_missing_with_creation_disabled_is_named(
    dynamodb_client: Any, unique_name: str
) -> None:
    """An upgrade from a version that kept its records in the lease table, with the tables
    made by hand (create_lease_table = false): one line naming the table to create; the
    records that version left in the lease table are no leases to this one, and only a stream's
    identity is still read from there (the recreated-stream check)."""
    DynamoDBLeaseTable(dynamodb_client, unique_name).ensure_table()
    records = f"{unique_name}-KclpySparkState"
    try:
        dynamodb_client.delete_table(TableName=records)
        for key, data in (("shard-sync-leader", "{}"), ("stream/s", '{"created": 5.0}')):
            dynamodb_client.put_item(TableName=unique_name, Item={
                "leaseKey": {"S": f"__kclpy_spark__/{key}"},
                "entityType": {"S": "KCLPY_SPARK_COORDINATION"},
                "kclpySparkKey": {"S": key}, "kclpySparkVersion": {"N": "3"},
                "kclpySparkExpiresAt": {"N": "1"}, "kclpySparkData": {"S": data},
            })  # fmt: skip
        table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
        with pytest.raises(ResourceNotFoundError, match=f"coordination table '{records}'"):
            table.ensure_table()
        assert table.list_leases() == []
        DynamoDBLeaseTable(dynamodb_client, unique_name).ensure_table()  # creation allowed
        assert table.get_record("shard-sync-leader") is None  # not the lease table's item
        legacy = table.get_record("stream/s")
        assert legacy is not None and legacy.data == '{"created": 5.0}'
        assert table.put_record(legacy, None)  # written anew: the coordination table's wins
        assert table.records.get_record("stream/s") == legacy
    finally:
        dynamodb_client.delete_table(TableName=unique_name)
        dynamodb_client.delete_table(TableName=records)


def test_dynamodb_a_missing_table_error_names_which_table(
    dynamo: DynamoDBLeaseTable, dynamodb_client: Any, unique_name: str
) -> None:
    """Health reports the table that is gone: the coordination table's loss is not reported as
    the lease table's (whose checkpoints would be lost with it)."""
    records = dynamo.records.table_name
    dynamodb_client.delete_table(TableName=records)
    with pytest.raises(ResourceNotFoundError) as gone:
        dynamo.get_record("shard-sync-leader")
    assert gone.value.resource == records
    assert dynamo.list_leases() == []  # the lease table still answers
    DynamoDBLeaseTable(dynamodb_client, unique_name).ensure_table()  # both again
    dynamodb_client.delete_table(TableName=unique_name)
    with pytest.raises(ResourceNotFoundError) as gone:
        dynamo.list_leases()
    assert gone.value.resource == unique_name
    DynamoDBLeaseTable(dynamodb_client, unique_name).ensure_table()  # for the fixture's teardown


def test_dynamodb_a_look_without_the_coordination_table_reads_no_records(
    dynamodb_client: Any, unique_name: str
) -> None:
    """``status`` on a KCL application's table that no kclpy-spark worker has run on: no
    coordination table, none created; leases read, records read as none, a record write fails
    naming the table. ``suspend``/``reset`` (create_records) create it."""
    DynamoDBLeaseTable(dynamodb_client, unique_name).ensure_table()
    records = f"{unique_name}-KclpySparkState"
    dynamodb_client.delete_table(TableName=records)
    look = DynamoDBLeaseTable(
        dynamodb_client, unique_name, create_if_missing=False, records_optional=True
    )
    look.ensure_table()
    assert records not in dynamodb_client.list_tables()["TableNames"]
    assert look.get_record("suspended") is None and look.scan_table("").records == ()
    record = CoordinationRecord("suspended", "cli", 1, 0.0, "{}")
    with pytest.raises(ResourceNotFoundError, match=f"coordination table '{records}'") as gone:
        look.put_record(record, None)
    assert gone.value.resource == records
    writer = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False,
                                create_records=True)  # fmt: skip
    writer.ensure_table()
    assert writer.put_record(record, None)
    assert records in dynamodb_client.list_tables()["TableNames"]
    dynamodb_client.delete_table(TableName=unique_name)


def test_dynamodb_a_scan_shows_the_workers_of_a_kcl_3_0_to_3_4_metrics_table(
    dynamo: DynamoDBLeaseTable,
    dynamodb_client: Any,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KCL 3.0-3.4 keep their workers' metrics in ``<application>-WorkerMetricStats`` (key
    ``wid``): looked for when the store opens, scanned with the lease table while it exists."""
    metrics = f"{unique_name}-WorkerMetricStats"
    assert not dynamo.kcl_metrics.present  # none when the fixture opened the store
    dynamodb_client.create_table(
        TableName=metrics, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "wid", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "wid", "AttributeType": "S"}],
    )  # fmt: skip
    try:
        dynamodb_client.get_waiter("table_exists").wait(TableName=metrics)
        for wid, lut in (("kcl-3-4-a", "1764000000"), ("kcl-3-4-b", "1764000007")):
            dynamodb_client.put_item(TableName=metrics, Item={
                "wid": {"S": wid}, "lut": {"N": lut}, "sts": {"M": {}}, "opr": {"M": {}},
            })  # fmt: skip
        # The store opened before the table existed looks for it again (every PROBE_EVERY
        # seconds; it looked once, at start, and never saw a KCL fleet started after it).
        assert dynamo.scan_table("").kcl_workers == ()  # not looked for again yet
        monkeypatch.setattr(dynamo_kcl_workers, "PROBE_EVERY", 0.0)
        assert len(dynamo.scan_table("").kcl_workers) == 2 and dynamo.kcl_metrics.present
        store = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
        store.ensure_table()
        assert sorted(store.scan_table("").kcl_workers, key=lambda s: s.worker_id) == [
            KclWorkerSighting("kcl-3-4-a", 1764000000.0),
            KclWorkerSighting("kcl-3-4-b", 1764000007.0),
        ]
    finally:
        dynamodb_client.delete_table(TableName=metrics)
    assert store.scan_table("").kcl_workers == ()  # deleted: looked for no more
    assert not store.kcl_metrics.present
