"""Lease-table writes made durable together (checkpoint/base/durability.py): a block's writes are
synced once per store at its end, a failed sync says so, and the SQLite store commits inside a
block without waiting for its disk (then syncs its log once), outside it with a wait each.
Also the retry loop's first attempt made without building the loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from checkpoint.base import durability
from checkpoint.base.durability import SyncError, deferred, durable_on_exit
from checkpoint.base.errors import DependencyError, InvalidStateError
from checkpoint.base.retry import RetryPolicy, call_with_retry
from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores import sqlite_pool
from checkpoint.stores.sqlite import SQLiteLeaseTable


class Store:
    def __init__(self, fail: int = 0) -> None:
        self.syncs = 0
        self.fail = fail  # how many syncs fail first

    def sync(self) -> None:
        self.syncs += 1
        if self.fail:
            self.fail -= 1
            raise DependencyError("disk says no")


def test_a_store_that_joins_a_block_is_synced_once_when_it_ends() -> None:
    a, b, outside = Store(), Store(), Store()
    assert deferred(outside) is False  # no block: the store waits for its disk itself
    with durable_on_exit():
        for _ in range(3):
            assert deferred(a) and deferred(b)
        with durable_on_exit():  # nested: the outermost syncs
            assert deferred(a)
        assert a.syncs == b.syncs == 0
    assert (a.syncs, b.syncs, outside.syncs) == (1, 1, 0)
    assert deferred(a) is False  # the block is over


def test_a_block_nobody_joined_syncs_nothing_and_blocks_are_per_thread() -> None:
    store, seen = Store(), []
    with durable_on_exit():
        thread = threading.Thread(target=lambda: seen.append(deferred(store)))
        thread.start()
        thread.join()
    assert seen == [False] and store.syncs == 0


def test_a_failed_sync_is_a_sync_error_no_retry_mends() -> None:
    """After a failed fsync the kernel may have dropped what it could not write: writing the
    same again and syncing does not make the first writes durable."""
    store = Store(fail=1)
    with pytest.raises(SyncError, match="disk says no") as caught, durable_on_exit():
        deferred(store)
    assert not caught.value.retriable and store.syncs == 1
    assert deferred(store) is False  # the block is closed even so


def test_an_interrupt_in_a_block_whose_sync_fails_stays_an_interrupt() -> None:
    failing = Store(fail=1)
    with pytest.raises(KeyboardInterrupt), durable_on_exit():
        deferred(failing)
        raise KeyboardInterrupt
    assert failing.syncs == 1


def test_a_body_that_raises_is_synced_and_its_error_kept_unless_the_sync_fails_too() -> None:
    store = Store()
    with pytest.raises(InvalidStateError), durable_on_exit():
        deferred(store)
        raise InvalidStateError("the body's")
    assert store.syncs == 1
    failing = Store(fail=1)
    with pytest.raises(SyncError) as caught, durable_on_exit():
        deferred(failing)
        raise InvalidStateError("the body's")
    assert isinstance(caught.value.__cause__, InvalidStateError)


def _lease(store: SQLiteLeaseTable, key: str) -> Lease:
    store.create_lease_if_absent(Lease(key, TRIM_HORIZON))
    lease = store.get_lease(key)
    assert lease is not None
    taken = store.take_lease(lease, "worker-a")
    assert taken is not None
    return taken


def test_sqlite_commits_in_a_block_without_waiting_then_syncs_its_log_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write stays its own transaction (won at once, seen by another connection at once);
    inside a block it commits with synchronous=NORMAL, and the block's end syncs the log once.
    A write outside a block commits with FULL again."""
    store = SQLiteLeaseTable(tmp_path / "leases.db", namespace="app")
    store.ensure_table()
    leases = [_lease(store, f"shard-{i}") for i in range(3)]
    synced: list[str] = []
    real = sqlite_pool.os.fdatasync
    monkeypatch.setattr(sqlite_pool.os, "fdatasync", lambda fd: (synced.append("log"), real(fd)))
    levels = []
    with durable_on_exit():
        for i, lease in enumerate(leases):
            won = store.update_checkpoint(lease, ExtendedSequenceNumber(str(10 + i)), None)
            assert won is not None
            levels.append(_level_of_last_write(store))
            # Committed: another connection (another process) sees it before the block ends.
            other = SQLiteLeaseTable(tmp_path / "leases.db", namespace="app")
            seen = other.get_lease(lease.lease_key)
            other.close()
            assert seen is not None and seen.checkpoint == ExtendedSequenceNumber(str(10 + i))
        assert synced == []
    assert synced == ["log"] and levels == [1, 1, 1]
    again = store.get_lease("shard-0")
    assert again is not None
    assert store.update_checkpoint(again, ExtendedSequenceNumber("20"), None) is not None
    assert _level_of_last_write(store) == 2 and synced == ["log"]  # FULL: SQLite syncs itself
    with durable_on_exit():  # the pool notes a connection's level only while it is open
        assert store.update_checkpoint(again, ExtendedSequenceNumber("30"), None) is None
    assert len(store._pool._unsynced) == 1
    store.close()
    assert store._pool._unsynced == set() and store.open_connections == 0


