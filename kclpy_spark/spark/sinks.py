"""Built-in idempotent sinks and the dead-letter directory.

Idempotency is per piece (one lease's range in a batch, see pieces.py), so a replayed piece is
never written twice even when it comes back in a batch of another composition:

* ``ParquetSink(path)``: Spark writes the batch under ``path/_staging/...`` partitioned by piece
  (one Spark job), then each piece's folder is renamed to ``path/kcl_piece=<piece id>``. A rename
  is atomic and fails if the folder exists, so a reader sees a piece whole or not at all, and a
  replayed piece is skipped. ``spark.read.parquet(path)`` reads every record once (plus a
  ``kcl_piece`` column). Needs a POSIX path that the driver (which renames) and the executors
  (which write) share: local on ``local[N]``, or a shared mount. Readers ignore ``_staging``
  (names starting with ``_``). Durable before acknowledged: every file of a piece and its folder
  are fsynced before the rename, and the parent folder after it, so a piece whose checkpoint moved
  survives an OS crash or power loss (on a local filesystem; a network mount promises what its
  fsync does). Staging folders a crashed writer left behind are removed when they are older than
  ``stale_staging`` seconds (at start and every hundred batches).
* ``DeltaSink(path)``: the deltalake package (delta-rs) appends from the driver, one commit per
  batch carrying one application transaction per lease: app id ``<prefix>:<lease key>`` (the
  daemon's prefix names its application: ``<delta_app_id_prefix>:<application_name>``), version
  = the lease's previous version + 1, chosen in ``prepare`` and stored with the pending checkpoint,
  so a replayed piece finds its version already committed and is skipped. One batch of a lease
  is in flight at a time (``ordered_per_lease``): versions must commit in order. Each transaction
  carries its commit time; with ``txn_retention_days`` the table the sink creates gets Delta's
  ``delta.setTransactionRetentionDuration``, so the ids of leases gone (a reshard's parents)
  leave it instead of staying for ever. A lease's id then lasts that long after its last write:
  a piece re-formed from a pending checkpoint later than that is written again.
* ``DeadLetterDirectory(path)``: a failed batch as ``batch-<id>[-<sink>].parquet`` (pyarrow),
  with the error and the pieces in the file's metadata; the file and the folder are fsynced before
  the batch counts as handled (its checkpoint moves after that).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.spark import local_fs, paths
from kclpy_spark.spark.pieces import Piece
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.timed_write import HUNG_GRACE

log = logging.getLogger(__name__)

PIECE_COLUMN = "kcl_piece"
_INDEX_COLUMN = "kcl_piece_index"
# A staging folder untouched this long belongs to a writer that died (a live write renames its
# folders within write_timeout, 10 minutes by default): at least an hour, and longer than twice a
# longer write_timeout (``stale_staging_after``), so that no cleanup, this worker's or another's,
# removes the folder of a write still under way.
STALE_STAGING_SECONDS = 3600.0
# A dead-letter write's temporary file untouched this long was left by a write cut short.
STALE_TMP_SECONDS = 3600.0


def stale_staging_after(write_timeout: float) -> float:
    """How old a staging folder must be to be taken for a dead writer's, with ``write_timeout``."""
    return max(STALE_STAGING_SECONDS, 2 * write_timeout + HUNG_GRACE)


