"""SQLite connections for the lease store: a fixed-size pool, and sqlite3 errors in our hierarchy.

Connections are bounded by the pool's size, never by the threads that ever used the store: a
daemon that runs a writer thread per Spark batch, or asyncio's executor threads coming and going,
must not leave a connection (two file descriptors with WAL) behind per thread. A transaction
checks a connection out and returns it at once; SQLite serializes writers anyway, so a few
connections serve any number of threads. A thread that finds every connection busy waits at most
the busy timeout, then gets a retriable DependencyError, like a locked database.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from checkpoint.base.errors import (
    ConfigError,
    DependencyError,
    InvalidStateError,
    KclpySparkError,
    ResourceNotFoundError,
)

# How many connections one store object keeps at most. Writes are serialized by SQLite's lock and
# take milliseconds; four lets reads (WAL readers do not block) overlap a write.
POOL_SIZE = 4
# A connection not used for this long is closed when the pool is next used: the count follows
# the concurrency of the last half minute, not the highest since start (soak run 3: 2 -> 3).
IDLE_SECONDS = 30.0

# sqlite3.OperationalError messages, and what they mean here.
_OPERATIONAL_ERRORS: tuple[tuple[str, type[KclpySparkError]], ...] = (
    ("locked", DependencyError),  # another process holds the write lock past the busy timeout
    ("busy", DependencyError),
    ("interrupted", DependencyError),  # a statement stopped at its deadline
    ("no such table", ResourceNotFoundError),  # ensure_table() was not called
    ("readonly", ConfigError),  # "attempt to write a readonly database": file permissions
    ("unable to open", ResourceNotFoundError),
    ("no such column", InvalidStateError),
    ("has no column", InvalidStateError),
)


@contextmanager
def sqlite_errors(where: str) -> Iterator[None]:
    """Translate sqlite3 errors into this package's hierarchy; ``where`` names the database."""
    try:
        yield
    except KclpySparkError:
        raise
    except sqlite3.OperationalError as exc:
        text = str(exc)
        for needle, error in _OPERATIONAL_ERRORS:
            if needle in text:
                raise error(f"{where}: {text}") from exc
        raise DependencyError(f"{where}: {text}") from exc  # I/O errors, full disk
    except sqlite3.DatabaseError as exc:  # "file is not a database", corruption
        raise InvalidStateError(f"{where} is not a usable SQLite database: {exc}") from exc


