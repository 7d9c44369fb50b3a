"""Application-wide coordination records kept in the lease store beside the leases.

* ``suspended``: set by ``kclpy-spark suspend``; every worker stops taking and processing leases
  (keeping its checkpoints, staying alive) until ``resume``. It lives in the store, so it holds
  across restarts and machines.
* ``stream/<stream>``: when the stream this application's leases belong to was created: a stream
  deleted and re-created under the same name has new records but the same shard ids, so the old
  checkpoints must not be applied to it (single-stream mode; multi-stream lease keys carry it).
* ``worker/<id>``: what each worker publishes about itself (readiness, roles, CPU, recent lease
  events; a lease's lag and records ride on its renewals): for ``kclpy-spark status``, the status
  page and balancing, which counts the workers whose record is fresh. Only its own worker writes
  it; each process marks it with an instance id, so two processes started with the same worker
  id find each other.

Writes are conditional on the record's version like every other write; a lost race is retried a
few times by re-reading, since these are single-writer records or idempotent flags.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from checkpoint.base.clock import Clock
from checkpoint.base.errors import ConfigError
from checkpoint.port import CoordinationRecord, CoordinationStore, KclWorkerSighting, record_data


@dataclass(frozen=True)
class CpuFigure:
    """A worker's CPU as its status record publishes it: percent of its limit over the last
    window (None before its first window ends), whether its set of consumers stayed the same over
    that window, when the window began (its wall clock) and its limit in CPUs."""

    percent: float | None
    settled: bool = True
    since: float | None = None
    limit: float | None = None


# The longest ``live_for`` a reader believes (an hour): a bad record must not look alive forever.
MAX_LIVE_FOR = 3600.0


def live_for(status: Mapping[str, Any], default: float) -> float:
    """How long after its ``updated_at`` a status record says its worker runs: the record's own
    ``live_for`` (a worker that may write its next status only after a quiet interval says
    so), never less than the reader's ``default`` (records without it: older versions, or a
    worker holding no lease, which writes every lease duration)."""
    declared = status.get("live_for")
    if isinstance(declared, bool) or not isinstance(declared, int | float):
        return default
    return max(float(declared), default) if 0 < declared <= MAX_LIVE_FOR else default


def is_live(status: Mapping[str, Any], now_wall: float, max_age: float) -> bool:
    """Whether ``status`` was written within ``max_age`` seconds, or within the longer time the
    record itself says it holds for (``live_for``)."""
    updated = status.get("updated_at")
    if not isinstance(updated, int | float) or isinstance(updated, bool):
        return False
    return now_wall - updated <= live_for(status, max_age)


SUSPEND_KEY = "suspended"
_ATTEMPTS = 5


class DuplicateWorkerError(ConfigError):
    """Another live process publishes status under this worker id."""


WORKER_PREFIX = "worker/"


def worker_key(worker_id: str) -> str:
    return f"{WORKER_PREFIX}{worker_id}"


def _data(record: CoordinationRecord | None) -> dict[str, Any]:
    if record is None:
        return {}
    try:
        value = json.loads(record.data or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def update_record(
    store: CoordinationStore,
    key: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    owner: str | None,
    now_wall: float,
) -> bool:
    """Read-modify-write of a record's JSON data, conditional on its version. True if written."""
    return _update(store, key, change, owner=owner, now_wall=now_wall) is not None


def _update(
    store: CoordinationStore,
    key: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    owner: str | None,
    now_wall: float,
) -> int | None:
    """``update_record``; the version written, or None."""
    for _ in range(_ATTEMPTS):
        current = store.get_record(key)
        data = change(_data(current))
        version = 1 if current is None else current.version + 1
        record = CoordinationRecord(key, owner, version, now_wall, record_data(data))
        if current is not None:
            record = replace(record, owner=owner if owner is not None else current.owner)
        if store.put_record(record, None if current is None else current.version):
            return version
    return None


def is_suspended(store: CoordinationStore) -> bool:
    return _says_suspended(store.get_record(SUSPEND_KEY))


def _says_suspended(record: CoordinationRecord | None) -> bool:
    return bool(_data(record).get("suspended"))