_CLEAN_EVERY = 100  # batches between two looks for stale staging folders
# Parquet's writer builds a dictionary for every column, hashing and comparing every value, and
# drops it at the end of a page when it did not make the page smaller: wasted on columns whose
# values seldom repeat. Sequence numbers are unique, payloads nearly always are, and partition
# keys often are (random keys are the usual advice for spreading records over shards); a plain
# column of low-cardinality keys costs little next to the payloads. The repeating columns (stream,
# shard, sub-sequence number, arrival time) keep theirs. Measured on the whole path (JFR): the
# dictionaries were 19% of the JVM's samples with every column's on, 13% with only unique
# partition keys' left.
WRITE_OPTIONS = {
    "parquet.enable.dictionary#sequence_number": "false",
    "parquet.enable.dictionary#partition_key": "false",
    "parquet.enable.dictionary#data": "false",
}


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync one file or folder (a folder's entries: a rename or a new file in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every folder, deepest first."""
    folders: list[Path] = []
    for here, _, files in os.walk(root):
        folders.append(Path(here))
        for name in files:
            fsync_path(Path(here) / name)
    for folder in reversed(folders):
        fsync_path(folder)


def _local_path(path: str | os.PathLike[str], what: str) -> Path:
    text = os.fspath(path)
    local = paths.local_path(text)
    if local is None:
        raise ValueError(f"{what} needs a local or mounted path, got {text!r}")
    return local


class ParquetSink:
    idempotent_per_piece = True  # a piece's folder is renamed into place once

    def __init__(
        self, path: str | os.PathLike[str], *, stale_staging: float = STALE_STAGING_SECONDS
    ) -> None:
        self.path = _local_path(path, "ParquetSink")
        self._stale_staging = stale_staging
        self._writes = 0
        self._count_lock = threading.Lock()  # writer threads count writes together
        self.clean_staging()

    def clean_staging(self, now: float | None = None) -> list[Path]:
        """Remove staging folders older than ``stale_staging`` (left by crashed writers);
        returns what was removed. A folder of a write still under way is younger."""
        staging = self.path / "_staging"
        if not staging.is_dir():
            return []
        now = time.time() if now is None else now
        removed = []
        for folder in staging.iterdir():
            try:
                stale = now - folder.stat().st_mtime > self._stale_staging
            except FileNotFoundError:
                continue  # its writer just published or removed it
            if stale:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
                log.warning("removed a staging folder left by a crashed writer: %s", folder)
        return removed

    def __repr__(self) -> str:
        return f"ParquetSink({str(self.path)!r})"

    def piece_dir(self, piece: Piece) -> Path:
        return self.path / f"{PIECE_COLUMN}={piece.piece_id}"

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def write(self, batch: SinkBatch) -> None:
        with self._count_lock:
            self._writes += 1
            clean = self._writes % _CLEAN_EVERY == 0
        if clean:
            self.clean_staging()
        todo: list[Piece] = []
        written: list[Piece] = []
        for piece in batch.pieces:
            (written if self.piece_dir(piece).exists() else todo).append(piece)
        if written:
            log.info("batch %d: %d piece(s) already written; skipped",
                     batch.batch_id, len(written))  # fmt: skip
            self._make_durable(written)
        if not todo:
            return
        staging = self.path / "_staging" / f"{batch.batch_id:016x}-{uuid.uuid4().hex[:8]}"
        try:
            if len(todo) == 1:  # no partitioning (and no sort) for a single piece
                target = staging / f"{PIECE_COLUMN}={todo[0].piece_id}"
                df = batch.frame(todo)
                _writer(df).parquet(str(target))
                self._publish([(target, self.piece_dir(todo[0]))])
            else:
                # Partitioned by a small int (the piece's index here), not by the id string:
                # measured 12% faster; the folders get their id names when published.
                df = batch.frame(todo, index_column=_INDEX_COLUMN)
                _writer(df).partitionBy(_INDEX_COLUMN).parquet(str(staging))
                self._publish([(staging / f"{_INDEX_COLUMN}={i}", self.piece_dir(piece))
                               for i, piece in enumerate(todo)])  # fmt: skip
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _make_durable(self, written: Sequence[Piece]) -> None:
        """Pieces found in place: a write a crash cut short between its rename and the fsync
        after it left them there but maybe not on disk; fsynced before they are acknowledged."""
        for piece in written:
            fsync_tree(self.piece_dir(piece))
        fsync_path(self.path)

    def _publish(self, moves: Sequence[tuple[Path, Path]]) -> None:
        """Make each piece's files durable, rename its folder into place, then make the renames
        durable (one fsync of the sink's folder, which holds every piece): only then may the
        pieces' checkpoints move."""
        for src, dst in moves:
            fsync_tree(src)
            try:
                os.rename(src, dst)
            except OSError:
                if not dst.exists():
                    raise
                log.info("piece %s was written concurrently (lease moved?); keeping that one", dst)
        fsync_path(self.path)


def _writer(df: Any) -> Any:
    """``df``'s writer with the sink's Parquet options and, where it loads, the local filesystem
    that starts no chmod process (local_fs.py)."""
    return df.write.options(**WRITE_OPTIONS, **local_fs.write_options(df))


# A DeltaTable object brought up to date this many times is loaded afresh instead: one kept and
# updated grew by ~50 KB at each commit, and each commit took longer (this sink over 2,000
# writes: 76 MB of growth against 21, CPU per write 0.31x; bench/results/delta-table-refresh.md).
DELTA_TABLE_UPDATES = 100


class DeltaTableGoneError(KclpySparkError):
    """A Delta table this sink has seen was not found when loaded again: its log could not be
    listed (a storage or mount hiccup), or it was removed. The batch's write fails (retried,
    then its failure policy), never taken for a first write into a new table."""

    retriable = True


class _TableCopy:
    """One DeltaTable object of a table, brought up to date at each use and loaded afresh after
    ``DELTA_TABLE_UPDATES`` updates (not thread-safe: one owner, or its lock held)."""

    def __init__(self, path: str, options: dict[str, str] | None) -> None:
        self._path, self._options = path, options
        self._table: Any = None
        self._updates = 0  # since it was loaded

    def current(self) -> Any:
        """The table as it is now, or None when it does not exist (yet). Once seen, a table not
        found raises: taken for "no table yet", every lease's next version was 1, which a write
        from a snapshot at a later version skipped as already committed, and acknowledged."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is not None and self._updates < DELTA_TABLE_UPDATES:
            self._table.update_incremental()
            self._updates += 1
            return self._table
        try:
            fresh = DeltaTable(self._path, storage_options=self._options)
        except TableNotFoundError as exc:
            if self._table is None:
                return None
            raise DeltaTableGoneError(
                f"Delta table {self._path} is not found any more ({exc}): its batches fail "
                "until it is back (or the process restarts, which makes a new one)"
            ) from exc
        self._table, self._updates = fresh, 0
        return self._table

    def stale(self) -> None:
        """A use of the table failed: load it afresh next time (removed or replaced, its kept
        object failed at every use, until a restart)."""
        self._updates = DELTA_TABLE_UPDATES


# The table property that expires application transactions (Delta's protocol; delta-rs honours
# it when reading a table: an id whose last commit is older is read as never committed).
TXN_RETENTION = "delta.setTransactionRetentionDuration"


def txn_retention_value(days: float) -> str:
    return f"interval {round(days * 86_400)} seconds"


_INTERVAL_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400, "week": 604_800}


def interval_seconds(text: str | None) -> float | None:
    """A Delta interval property's seconds (``interval 7 days``; None: unset; NaN, equal to
    nothing, when not understood)."""
    if text is None:
        return None
    words = text.lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    try:
        pairs = [(float(n), u.rstrip("s")) for n, u in zip(words[::2], words[1::2], strict=True)]
        return sum(n * _INTERVAL_UNITS[u] for n, u in pairs) if pairs else float("nan")
    except (ValueError, KeyError):
        return float("nan")


def _version(table: Any, app_id: str) -> int:
    """The app id's last version committed in ``table`` (None: no table; 0: none)."""
    return 0 if table is None else int(table.transaction_version(app_id) or 0)


