"""Is the worker making progress? Readiness for ``/readyz`` and ``status``, and when to give up.

Ready means more than "the process answers": the lease table answered recently and exists, every
configured stream exists, not every lease of the application is parked, no held lease has
gone without a successful read for ``stall_after`` seconds (a read blocked only because the
processor is behind does not count), and no processor call has been running for longer than
``processor_stall_timeout`` (a hung processor holds its lease and makes no progress). When the
lease table or a stream has been gone for ``missing_timeout`` seconds, ``fatal`` says so and the
daemon exits non-zero with that one line: a worker that can do nothing must not look healthy
forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from checkpoint.base.errors import CorruptLeaseError, KclpySparkError, ResourceNotFoundError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConsumerView:
    """What health needs of one running shard consumer."""

    shard_id: str
    state: str
    stalled: bool  # processing, and its source silent past stall_after
    hung_for: float | None = None  # seconds a processor call has run past the stall timeout


class Health:
    def __init__(
        self,
        monotonic: Callable[[], float],
        *,
        store_interval: float,
        missing_timeout: float,
        table_name: str,
        quiet_interval: float = 0.0,
    ) -> None:
        self._monotonic = monotonic
        self._store_interval = store_interval  # the lease table must answer within 3 of these
        # While suspended nothing is renewed, scanned or taken: only the control round's read of
        # the flag (this often) proves the table answers; one read may fail: within 3 of these.
        self._quiet_interval = quiet_interval
        self.missing_timeout = missing_timeout
        self._table_name = table_name
        self.started = False
        self.last_store_ok: float | None = None
        # Each table found gone (the lease table, or on DynamoDB the coordination table beside
        # it) -> since when; only an answer of that very table clears it (a renewal of the lease
        # table says nothing of the coordination table).
        self._gone: dict[str, float] = {}
        self.all_parked = False
        self.duplicate_worker: str | None = None
        # Since when the lease table's writes (renewals, takes) have failed with none done in
        # between (a throttled table, writes denied by IAM), the last failure and its error:
        # reads (scans) may still answer while no lease is kept.
        self.writes_failing_since: float | None = None
        self._write_failed_at = 0.0
        self._write_error = ""
        # A lease item no code can read (CorruptLeaseError): every scan fails on it, so no lease
        # is taken until an operator mends or deletes it. Cleared by a scan that read every item.
        self.corrupt_lease: str | None = None

    # --- what the worker reports ------------------------------------------------------------------

    @property
    def table_gone_since(self) -> float | None:
        """Since when a table has been gone (the one gone longest), or None."""
        return min(self._gone.values(), default=None)

    @property
    def gone_table(self) -> str:
        """The table gone longest (the lease table when none is)."""
        return min(self._gone, key=self._gone.__getitem__, default=self._table_name)

    def store_ok(self, *, scanned: bool = False, coordination: bool = False) -> None:
        """The lease table answered (``coordination``: the coordination records did, which on
        DynamoDB are a table of their own); ``scanned``: a read of every lease we look at
        succeeded."""
        if coordination:
            for table in [t for t in self._gone if t != self._table_name]:
                del self._gone[table]
                log.warning("the %s answers again", self._label(table))
            return
        if scanned and self.corrupt_lease is not None:
            log.warning("the lease table holds no corrupt lease any more")
            self.corrupt_lease = None
        self.last_store_ok = self._monotonic()
        if self._gone.pop(self._table_name, None) is not None:
            log.warning("the %s answers again", self._label(self._table_name))

    def store_failed(self, exc: KclpySparkError) -> None:
        if isinstance(exc, CorruptLeaseError):
            if str(exc) != self.corrupt_lease:
                log.error("%s: no lease is taken until it is mended or deleted", exc)
            self.corrupt_lease = str(exc)
        table = (
            (exc.resource or self._table_name) if isinstance(exc, ResourceNotFoundError) else None
        )
        if table is not None and table not in self._gone:
            self._gone[table] = self._monotonic()
            log.error("the %s is gone: %s", self._label(table), exc)

    def writes(self, succeeded: int, failed: Sequence[KclpySparkError]) -> None:
        """Lease-table writes came back: ``succeeded`` answered (won or lost their condition;
        a renewal skipped because a checkpoint had just renewed the lease counts), ``failed``
        the ones an error stopped. A round with neither (nothing held, nothing to take)
        changes nothing."""
        if succeeded:
            self.writes_failing_since = None
        elif failed:
            now = self._monotonic()
            if self.writes_failing_since is None:
                self.writes_failing_since = now
            self._write_failed_at = now
            self._write_error = str(failed[-1])[:200]

    def _label(self, table: str) -> str:
        if table == self._table_name:
            return f"lease table {table}"
        return f"coordination table {table}"

    def _gone_label(self) -> str:
        return self._label(self.gone_table)

    # --- what it concludes -----------------------------------------------------------------------

    def readiness(
        self,
        *,
        suspended: bool,
        consumers: Iterable[ConsumerView],
        missing_streams: Iterable[str],
        failing_syncs: Iterable[str] = (),
    ) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        now = self._monotonic()
        if self.table_gone_since is not None:
            return (
                False,
                f"{self._gone_label()} gone for {now - self.table_gone_since:.0f}s",
            )
        if self.last_store_ok is None:
            return False, "no lease-table round trip yet"
        age = now - self.last_store_ok
        limit = 3 * self._store_interval
        if suspended:
            limit = max(limit, 3 * self._quiet_interval)
        if age > limit:
            return False, f"lease table unreachable for {age:.0f}s"
        # Failing longer than the limit, and lately (a worker holding nothing, wanting nothing,
        # writes nothing: an old failure must not keep it not ready).
        since = self.writes_failing_since
        lately = now - self._write_failed_at <= 2 * limit
        if since is not None and not suspended and now - since > limit and lately:
            return False, f"lease-table writes failing for {now - since:.0f}s: {self._write_error}"
        missing = sorted(missing_streams)
        if missing:
            return False, f"stream(s) gone or not readable: {', '.join(missing)}"
        failing = sorted(failing_syncs)  # the leader's: new shards go unleased meanwhile
        if failing:
            return False, f"shard sync failed for stream(s) {', '.join(failing)}"
        if self.duplicate_worker:
            return False, self.duplicate_worker
        if self.corrupt_lease:
            return False, f"{self.corrupt_lease} (mend or delete the item)"
        if suspended:
            return True, "suspended"
        consumers = list(consumers)
        hung = sorted(f"{c.shard_id} ({c.hung_for:.0f}s)" for c in consumers if c.hung_for)
        if hung:
            return False, f"a processor call has not returned on shard(s) {', '.join(hung)}"
        stalled = sorted(c.shard_id for c in consumers if c.stalled)
        if stalled:
            return False, f"no successful read lately on shard(s) {', '.join(stalled)}"
        if self.all_parked:
            return False, "every lease of the application is parked (see status)"
        return True, "ready"

    def fatal(self, gone_streams: dict[str, float], streams: int = 1) -> str | None:
        """Why the daemon must exit now (a dependency gone for missing_timeout), or None.
        ``gone_streams`` maps a missing stream to the monotonic time it was first missed; of
        ``streams`` configured, every one must have been gone that long (one deleted stream of
        several stops only its own leases: the others go on)."""
        now = self._monotonic()
        if self.table_gone_since is not None:
            gone = now - self.table_gone_since
            if gone >= self.missing_timeout:
                lost = (
                    "its checkpoints are lost with it, so nothing is recreated: restore it or "
                    "start over"
                    if self.gone_table == self._table_name
                    else "it holds the leader, worker status, stream identities and the suspend "
                    "flag; a worker start creates it again (create_lease_table), or restore it"
                )
                return (
                    f"the {self._gone_label()} has been gone for {gone:.0f}s "
                    f"(missing_dependency_timeout {self.missing_timeout:.0f}s); {lost}"
                )
        long_gone = {s: now - since for s, since in gone_streams.items()
                     if now - since >= self.missing_timeout}  # fmt: skip
        if not long_gone or len(long_gone) < streams:
            return None
        names = ", ".join(sorted(long_gone))
        return (
            f"the stream{'s' if len(long_gone) > 1 else ''} {names} "
            f"{'have' if len(long_gone) > 1 else 'has'} been gone for "
            f"{min(long_gone.values()):.0f}s or more "
            f"(missing_dependency_timeout {self.missing_timeout:.0f}s)"
        )