class SuspendFlag:
    """The suspend flag as one worker follows it: taken from the last scan of the table if that
    returned within ``max_age`` seconds (the taker's scan reads the record anyway; no record
    there: not suspended), else read (eventually consistent). Scans and reads may lag (a scan
    in flight across a read, a replica behind): a record older than one already seen (by its
    version; a record deleted and written again, by its write time) never overrides it, so the
    flag never flips back. ``observe`` runs on the event loop, ``read`` on a thread."""

    def __init__(self, store: CoordinationStore, clock: Clock, max_age: float) -> None:
        self._store = store
        self._clock = clock
        self._max_age = max_age
        self._version = 0  # the newest version of the record seen (0: none yet)
        self._made: object = None  # that record's own mark ("made": None before we had one)
        self._newest_written = -math.inf  # the latest write time of any record seen
        self._suspended = False
        self._scanned_at = float("-inf")  # when the last scan returned
        self._lock = threading.Lock()

    def _note(self, record: CoordinationRecord | None) -> bool:
        """Take ``record`` unless it is older than what we saw; the flag (call with the lock)."""
        version = 0 if record is None else record.version
        written = -math.inf if record is None else record.expires_at
        made = _data(record).get("made")
        # The same record: its newer version wins. Another (deleted and written again, its
        # version from 1): the one written later, so a stale view of the old one never wins. A
        # record without a mark (an earlier version's) gets one at its next write: versions.
        same = made == self._made or made is None or self._made is None
        if version >= self._version if same else written > self._newest_written:
            self._version, self._made = version, made
            self._suspended = _says_suspended(record)
        self._newest_written = max(self._newest_written, written)
        return self._suspended

    def observe(self, records: Iterable[CoordinationRecord], returned_at: float) -> None:
        record = next((r for r in records if r.key == SUSPEND_KEY), None)
        with self._lock:
            self._note(record)
            self._scanned_at = returned_at

    def read(self) -> tuple[bool, bool]:
        """Whether the application is suspended; whether the store was asked for it."""
        with self._lock:
            if self._clock.monotonic() - self._scanned_at <= self._max_age:
                return self._suspended, False
        record = self._store.get_record(SUSPEND_KEY, consistent=False)
        with self._lock:
            return self._note(record), True


def set_suspended(store: CoordinationStore, suspended: bool, *, by: str, now_wall: float) -> bool:
    def change(d: dict[str, Any]) -> dict[str, Any]:
        # "made": the record's own mark, kept by every update: one written after it was deleted
        # has another (its version starts again at 1).
        made = d.get("made") or uuid.uuid4().hex[:12]
        return {**d, "suspended": suspended, "by": by, "at": now_wall, "made": made}

    return update_record(store, SUSPEND_KEY, change, owner=None, now_wall=now_wall)


def stream_key(stream: str) -> str:
    return f"stream/{stream}"


def stream_created(store: CoordinationStore, stream: str) -> float | None:
    value = _data(store.get_record(stream_key(stream))).get("created")
    return float(value) if isinstance(value, int | float) else None


def set_stream_created(
    store: CoordinationStore, stream: str, created: float, *, now_wall: float
) -> bool:
    return update_record(
        store,
        stream_key(stream),
        lambda d: {**d, "created": created, "at": now_wall},
        owner=None,
        now_wall=now_wall,
    )


def published_by_another(
    status: dict[str, Any], instance: str, now_wall: float, max_age: float
) -> bool:
    """True if ``status`` (a worker record's data) was written by another, running process
    within ``max_age`` seconds, or the longer time its record says it holds for (not by
    ``instance``, and not marked stopped)."""
    before = status.get("instance")
    return (
        bool(instance)
        and isinstance(before, str)
        and before != instance
        and not status.get("stopped")
        and is_live(status, now_wall, max_age)
    )


def publish_worker_status(
    store: CoordinationStore,
    worker_id: str,
    status: dict[str, Any],
    now_wall: float,
    instance: str = "",
    max_age: float = 0.0,
) -> str | None:
    """Write this worker's status record. Returns the instance id of another process that
    wrote the record under the same worker id within ``max_age`` seconds, if one did (the
    record is written anyway: the newest writer's status is what ``status`` shows)."""
    return StatusWriter(store, worker_id, instance, max_age).publish(status, now_wall)


