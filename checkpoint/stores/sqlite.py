"""The SQLite lease table: the embedded, durable, single-machine default store.

One database file may hold several applications, told apart by the ``namespace`` column (the
application name, or any prefix the caller chooses). Several worker *processes* on one machine may
share the file: it runs in WAL mode with a busy timeout, and every conditional write is one
``UPDATE ... WHERE lease_key = ? AND lease_counter = ? [AND lease_owner IS ?]`` inside
``BEGIN IMMEDIATE``, so the row count says who won and the stored row is read back in the same
transaction. A write that fails rolls back whole, so a retried write never finds its own earlier
attempt. Connections come from a small fixed pool (sqlite_pool.py), never one per thread.
A commit waits for the disk (``synchronous=FULL``), except a write inside
``durability.durable_on_exit()``: committed without waiting, made durable with the block's
others by one sync of the write-ahead log when the block ends (``sync``).

Sequence numbers and hash keys are TEXT (they exceed 64-bit integers), shard-id sets JSON text.
``database is locked`` becomes a retriable DependencyError, retried by ``checkpoint.base.retry``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.base.durability import deferred
from checkpoint.base.errors import (
    InvalidStateError,
    ResourceNotFoundError,
)
from checkpoint.base.retry import (
    DEFAULT_CALL_BUDGET,
    LEASE_TABLE_POLICY,
    RetryPolicy,
    call_with_retry,
)
from checkpoint.lease import Lease, OwnerFigures, refuse_regression
from checkpoint.port import CoordinationRecord, TableScan
from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores.sqlite_pool import ConnectionPool, sqlite_errors
from checkpoint.stores.sqlite_rows import (
    ADDED_LEASE_COLUMNS,
    LEASE_COLUMNS,
    LEASE_TYPES,
    PROGRESS_COLUMNS,
    RECORD_COLUMNS,
    RECORD_TYPES,
    lease_from_row,
    lease_to_row,
    progress_values,
)

T = TypeVar("T")

LEASES = "kclpy_spark_leases"
RECORDS = "kclpy_spark_records"

_SCHEMA = [
    f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{c} {t}' for c, t in types.items())}, "
    f"PRIMARY KEY (namespace, {key}))"
    for table, types, key in ((LEASES, LEASE_TYPES, "lease_key"), (RECORDS, RECORD_TYPES, "key"))
]


class SQLiteLeaseTable:
    """Implements LeaseTable and CoordinationStore in one SQLite file (one namespace of it)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        namespace: str = "default",
        create_if_missing: bool = True,
        retry: RetryPolicy = LEASE_TABLE_POLICY,
        sleep: Callable[[float], None] = time.sleep,
        busy_timeout: float = DEFAULT_CALL_BUDGET.attempt,
        clock: Clock | None = None,
    ) -> None:
        """``retry`` and ``busy_timeout`` (how long an attempt waits for another process's write
        transaction, then fails as a retriable DependencyError) default to a budget that ends a
        call with its retries within half a lease of the KCL's default failover time."""
        self._path = Path(path)
        self._clock = clock or SystemClock()  # stamps the writes that move a counter
        self._busy_timeout = busy_timeout
        self._namespace = namespace
        self._create = create_if_missing
        self._retry = retry
        self._sleep = sleep
        self._pool = ConnectionPool(self._path, create=create_if_missing, busy_timeout=busy_timeout)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def _where(self) -> str:
        return f"SQLite lease database {str(self._path)!r}"

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def open_connections(self) -> int:
        """SQLite connections this store holds open now (bounded by its pool's size)."""
        return self._pool.open_connections

    def close(self) -> None:
        """Close the store's connections (a later call opens new ones)."""
        self._pool.close()

    def sync(self) -> None:
        """Every write committed so far on disk (the durability block's end): one sync of the
        write-ahead log, which holds each commit not yet copied into the database file."""
        self._pool.sync_log()

    # -- plumbing -------------------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        """One transaction; IMMEDIATE takes the write lock first, so its reads are current. A
        write inside a durability block commits without waiting for the disk (``sync``)."""
        synced = not (write and deferred(self))
        with sqlite_errors(self._where), self._pool.connection(synced=synced) as conn:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # a failed COMMIT leaves the transaction open
                    conn.execute("ROLLBACK")
                raise

    def _run(self, what: str, body: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """``body`` in one transaction, retried as a whole on retriable errors."""

        def attempt() -> T:
            with self._transaction(write=write) as conn:
                return body(conn)

        return call_with_retry(attempt, what=what, policy=self._retry, sleep=self._sleep)

    def _won(self, what: str, sql: str, args: tuple[Any, ...]) -> bool:
        """One conditional INSERT/UPDATE/DELETE of one row: True if it changed the row."""
        return self._run(what, lambda conn: conn.execute(sql, args).rowcount == 1, write=True)

    # -- table ----------------------------------------------------------------------------------

    def ensure_table(self) -> None:
        self._run(f"ensure_table {str(self._path)!r}", self._ensure_table, write=True)

    def check_table(self) -> None:
        """``ensure_table`` for a reader that writes nothing (``status``): the tables exist in
        this version's form, or a one-line error; a file it may only read is enough."""
        self._run(f"check_table {str(self._path)!r}", self._check_table, write=False)

    def _check_table(self, conn: sqlite3.Connection) -> None:
        for name, expected in ((LEASES, LEASE_COLUMNS), (RECORDS, RECORD_COLUMNS)):
            found = tuple(row[1] for row in conn.execute(f"PRAGMA table_info({name})"))
            if not found:
                raise ResourceNotFoundError(f"{self._where} has no lease tables")
            if found[: len(expected)] != expected:
                raise InvalidStateError(
                    f"{self._where}: table {name} has columns {list(found)}, expected "
                    f"{list(expected)} (a worker of this version adds the missing ones)"
                )

    def _ensure_table(self, conn: sqlite3.Connection) -> None:
        # A write that changes nothing: a file this process may read but not write fails here,
        # at start, not at the first renewal (SQLite opens such a file read-only, silently).
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute(f"PRAGMA user_version = {version}")
        found = {
            name: [row[1] for row in conn.execute(f"PRAGMA table_info({name})")]
            for name in (LEASES, RECORDS)
        }
        if not all(found.values()):
            if not self._create:
                raise ResourceNotFoundError(
                    f"{self._where} has no lease tables and creating them is disabled"
                )
            for statement in _SCHEMA:
                conn.execute(statement)
            return
        missing = LEASE_COLUMNS[len(found[LEASES]) :]
        if tuple(found[LEASES]) + missing == LEASE_COLUMNS and set(missing) <= set(
            ADDED_LEASE_COLUMNS
        ):
            for column in missing:
                conn.execute(f"ALTER TABLE {LEASES} ADD COLUMN {column} {LEASE_TYPES[column]}")
            found[LEASES] = list(LEASE_COLUMNS)
        for name, expected in ((LEASES, LEASE_COLUMNS), (RECORDS, RECORD_COLUMNS)):
            # Columns after ours were added by a newer version: every statement here names its
            # columns, so they are left alone (NULL in the rows we create).
            if tuple(found[name][: len(expected)]) != expected:
                raise InvalidStateError(
                    f"{self._where}: table {name} has columns "
                    f"{found[name]}, expected {list(expected)}"
                )

    # -- reads ----------------------------------------------------------------------------------

    def _select(self, conn: sqlite3.Connection, lease_key: str | None = None) -> list[Lease]:
        sql = f"SELECT {', '.join(LEASE_COLUMNS)} FROM {LEASES} WHERE namespace = ?"
        args: tuple[str, ...] = (self._namespace,)
        if lease_key is not None:
            sql += " AND lease_key = ?"
            args += (lease_key,)
        return [lease_from_row(row) for row in conn.execute(sql + " ORDER BY lease_key", args)]

    def list_leases(self) -> list[Lease]:
        return self._run("list leases", self._select, write=False)

    def scan_table(self, record_prefix: str) -> TableScan:
        sql = (
            f"SELECT {_RECORD_FIELDS} FROM {RECORDS} WHERE namespace = ? AND substr(key, 1, ?) = ?"
        )
        args = (self._namespace, len(record_prefix), record_prefix)

        def body(conn: sqlite3.Connection) -> TableScan:  # one transaction: one view
            rows = conn.execute(sql, args).fetchall()
            return TableScan(tuple(self._select(conn)), tuple(_record(row) for row in rows))

        return self._run("scan the lease table", body, write=False)

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        sql = f"SELECT lease_key FROM {LEASES} WHERE namespace = ? AND lease_owner = ?"
        return self._run(
            f"list leases of {owner!r}",
            lambda conn: [row[0] for row in conn.execute(sql, (self._namespace, owner))],
            write=False,
        )

    def get_lease(self, lease_key: str) -> Lease | None:
        found = self._run(
            f"get lease {lease_key!r}", lambda conn: self._select(conn, lease_key), write=False
        )
        return found[0] if found else None

    def is_empty(self) -> bool:
        sql = f"SELECT 1 FROM {LEASES} WHERE namespace = ? LIMIT 1"
        return self._run(
            "is_empty",
            lambda conn: conn.execute(sql, (self._namespace,)).fetchone() is None,
            write=False,
        )

    # -- conditional writes ---------------------------------------------------------------------

    def create_lease_if_absent(self, lease: Lease) -> bool:
        row = lease_to_row(self._namespace, lease)
        marks = ", ".join("?" * len(LEASE_COLUMNS))
        sql = f"INSERT OR IGNORE INTO {LEASES} ({', '.join(LEASE_COLUMNS)}) VALUES ({marks})"
        return self._won(f"create lease {lease.lease_key!r}", sql, row)

    def _conditional_update(
        self,
        what: str,
        lease: Lease,
        assignments: str,
        args: tuple[Any, ...],
        *,
        check_owner: bool,
        check_checkpoint: bool = False,
        check_handoff: bool = False,
    ) -> Lease | None:
        """``UPDATE ... SET <assignments>, counter + 1`` where counter (and actual owner, and
        checkpoint; and with ``check_handoff`` lease and checkpoint owner both) are ``lease``'s;
        the stored lease if the update won, None if it lost. The write is stamped (the new
        counter and this write's wall time; SQLite's right-hand sides see the row before it)."""
        sql = (
            f"UPDATE {LEASES} SET {assignments}written_counter = lease_counter + 1, "
            "written_at = ?, lease_counter = lease_counter + 1 "
            "WHERE namespace = ? AND lease_key = ? AND lease_counter = ?"
        )
        args = (*args, self._clock.wall())
        where: tuple[Any, ...] = (self._namespace, lease.lease_key, lease.lease_counter)
        if check_owner:
            sql += " AND COALESCE(checkpoint_owner, lease_owner) IS ?"
            where += (lease.actual_owner,)
        if check_handoff:
            sql += " AND lease_owner IS ? AND checkpoint_owner IS ?"
            where += (lease.lease_owner, lease.checkpoint_owner)
        if check_checkpoint:
            sql += " AND checkpoint IS ? AND COALESCE(checkpoint_sub, 0) = ?"
            where += (lease.checkpoint.sequence_number, lease.checkpoint.sub_sequence_number)

        def body(conn: sqlite3.Connection) -> Lease | None:
            if conn.execute(sql, args + where).rowcount != 1:
                return None
            # Decoded inside the transaction: a corrupt result rolls the write back.
            return self._select(conn, lease.lease_key)[0]

        return self._run(f"{what} lease {lease.lease_key!r}", body, write=True)

    def renew_lease(self, lease: Lease) -> Lease | None:
        if lease.actual_owner is None:
            return None  # nobody holds it: nothing to renew
        measured = lease.renewal_figures()  # column names; those not measured keep their value
        values = [v.encode() if isinstance(v, OwnerFigures) else v for v in measured.values()]
        assignments = "".join(f"{name} = ?, " for name in measured)
        return self._conditional_update(
            "renew", lease, assignments, tuple(values), check_owner=True
        )

    def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        # From the caller's view, as the KCL's takeLease and the DynamoDB store count (a hand-off
        # keeps the counter, so the view may name the owner before it); only from one owner to
        # another, not from unowned.
        switched = lease.lease_owner is not None and lease.lease_owner != owner
        switches = lease.owner_switches_since_checkpoint + switched
        assignments = "owner_switches = ?, lease_owner = ?, checkpoint_owner = NULL, "
        return self._conditional_update(
            f"take ({owner!r})", lease, assignments, (switches, owner), check_owner=False
        )

    def evict_lease(self, lease: Lease) -> Lease | None:
        # Mid-handoff only the checkpoint owner goes: the lease passes to the new owner at once.
        gone = "checkpoint_owner" if lease.handoff_pending else "lease_owner"
        return self._conditional_update(
            "evict", lease, f"{gone} = NULL, ", (), check_owner=True, check_handoff=True
        )

    def initiate_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        if lease.lease_owner is None:
            return None
        sql = (
            f"UPDATE {LEASES} SET checkpoint_owner = lease_owner, lease_owner = ? "
            "WHERE namespace = ? AND lease_key = ? AND lease_owner = ? "
            "AND checkpoint_owner IS NULL"
        )
        args = (new_owner, self._namespace, lease.lease_key, lease.lease_owner)

        def body(conn: sqlite3.Connection) -> Lease | None:
            if conn.execute(sql, args).rowcount != 1:
                return None
            return self._select(conn, lease.lease_key)[0]

        return self._run(f"hand over lease {lease.lease_key!r}", body, write=True)

    def complete_handoff(self, lease: Lease) -> Lease | None:
        if lease.checkpoint_owner is None:
            return None
        assignments = "checkpoint_owner = NULL, owner_switches = owner_switches + 1, "
        return self._conditional_update(
            "complete the handoff of", lease, assignments, (), check_owner=False,
            check_handoff=True,
        )  # fmt: skip

    def update_lease(self, lease: Lease) -> Lease | None:
        return self._write_progress("update", lease, lease)

    def _write_progress(
        self, what: str, lease: Lease, new: Lease, *, check_checkpoint: bool = False
    ) -> Lease | None:
        assignments = "".join(f"{name} = ?, " for name in PROGRESS_COLUMNS)
        return self._conditional_update(
            what,
            lease,
            assignments,
            progress_values(new),
            check_owner=True,
            check_checkpoint=check_checkpoint,
        )

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        refuse_regression(lease, checkpoint)
        new = lease.checkpointed(checkpoint, pending)
        return self._write_progress("checkpoint", lease, new, check_checkpoint=True)

    def delete_lease(self, lease: Lease) -> bool:
        sql = f"DELETE FROM {LEASES} WHERE namespace = ? AND lease_key = ? AND lease_counter = ?"
        args = (self._namespace, lease.lease_key, lease.lease_counter)
        return self._won(f"delete lease {lease.lease_key!r}", sql, args)

    # -- coordination records -------------------------------------------------------------------

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        sql = f"SELECT {_RECORD_FIELDS} FROM {RECORDS} WHERE namespace = ? AND key = ?"
        row = self._run(
            f"get record {key!r}",
            lambda conn: conn.execute(sql, (self._namespace, key)).fetchone(),
            write=False,
        )
        return None if row is None else _record(row)

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        values = (record.owner, record.version, record.expires_at, record.data, self._namespace)
        if expected_version is None:
            sql = (
                f"INSERT OR IGNORE INTO {RECORDS} (owner, version, expires_at, data, namespace, "
                "key) VALUES (?, ?, ?, ?, ?, ?)"
            )
            args: tuple[Any, ...] = (*values, record.key)
        else:
            sql = (
                f"UPDATE {RECORDS} SET owner = ?, version = ?, expires_at = ?, data = ? "
                "WHERE namespace = ? AND key = ? AND version = ?"
            )
            args = (*values, record.key, expected_version)
        return self._won(f"put record {record.key!r}", sql, args)

    def delete_record(self, key: str, expected_version: int) -> bool:
        sql = f"DELETE FROM {RECORDS} WHERE namespace = ? AND key = ? AND version = ?"
        return self._won(f"delete record {key!r}", sql, (self._namespace, key, expected_version))


_RECORD_FIELDS = "key, owner, version, expires_at, data"


def _record(row: tuple[Any, ...]) -> CoordinationRecord:
    return CoordinationRecord(
        key=row[0], owner=row[1], version=int(row[2]), expires_at=float(row[3]), data=row[4]
    )