class ConnectionPool:
    """At most ``size`` connections to ``path``, shared by every thread (one at a time each)."""

    def __init__(
        self,
        path: Path,
        *,
        create: bool,
        busy_timeout: float,
        size: int = POOL_SIZE,
        idle_seconds: float = IDLE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        # Absolute once: a later change of the working directory must not open another file.
        self._path = path.absolute()
        self._create = create
        # The file's (device, inode) once a connection opened it: every transaction after that
        # checks that the path still names that file. A file removed (and made again by a new
        # worker) or replaced under a running worker would otherwise leave it renewing its leases
        # in the old file while another worker takes them in the new one.
        self._identity: tuple[int, int] | None = None
        self._busy_timeout = busy_timeout
        self._size = size
        self._idle_seconds = idle_seconds
        self._monotonic = monotonic
        # Idle connections with the time each came back; the last came back last and is used
        # first, so the ones at the bottom are those nobody needed lately.
        self._idle: list[tuple[sqlite3.Connection, float]] = []
        self._open = 0
        # Connections whose commits do not wait for the disk now (synchronous=NORMAL); each of
        # the others commits with FULL.
        self._unsynced: set[sqlite3.Connection] = set()
        self._cond = threading.Condition()
        self.where = f"SQLite lease database {str(path)!r}"

    @property
    def open_connections(self) -> int:
        """Connections open now (idle or in use): never more than the pool's size."""
        with self._cond:
            return self._open

    @contextmanager
    def connection(self, *, synced: bool = True) -> Iterator[sqlite3.Connection]:
        """A connection for one transaction. ``synced``: its commit returns once on disk (FULL);
        False: once written to the log, not waiting for the disk (NORMAL), which ``sync_log``
        makes durable later."""
        conn = self._checkout()
        try:
            if synced and conn in self._unsynced:
                conn.execute("PRAGMA synchronous=FULL")
                self._unsynced.discard(conn)
            elif not synced and conn not in self._unsynced:
                conn.execute("PRAGMA synchronous=NORMAL")
                self._unsynced.add(conn)
            yield conn
        finally:
            self._checkin(conn)

    def sync_log(self) -> None:
        """Every commit so far on disk: the write-ahead log synced (commits not yet copied into
        the database file are there). SQLite keeps it beside the file a link names. No log:
        the last connection to close copied every commit into the database file and synced it
        (while one of ours is open, a log missing is an error)."""
        log_path = f"{os.path.realpath(self._path)}-wal"
        try:
            fd = os.open(log_path, os.O_RDONLY)
        except FileNotFoundError:
            if self.open_connections:
                raise DependencyError(f"{self.where}: its log {log_path} is missing") from None
            return
        except OSError as exc:
            raise DependencyError(f"{self.where}: cannot open its log to sync it: {exc}") from exc
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise DependencyError(f"{self.where}: syncing its log failed: {exc}") from exc
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the idle connections now; those in use come back to the pool and are closed
        when idle for ``idle_seconds`` (or at the next close). The pool stays usable: a later
        call opens new connections."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn, _ in idle:
            self._unsynced.discard(conn)
            conn.close()

    def _checkout(self) -> sqlite3.Connection:
        self._check_identity()
        deadline = time.monotonic() + self._busy_timeout
        with self._cond:
            while not self._idle and self._open >= self._size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DependencyError(
                        f"{self.where}: all {self._size} connections stayed busy for "
                        f"{self._busy_timeout:.1f}s"
                    )
                self._cond.wait(left)
            if self._idle:
                return self._idle.pop()[0]
            self._open += 1
        try:
            return self._connect()
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def _checkin(self, conn: sqlite3.Connection) -> None:
        broken = conn.in_transaction  # a failed ROLLBACK: do not hand the connection on
        now = self._monotonic()
        with self._cond:
            stale = [c for c, at in self._idle if now - at > self._idle_seconds]
            self._idle = [(c, at) for c, at in self._idle if now - at <= self._idle_seconds]
            if not broken:
                self._idle.append((conn, now))
            else:
                stale.append(conn)
            self._open -= len(stale)
            self._cond.notify_all()
        for old in stale:
            self._unsynced.discard(old)
            old.close()

    def _stat(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self._path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DependencyError(f"{self.where}: {exc.strerror}") from exc
        return found.st_dev, found.st_ino

    def _check_identity(self) -> None:
        if self._identity is None:
            return
        now = self._stat()
        if now == self._identity:
            return
        self.close()  # the idle connections name the old file
        if now is None:
            raise ResourceNotFoundError(f"{self.where} was removed while this worker used it")
        raise InvalidStateError(
            f"{self.where} now names another file than the one this worker opened "
            "(replaced, or a link moved): restart the worker to use it"
        )

    def _connect(self) -> sqlite3.Connection:
        # Only the first connection may create the file (and its folder): later ones open the
        # file the first one opened, or fail (_check_identity).
        create = self._create and self._identity is None
        if not create and not self._path.exists():
            raise ResourceNotFoundError(f"{self.where} does not exist")
        if create:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file where a folder should be, no permission
                raise ConfigError(
                    f"{self.where}: cannot make its folder: {exc.strerror} ({exc.filename})"
                ) from None
        uri = f"{self._path.as_uri()}?mode={'rwc' if create else 'rw'}"
        try:
            with sqlite_errors(self.where):
                conn = sqlite3.connect(
                    uri,
                    uri=True,
                    timeout=self._busy_timeout,
                    isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                    check_same_thread=False,  # pooled: used by one thread at a time, any thread
                )
                try:
                    mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
                    if not mode or str(mode[0]).lower() != "wal":
                        # Left as it was where the file system cannot share memory between
                        # processes (some network or overlay file systems): scans would block
                        # renewals, and a batch's wait for the disk syncs the write-ahead log.
                        raise ConfigError(
                            f"{self.where}: its file system does not take SQLite's write-ahead "
                            f"log (journal mode stays {mode[0] if mode else None!r}); put the "
                            "lease table on a local disk, or use DynamoDB"
                        )
                    # FULL: a commit that returned is on disk, even after a power cut, so a won
                    # checkpoint or take is never rolled back behind the worker's back.
                    conn.execute("PRAGMA synchronous=FULL")
                except BaseException:
                    conn.close()
                    raise
        except ResourceNotFoundError:
            self._refused()  # "unable to open": permissions, or a folder that is not there
            raise
        if self._identity is None:
            try:
                found = self._stat()
            except BaseException:
                conn.close()
                raise
            if found is None:  # removed right after it was opened: never made again here
                conn.close()
                raise ResourceNotFoundError(f"{self.where} was removed as it was opened")
            with self._cond:
                self._identity = self._identity or found
        return conn

    def _refused(self) -> None:
        """ConfigError if the file or its folder cannot be written by this process (SQLite says
        only "unable to open"; WAL needs to create files beside the database)."""
        folder = self._path.parent
        if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{self.where}: its folder {str(folder)!r} is not writable by us")
        if self._path.exists() and not os.access(self._path, os.R_OK | os.W_OK):
            raise ConfigError(f"{self.where}: the file is not readable and writable by us")