def _level_of_last_write(store: SQLiteLeaseTable) -> int:
    conn = store._pool._idle[-1][0]  # the connection the write returned
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


def test_sqlite_syncs_the_log_beside_the_file_a_link_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite keeps the log beside the database file a symbolic link names, not beside the
    link: a sync that looked beside the link found none and synced nothing."""
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    store = SQLiteLeaseTable(tmp_path / "real" / "leases.db", namespace="app")
    store.ensure_table()
    lease = _lease(store, "shard-0")
    store.close()
    (tmp_path / "links" / "leases.db").symlink_to(tmp_path / "real" / "leases.db")
    linked = SQLiteLeaseTable(tmp_path / "links" / "leases.db", namespace="app")
    synced: list[str] = []
    real = sqlite_pool.os.fdatasync
    monkeypatch.setattr(sqlite_pool.os, "fdatasync", lambda fd: (synced.append("log"), real(fd)))
    with durable_on_exit():
        assert linked.update_checkpoint(lease, ExtendedSequenceNumber("10"), None) is not None
    assert synced == ["log"] and (tmp_path / "real" / "leases.db-wal").exists()
    assert not (tmp_path / "links" / "leases.db-wal").exists()
    linked.close()


def test_sqlite_sync_of_a_log_gone_while_the_file_is_open_fails(tmp_path: Path) -> None:
    store = SQLiteLeaseTable(tmp_path / "leases.db", namespace="app")
    store.ensure_table()
    _lease(store, "shard-0")
    assert store.open_connections
    (tmp_path / "leases.db-wal").unlink()
    with pytest.raises(DependencyError, match="missing"):
        store.sync()
    store.close()


def test_sqlite_sync_without_a_log_has_nothing_to_do(tmp_path: Path) -> None:
    """The last connection to close copies the log into the database file and removes it."""
    store = SQLiteLeaseTable(tmp_path / "leases.db", namespace="app")
    store.ensure_table()
    store.close()
    assert not (tmp_path / "leases.db-wal").exists()
    store.sync()


def test_the_first_attempt_counts_against_the_retry_deadline() -> None:
    """The loop is built only after a first attempt failed: the time that attempt took still
    counts, so a call that used its time up is not tried again past ``max_elapsed``."""
    policy = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=5, max_elapsed=0.3,
                         attempt_timeout=0.1)  # fmt: skip
    calls = []

    def slow_then_fails() -> None:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.25)
        raise DependencyError("busy")

    with pytest.raises(DependencyError):
        call_with_retry(slow_then_fails, what="a slow write", policy=policy, sleep=lambda s: None)
    assert len(calls) == 1  # 0.25 s spent + an attempt's 0.1 s is past 0.3 s


def test_retries_count_the_first_attempt_and_a_success_needs_no_loop() -> None:
    policy = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=3)
    failures = [DependencyError("a"), DependencyError("b"), DependencyError("c")]
    sleeps: list[float] = []

    def fails() -> int:
        raise failures.pop(0)

    with pytest.raises(DependencyError, match="c"):
        call_with_retry(fails, what="w", policy=policy, sleep=sleeps.append)
    assert failures == [] and len(sleeps) == 2  # three attempts, the first one's error included
    assert call_with_retry(lambda: 7, what="w", policy=policy) == 7
    attempts = []

    def broken() -> None:
        attempts.append(1)
        raise InvalidStateError("x")

    with pytest.raises(InvalidStateError):  # not retriable: one attempt
        call_with_retry(broken, what="w", policy=policy, sleep=sleeps.append)
    assert attempts == [1] and len(sleeps) == 2


def test_the_module_keeps_no_block_after_use() -> None:
    with durable_on_exit():
        pass
    assert getattr(durability._scope, "stores", None) is None
