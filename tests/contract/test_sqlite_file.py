"""The embedded store stays on the file it opened, and says in one line why it cannot use one:
a later change of the working directory, a file removed or replaced under a running worker, and
files or folders this process may not write (run as another user: root ignores file modes)."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError, InvalidStateError, ResourceNotFoundError
from checkpoint.base.retry import RetryPolicy
from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from checkpoint.stores.sqlite import SQLiteLeaseTable

ONCE = RetryPolicy(max_attempts=1)
NOBODY = 65534


def test_a_relative_path_keeps_naming_the_file_it_was_opened_on(tmp_path: Path) -> None:
    """The default is relative (``.kclpy-spark/leases.db``): a processor or library that
    changes the working directory sent the next new connection to another, empty file."""
    first, other = tmp_path / "a", tmp_path / "b"
    first.mkdir(), other.mkdir()
    old = os.getcwd()
    os.chdir(first)
    try:
        store = SQLiteLeaseTable(".kclpy-spark/leases.db", namespace="app")
        store.ensure_table()
        assert store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
        store.close()  # what the pool does itself to a connection idle for 30 s
        os.chdir(other)
        assert store.get_lease("shardId-0") is not None
    finally:
        os.chdir(old)
    assert not (other / ".kclpy-spark").exists()


def _old_worker(path: str, go: Any, out: Any) -> None:
    store = SQLiteLeaseTable(path, namespace="app", retry=ONCE)
    lease = store.take_lease(store.get_lease("shardId-0"), "old")  # its connection stays pooled
    out.put("took")
    go.get(timeout=60)  # meanwhile the file is removed and a new worker starts
    try:
        out.put("renewed" if store.renew_lease(lease) is not None else "lost")
    except Exception as exc:
        out.put(type(exc).__name__)


def test_a_removed_file_stops_the_worker_that_used_it(tmp_path: Path) -> None:
    """Its pooled connections wrote on in the unlinked file while a new worker took the same
    shards in a new one: two owners."""
    path = tmp_path / "leases.db"
    setup = SQLiteLeaseTable(path, namespace="app")
    setup.ensure_table()
    setup.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    setup.close()
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_old_worker, args=(str(path), go, out))
    proc.start()
    try:
        assert out.get(timeout=60) == "took"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)  # `rm -rf .kclpy-spark`
        new = SQLiteLeaseTable(path, namespace="app")  # a second worker starts
        new.ensure_table()
        new.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
        assert new.take_lease(new.get_lease("shardId-0"), "new") is not None
        go.put("go")
        assert out.get(timeout=60) == "InvalidStateError"  # the path names the new file
    finally:
        proc.join(60)


def test_a_replaced_file_is_refused_until_the_worker_restarts(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    store = SQLiteLeaseTable(path, namespace="app", retry=ONCE)
    store.ensure_table()
    store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
    backup = tmp_path / "backup.db"
    shutil.copy(path, backup)
    os.replace(backup, path)  # a restore from a backup, or a link moved by a deploy
    with pytest.raises(InvalidStateError, match="another file"):
        store.list_leases()
    store.close()
    assert SQLiteLeaseTable(path, namespace="app").list_leases()  # a new worker reads it
    path.unlink()
    with pytest.raises(ResourceNotFoundError, match="removed"):
        store.list_leases()


# -- permissions: a child process as another user -------------------------------------------------

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another user"
)


def _probe(path: str, create: bool, out: Any) -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    try:
        store = SQLiteLeaseTable(path, create_if_missing=create, retry=ONCE)
        store.ensure_table()  # every worker and operator command runs it first
        store.create_lease_if_absent(Lease("shardId-0", TRIM_HORIZON))
        out.put(("ok", None, ""))
    except Exception as exc:
        out.put((type(exc).__name__, getattr(exc, "retriable", None), str(exc)))


def _as_nobody(path: Path, *, create: bool = True) -> tuple[str, bool | None, str]:
    for parent in path.parents:  # let the other user walk to it
        if parent != Path("/") and parent.exists():
            os.chmod(parent, os.stat(parent).st_mode | 0o005)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_probe, args=(str(path), create, out))
    proc.start()
    try:
        return out.get(timeout=60)  # type: ignore[no-any-return]
    finally:
        proc.join(30)


def _made(folder: Path) -> Path:
    path = folder / "leases.db"
    store = SQLiteLeaseTable(path)
    store.ensure_table()
    store.close()
    os.chmod(folder, 0o777)
    return path


@needs_root
def test_a_read_only_file_is_a_config_error_at_start(tmp_path: Path) -> None:
    """SQLite opens such a file read-only without a word: the worker started, and every write
    was retried as a dependency that failed ("lease table unreachable")."""
    path = _made(tmp_path)
    os.chmod(path, 0o444)
    kind, retriable, text = _as_nobody(path)
    assert (kind, retriable) == ("ConfigError", False), text
    assert "readonly" in text


@needs_root
def test_a_file_without_permission_is_a_config_error_not_a_missing_table(tmp_path: Path) -> None:
    path = _made(tmp_path)
    os.chmod(path, 0o000)
    kind, retriable, text = _as_nobody(path, create=False)
    assert (kind, retriable) == ("ConfigError", False), text
    assert "not readable and writable" in text


@needs_root
def test_a_folder_it_cannot_make_is_a_config_error(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o555)
    kind, retriable, text = _as_nobody(tmp_path / "sub" / "leases.db")
    assert (kind, retriable) == ("ConfigError", False), text
    assert "cannot make its folder" in text


def test_a_file_system_without_the_write_ahead_log_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite leaves the journal mode as it was, without a word, where it cannot share memory
    between processes: scans then blocked renewals, and every batch's wait for the disk failed
    (no log to sync). SQLite's ``unix-none`` file system (no locking, so no shared memory) stands
    in for such a mount."""
    import checkpoint.stores.sqlite_pool as pool_module

    real_connect = pool_module.sqlite3.connect

    def connect(database: str, **kwargs: Any) -> Any:
        return real_connect(f"{database}&vfs=unix-none", **kwargs)

    monkeypatch.setattr(pool_module.sqlite3, "connect", connect)
    with pytest.raises(ConfigError, match=r"write-ahead log .*'delete'"):
        SQLiteLeaseTable(str(tmp_path / "leases.db")).ensure_table()