class StatusWriter:
    """Publishes one worker's status record, again and again.

    The first write reads the record (another process may have written it); later ones are a
    single write conditional on the version this writer wrote last. It wins only if nobody wrote
    in between, and then no other process did; if it loses, the record is read and written
    again, which tells who came between (``publish_worker_status``'s answer)."""

    def __init__(
        self, store: CoordinationStore, worker_id: str, instance: str = "", max_age: float = 0.0
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._instance = instance
        self._max_age = max_age
        self._version: int | None = None  # what we wrote last
        self._stopped = False  # a stopped status was written: nothing after it
        self._stopping = False  # a stopping status was written: every later one says so too
        self._lock = threading.Lock()  # the control round's publish may outlive its task
        self._gone: str | None = None  # an earlier process of this id, known to have stopped

    def ignore(self, instance: str) -> None:
        """``instance`` is known to have stopped (a crashed earlier run whose record did not
        move): its record, however recent, is no second process."""
        self._gone = instance

    def _data(self, status: dict[str, Any], now_wall: float) -> dict[str, Any]:
        # The worker id is the record's key: not written again in its data.
        return {**status, "updated_at": round(now_wall, 3), "instance": self._instance}

    def publish(self, status: dict[str, Any], now_wall: float) -> str | None:
        """Write ``status``; the instance id of another process that wrote the record within
        ``max_age`` seconds, if one did. After a status with ``stopped`` set, nothing is written
        (a control round's publish still running when the worker stopped must not undo it)."""
        with self._lock:
            if self._stopped:
                return None
            self._stopping = self._stopping or bool(status.get("stopping"))
            if self._stopping:  # a control round's publish still running must not undo it
                status = {**status, "stopping": True}
            other = self._publish(status, now_wall)
            self._stopped = bool(status.get("stopped"))
            return other

    def _publish(self, status: dict[str, Any], now_wall: float) -> str | None:
        key = worker_key(self._worker_id)
        if self._version is not None:
            data = record_data(self._data(status, now_wall))
            # No owner attribute: the worker id is the record's key, and nothing reads it (a
            # record an older version wrote keeps its owner until this first plain write).
            record = CoordinationRecord(key, None, self._version + 1, now_wall, data)
            if self._store.put_record(record, expected_version=self._version):
                self._version += 1
                return None
        other: list[str] = []

        def change(previous: dict[str, Any]) -> dict[str, Any]:
            other.clear()
            twin = published_by_another(previous, self._instance, now_wall, self._max_age)
            if twin and previous["instance"] != self._gone:
                other.append(str(previous["instance"]))
            return self._data(status, now_wall)

        self._version = _update(self._store, key, change, owner=None, now_wall=now_wall)
        return other[0] if other else None


# A worker record not written for this long is a process gone: every start of a worker without
# a configured worker_id writes a new one (a crash loop, a daily deploy), and each take round's
# Scan reads them all. The shard-sync leader deletes them (prune_gone_workers).
GONE_WORKER_AFTER = 3600.0
PRUNED_AT_MOST = 100  # deletions a prune makes (a write unit each); the rest wait for the next


def gone_workers(
    records: Iterable[CoordinationRecord], now_wall: float, after: float = GONE_WORKER_AFTER
) -> list[CoordinationRecord]:
    """The worker records not written for ``after`` seconds (nor within the longer time they
    say they hold for); a record without a time is left alone."""
    gone = []
    for record in records:
        if not record.key.startswith(WORKER_PREFIX):
            continue
        status = _data(record)
        updated = status.get("updated_at")
        timed = isinstance(updated, int | float) and not isinstance(updated, bool)
        if timed and not is_live(status, now_wall, after):
            gone.append(record)
    return gone


def prune_gone_workers(
    store: CoordinationStore, records: Iterable[CoordinationRecord], now_wall: float
) -> int:
    """Delete (by version: one written since is kept) at most PRUNED_AT_MOST of the gone worker
    records among ``records``; how many were deleted."""
    deleted = 0
    for record in gone_workers(records, now_wall)[:PRUNED_AT_MOST]:
        deleted += store.delete_record(record.key, record.version)
    return deleted


def worker_statuses(records: Iterable[CoordinationRecord]) -> dict[str, dict[str, Any]]:
    """Every worker status record's data by worker id, whatever it says (stopping, suspended)."""
    return {
        record.key.removeprefix(WORKER_PREFIX): _data(record)
        for record in records
        if record.key.startswith(WORKER_PREFIX)
    }


def _statuses(records: Iterable[CoordinationRecord]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each worker status record's worker id and data, unless it says the worker is stopping,
    stopped or suspended."""
    for record in records:
        if record.key.startswith(WORKER_PREFIX):
            data = _data(record)
            if not (data.get("stopped") or data.get("stopping") or data.get("suspended")):
                yield record.key.removeprefix(WORKER_PREFIX), data


def live_workers(
    records: Iterable[CoordinationRecord], now_wall: float, max_age: float
) -> dict[str, float]:
    """The workers whose status records say they run: written within ``max_age`` seconds (by
    the writer's clock) and not stopping, stopped or suspended. A worker publishes before its
    first take round, so one that holds no lease yet is seen here before any lease shows it.
    Worker id -> when its status was written."""
    return {
        worker: float(data["updated_at"])
        for worker, data in _statuses(records)
        if is_live(data, now_wall, max_age)
    }


def clocks_ahead(
    records: Iterable[CoordinationRecord], now_wall: float, allowance: float
) -> dict[str, float]:
    """The workers whose status record is stamped more than ``allowance`` seconds past
    ``now_wall``: their clock runs ahead of ours by at least that much (a record is read after
    it is written). Worker id -> seconds ahead."""
    ahead = {}
    for worker, data in _statuses(records):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            by = float(data["updated_at"]) - now_wall
            if by > allowance:
                ahead[worker] = by
    return ahead


# A KCL 3.x worker writes its metrics entity every 30 s; its leader counts it as gone after two
# missed writes (WorkerMetricStats: 2 x workerMetricsReporterFreqInMillis). So do we.
KCL_METRICS_MAX_AGE = 60.0


def live_kcl_workers(
    sightings: Iterable[KclWorkerSighting], now_wall: float, max_age: float = KCL_METRICS_MAX_AGE
) -> dict[str, float]:
    """The KCL 3.x workers whose metrics entity was written within ``max_age`` seconds (a
    stopped worker's stays until its leader deletes it a day later). Worker id -> when."""
    return {s.worker_id: s.updated_at for s in sightings if now_wall - s.updated_at <= max_age}


# The KCL 3.x client versions whose workers find the leases given to them (lease assignment and
# discovery run only in these; CLIENT_VERSION_UPGRADE_FROM_2X and CLIENT_VERSION_2X run as KCL 2.x
# workers, which take expired leases and never look for one handed to them).
KCL_ASSIGNING_VERSIONS = frozenset({"CLIENT_VERSION_3X", "CLIENT_VERSION_3X_WITH_ROLLBACK"})


def kcl_workers_follow_handoffs(client_version: str | None) -> bool:
    """Whether the KCL 3.x workers of a fleet at ``client_version`` (None: no migration item
    found, a fleet started on 3.x) find a lease handed or assigned to them."""
    return client_version is None or client_version in KCL_ASSIGNING_VERSIONS


def cpu_figures(
    records: Iterable[CoordinationRecord], now_wall: float, max_age: float
) -> dict[str, CpuFigure]:
    """The workers' CPU as they publish it (``cpu_percent``, ``cpu_settled``, ``cpu_since``,
    ``cpu_limit``), for the load rule. Left out: workers that do not publish ``cpu_settled`` (an
    older version, or ``load_metric = "throughput"``: then the rule balances throughput), and
    stopping, stopped or suspended ones. A record older than ``max_age`` (a status write late or
    failed) gives an unsettled figure: moves to or from that worker wait, and the fleet does not
    fall back to throughput for it."""
    figures = {}
    for worker, data in _statuses(records):
        settled = data.get("cpu_settled")
        if not isinstance(settled, bool):
            continue
        percent = _number(data.get("cpu_percent"))
        figures[worker] = CpuFigure(
            percent, settled and is_live(data, now_wall, max_age) and percent is not None,
            _number(data.get("cpu_since")), _number(data.get("cpu_limit")),
        )  # fmt: skip
    return figures


def consumed_streams(records: Iterable[CoordinationRecord]) -> dict[str, frozenset[str]]:
    """The streams each worker says it consumes (``streams``: the stream keys of a worker with
    ``[[streams]]``), for whoever gives it leases. Left out: workers that do not say (one stream
    per table, or an older version): they are taken to consume every stream, as before."""
    streams = {}
    for worker, data in _statuses(records):
        said = data.get("streams")
        if isinstance(said, list) and all(isinstance(s, str) for s in said):
            streams[worker] = frozenset(said)
    return streams


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def worker_status(store: CoordinationStore, worker_id: str) -> dict[str, Any]:
    return _data(store.get_record(worker_key(worker_id)))