class DeltaSink:
    # A lease's versions must commit in order (a later one committed first would make Delta skip
    # the earlier), so the batcher keeps one batch of a lease in flight at a time.
    ordered_per_lease = True
    idempotent_per_piece = True  # a lease's version is committed once

    def __init__(
        self,
        path: str,
        *,
        app_id_prefix: str = "kclpy-spark",
        storage_options: Mapping[str, str] | None = None,
        partition_by: Sequence[str] | None = None,
        via_spark: bool = False,
        txn_retention_days: float | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``via_spark``: write ``batch.dataframe(...)`` (decoded) converted to Arrow instead of
        the raw record columns. ``txn_retention_days``: the transaction ids' retention set on a
        table this sink creates (None: none set); ``wall_clock``: the commit time they carry."""
        self.path = str(path)
        self._prefix = app_id_prefix
        self._retention = (
            None if txn_retention_days is None else txn_retention_value(txn_retention_days)
        )
        self._wall_clock = wall_clock
        self._retention_checked = False
        self._options = dict(storage_options) if storage_options else None
        self._partition_by = list(partition_by) if partition_by else None
        self._via_spark = via_spark
        self._shared = _TableCopy(self.path, self._options)
        self._lock = threading.Lock()  # one DeltaTable object, refreshed by concurrent writers
        self._per_thread = threading.local()  # each writer thread's own, to commit from

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r})"

    def app_id(self, lease_key: str) -> str:
        return f"{self._prefix}:{lease_key}"

    def committed_versions(self, lease_keys: Iterable[str]) -> dict[str, int]:
        """The last version committed for each lease's app id (0: none yet), read from one
        refreshed snapshot under the lock (writer threads share the table object)."""
        with self._lock:
            try:
                table = self._shared.current()
                self._check_retention(table)
                return {key: _version(table, self.app_id(key)) for key in lease_keys}
            except BaseException:
                self._shared.stale()
                raise

    def _check_retention(self, table: Any) -> None:
        """Once: the table's txn retention (every writer's: set by another application, or
        before this one configured it) differs from this sink's; say so, and what it does."""
        if table is None or self._retention_checked:
            return
        self._retention_checked = True
        found = table.metadata().configuration.get(TXN_RETENTION)
        if interval_seconds(found) != interval_seconds(self._retention):
            log.warning(
                "Delta table %s has %s = %r, this sink's config %r (set only on a table it "
                "creates; the table's applies to every writer): a piece re-formed from a "
                "pending checkpoint later than the table's retention after its commit is "
                "written again. To set it: DeltaTable(path).alter.set_table_properties(...), "
                "after a clean stop (an id written without a time, as before kclpy-spark "
                "stamped them, is kept by delta-rs and dropped at once by Spark's Delta)",
                self.path, TXN_RETENTION, found, self._retention,
            )  # fmt: skip

    def _txns(self, versions: Mapping[str, int]) -> list[Any]:
        """The application transactions of ``versions`` (lease key -> version), stamped now."""
        from deltalake import Transaction

        now = int(self._wall_clock() * 1000)
        return [Transaction(self.app_id(k), v, last_updated=now) for k, v in versions.items()]

    def committed_version(self, lease_key: str) -> int:
        return self.committed_versions([lease_key])[lease_key]

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        committed = self.committed_versions(p.lease_key for p in pieces)
        return {p.lease_key: committed[p.lease_key] + 1 for p in pieces}

    def _copy(self) -> _TableCopy:
        copy = getattr(self._per_thread, "copy", None)
        if copy is None:
            copy = self._per_thread.copy = _TableCopy(self.path, self._options)
        return copy

    def _snapshot(self) -> Any:
        """This writer thread's table object, brought up to date (None: no table yet). The write
        commits from the snapshot it read, so a commit of the same app version by another writer
        since then (an old owner whose write outlived its lease) makes delta-rs refuse this one
        as a concurrent transaction; a write from a newer snapshot would commit it twice. One
        object per writer thread (they are few and long-lived): an update reads only the commits
        since its last write, where a fresh load reads the log from its last checkpoint; loaded
        afresh after ``DELTA_TABLE_UPDATES`` updates (a kept one grows)."""
        return self._copy().current()

    def write(self, batch: SinkBatch) -> None:
        try:
            self._write(batch)
        except BaseException:
            self._copy().stale()
            raise

    def _write(self, batch: SinkBatch) -> None:
        snapshot = self._snapshot()
        if snapshot is None:
            # No table yet: made empty first (or found made by another meanwhile), then appended
            # to from a snapshot, as every write. Two writers whose first writes each made the
            # table with theirs both committed (delta-rs retries a losing create as the next
            # version): a piece written by an old and a new owner at once was in it twice.
            self._create(self._data(batch, list(batch.pieces)).schema)
            snapshot = self._snapshot()
            if snapshot is None:
                raise DeltaTableGoneError(f"Delta table {self.path} is not found just after made")
        self._write_from(snapshot, batch)

    def _create(self, schema: Any) -> None:
        from deltalake import DeltaTable

        retention = {TXN_RETENTION: self._retention} if self._retention is not None else None
        DeltaTable.create(
            self.path, schema, mode="ignore", partition_by=self._partition_by,
            configuration=retention, storage_options=self._options,
        )  # fmt: skip

    def _data(self, batch: SinkBatch, pieces: list[Piece]) -> Any:
        return batch.frame(pieces).toArrow() if self._via_spark else batch.arrow(pieces)

    def _write_from(self, snapshot: Any, batch: SinkBatch) -> None:
        """The batch's pieces not committed in ``snapshot``, committed from it with their
        versions."""
        from deltalake import CommitProperties, write_deltalake

        todo, versions = [], {}
        for piece in batch.pieces:
            app_id = self.app_id(piece.lease_key)
            committed = _version(snapshot, app_id)
            token = batch.tokens.get(piece.lease_key)
            version = int(token) if token is not None else committed + 1
            # Skipped at or below what the table holds: committed by an earlier attempt or
            # owner (a lease that moved since its batch failed may be past it: its new owner
            # re-formed the piece and went on; refusing failed the batch's other leases too).
            if committed >= version:
                log.info(
                    "batch %d: piece %s already committed (version %d); skipped",
                    batch.batch_id,
                    piece.piece_id,
                    committed,
                )
                continue
            todo.append(piece)
            versions[piece.lease_key] = version
        if not todo:
            return
        write_deltalake(
            snapshot,
            self._data(batch, todo),
            mode="append",
            partition_by=self._partition_by,
            storage_options=self._options,
            commit_properties=CommitProperties(
                app_transactions=self._txns(versions),
                custom_metadata={"kclpy_spark.batch_id": str(batch.batch_id)},
            ),
        )

    def retire_tokens(self, batch: SinkBatch) -> None:
        """Commit, with no rows, each piece's version not committed yet: the batch went to the
        dead-letter location while its write may still run (a hang, or an earlier tenure's
        write of the same version). Its own commit then conflicts and is refused, and the
        lease's next batch gets the version after. Without a table, raises (the batch is not
        acknowledged: parked), as a late first write could make it with the version."""
        from deltalake import CommitProperties, write_deltalake

        snapshot = self._snapshot()
        if snapshot is None:  # the first write of the table may still make it, with a version
            raise RuntimeError(f"{self.path}: no Delta table yet to retire versions in")
        versions = {}
        for piece in batch.pieces:
            key, token = piece.lease_key, batch.tokens.get(piece.lease_key)
            if token is not None and _version(snapshot, self.app_id(key)) < int(token):
                versions[key] = int(token)
        if versions:
            import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

            empty = pa.schema(snapshot.schema().to_arrow()).empty_table()
            write_deltalake(
                snapshot, empty, mode="append", storage_options=self._options,
                commit_properties=CommitProperties(app_transactions=self._txns(versions)),
            )  # fmt: skip


class DeadLetterDirectory:
    def __init__(self, path: str | os.PathLike[str], sink_name: str | None = None) -> None:
        """``sink_name``: with several sinks, whose failure this location stores (in the file
        name and metadata, so that sinks sharing a location keep their own files)."""
        self.path = _local_path(path, "the dead-letter location")
        self.sink_name = sink_name
        with contextlib.suppress(OSError):  # a folder not reachable yet: its writes will say
            self.sweep_stale()

    def __repr__(self) -> str:
        return f"DeadLetterDirectory({str(self.path)!r})"

    def sweep_stale(self, now: float | None = None) -> int:
        """Delete the temporary files of dead-letter writes a crash or a stop cut short (a
        failed write deletes its own), each up to a batch's size and kept for good: those not
        written to for ``STALE_TMP_SECONDS`` (a write takes seconds; another worker's writing
        now is left alone). Returns how many went; called when the sink is set up."""
        gone = 0
        cutoff = (time.time() if now is None else now) - STALE_TMP_SECONDS
        for stale in self.path.glob(".batch-*.tmp") if self.path.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):
                if stale.stat().st_mtime < cutoff:
                    stale.unlink()
                    gone += 1
        return gone

    def write(self, batch: SinkBatch, error: BaseException) -> None:
        import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

        self.path.mkdir(parents=True, exist_ok=True)
        suffix = f"-{self.sink_name}" if self.sink_name else ""
        final = self.path / f"batch-{batch.batch_id:016x}{suffix}.parquet"
        if final.exists():  # a replay of a batch already dead-lettered (maybe not fsynced)
            fsync_path(final)
            fsync_path(self.path)
            return
        pieces = [
            {
                "piece_id": p.piece_id,
                "lease_key": p.lease_key,
                "first": str(p.key.first),
                "last": str(p.key.last),
                "rows": p.rows,
            }
            for p in batch.pieces
        ]
        table = batch.arrow().replace_schema_metadata(
            {
                "kclpy_spark.batch_id": str(batch.batch_id),
                "kclpy_spark.error": repr(error)[:10_000],
                "kclpy_spark.attempts": str(batch.attempt),
                "kclpy_spark.pieces": json.dumps(pieces),
                "kclpy_spark.sink": self.sink_name or "",
            }
        )
        tmp = self.path / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            pq.write_table(table, tmp)
            fsync_path(tmp)
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)  # each failed try left one behind (a full disk: many)
            raise
        fsync_path(self.path)
