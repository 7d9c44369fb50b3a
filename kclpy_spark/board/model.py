"""The status page's model: an application's leases as the lease table shows them, the figures
the workers publish, their history over the last hour, and what moved.

Pure: ``observe`` takes a lease scan, the workers' published status records and the wall time;
``snapshot`` gives the JSON the page draws. Everything it keeps is bounded by what is alive: a
series per lease in the table that has figures (at most ``window / step`` points each, and at
most ``max_series`` series: more lines than that make no readable chart), the workers in the
last look, and a fixed number of events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from checkpoint.coordination import is_live
from checkpoint.lease import Lease
from kclpy_spark._version import __version__
from kclpy_spark.board.graph import layout
from kclpy_spark.ops.status import lease_rows, owner_figures

SINK_FIGURES = ("batches", "rows", "failed_attempts", "dead_lettered_batches", "parked_batches")


@dataclass
class Series:
    """One lease's lag and records/s over time (wall seconds), oldest first."""

    t: deque[float] = field(default_factory=deque)
    lag: deque[int | None] = field(default_factory=deque)
    rate: deque[float | None] = field(default_factory=deque)
    opened: float = float("-inf")  # when the newest point's step began

    def add(self, at: float, lag: int | None, rate: float | None, *, step: float) -> None:
        """A reading: within the step the newest point began, it replaces that point's figures
        (measured from the step's start, not from the last reading: readings more often than a
        step still make one point a step)."""
        if self.t and at - self.opened < step:
            self.t.pop()
            self.lag.pop()
            self.rate.pop()
        else:
            self.opened = at
        self.t.append(at)
        self.lag.append(lag)
        self.rate.append(rate)

    def trim(self, since: float) -> None:
        while self.t and self.t[0] < since:
            self.t.popleft()
            self.lag.popleft()
            self.rate.popleft()


def event_of(published: Any, worker: str) -> dict[str, Any] | None:
    """A lease event from a worker's status record as a dict: the record's compact form
    ``[at, kind, lease key, detail]`` (``runtime.publish.published_events``) with ``worker``'s id,
    or the dict an older worker published; None for anything else."""
    if isinstance(published, dict):
        return published
    if isinstance(published, list) and len(published) == 4:
        at, kind, key, detail = published
        if isinstance(at, int | float) and isinstance(kind, str) and isinstance(key, str):
            text = detail if isinstance(detail, str) else ""
            return {"at": at, "lease_key": key, "kind": kind, "worker": worker, "detail": text}
    return None


def _event_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells one published lease event from another (the same event is published again
    by its worker at every status round)."""
    return (event.get("at"), event.get("lease_key"), event.get("kind"), event.get("worker"))


@dataclass(frozen=True)
class _Count:
    owner: str
    records: int
    at: float  # the owner's publishing time of ``records``


class Board:
    def __init__(
        self,
        application: str,
        stream: str,
        *,
        window: float = 3600.0,
        step: float = 10.0,
        worker_ttl: float = 30.0,
        max_events: int = 200,
        max_series: int = 100,
        silent_after: float | None = None,
    ) -> None:
        """``silent_after``: a lease whose owner of ours last renewed it longer ago shows EXPIRED,
        without its stale lag (``lease_rows``)."""
        self.application = application
        self.stream = stream
        self._window = window
        self._step = step
        self._worker_ttl = worker_ttl  # a worker silent this long is shown as gone
        self._silent_after = silent_after
        self._series: dict[str, Series] = {}
        self._max_series = max_series
        self.series_limited = False  # some leases with figures have no series (max_series)
        self._counts: dict[str, _Count] = {}
        self._rates: dict[str, float | None] = {}
        # Each lease's checkpoint as last seen, and when a look first saw it move (None: not
        # seen moving since the board began); each worker's published bytes and their rate.
        self._checkpoints: dict[str, tuple[str, float | None]] = {}
        self._bytes: dict[str, _Count] = {}
        self._byte_rates: dict[str, float | None] = {}
        self._leases: list[Lease] = []
        self._statuses: dict[str, Mapping[str, Any]] = {}
        self._events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._seen_events: set[tuple[Any, ...]] = set()
        self._suspended = False
        self._at = 0.0

    def observe(
        self,
        leases: Iterable[Lease],
        statuses: Mapping[str, Mapping[str, Any]],
        now_wall: float,
        *,
        suspended: bool = False,
    ) -> None:
        """A new look at the table (``leases``) and at the workers' records (``statuses``, by
        worker id: what ``control.publish_worker_status`` wrote)."""
        self._leases = sorted(leases, key=lambda x: x.lease_key)
        self._statuses = {w: s for w, s in statuses.items() if s}
        self.series_limited = False
        self._suspended = suspended
        self._at = now_wall
        keys = {x.lease_key for x in self._leases}
        kept_by_lease: list[dict[str, Any]] = [self._series, self._counts, self._rates,
                                               self._checkpoints]  # fmt: skip
        for kept in kept_by_lease:  # leases deleted by cleanup
            for gone in [k for k in kept if k not in keys]:
                del kept[gone]
        for lease in self._leases:
            self._sample(lease, now_wall)
            checkpoint = str(lease.checkpoint)
            before = self._checkpoints.get(lease.lease_key)
            if before is None or before[0] != checkpoint:
                self._checkpoints[lease.lease_key] = (
                    checkpoint,
                    None if before is None else now_wall,
                )
        self._sample_bytes()
        for key, series in list(self._series.items()):  # a series with no new figures ages out
            series.trim(now_wall - self._window)
            if not series.t:
                del self._series[key]
        self._merge_events()

    def _published(self, lease: Lease) -> tuple[Mapping[str, Any], float | None]:
        if lease.actual_owner is None:
            return {}, None
        status = self._statuses.get(lease.actual_owner, {})
        figures = owner_figures(lease, status)
        owned = lease.owner_figures
        at = owned.at if owned is not None else status.get("updated_at")
        return figures, float(at) if isinstance(at, int | float) else None

    def _sample(self, lease: Lease, now_wall: float) -> None:
        figures, at = self._published(lease)
        if at is not None and now_wall - at > self._worker_ttl:
            # Its owner stopped publishing (killed, or the whole fleet down): its last rate and
            # lag are no news; showing them on would draw a stopped application as a healthy one.
            figures, at = {}, None
        records = figures.get("records")
        key = lease.lease_key
        if lease.actual_owner is None or not isinstance(records, int) or at is None:
            self._counts.pop(key, None)
            self._rates[key] = None
        else:
            before = self._counts.get(key)
            count = _Count(lease.actual_owner, records, at)
            if before is None or before.owner != count.owner or count.records < before.records:
                # First seen, moved, or a new tenure counting from 0: no rate until a step.
                self._counts[key] = count
                self._rates[key] = None
            elif count.at - before.at >= self._step:  # over a step: counts published in bursts
                self._rates[key] = (count.records - before.records) / (count.at - before.at)
                self._counts[key] = count
        lag = figures.get("millis_behind_latest")
        lag = lag if isinstance(lag, int) else None
        rate = self._rates.get(key)
        if lag is None and rate is None:  # nothing to draw (the page breaks lines at gaps)
            return
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= self._max_series:
                self.series_limited = True
                return
            series = self._series[key] = Series()
        series.add(now_wall, lag, rate, step=self._step)

    def _sample_bytes(self) -> None:
        """Each worker's bytes/s from the totals it publishes (kept for live records only)."""
        for kept in (self._bytes, self._byte_rates):
            for gone in [w for w in kept if w not in self._statuses]:
                del kept[gone]
        for worker, status in self._statuses.items():
            total, at = status.get("bytes", 0), status.get("updated_at")
            if not isinstance(total, int) or not isinstance(at, int | float):
                continue
            before = self._bytes.get(worker)
            if before is None or total < before.records:  # first seen, or a restart
                self._bytes[worker] = _Count(worker, total, float(at))
                self._byte_rates[worker] = None
            elif at - before.at >= self._step:
                self._byte_rates[worker] = (total - before.records) / (at - before.at)
                self._bytes[worker] = _Count(worker, total, float(at))

    def _merge_events(self) -> None:
        published = [
            event for worker, status in self._statuses.items()
            for e in status.get("events", []) or [] if (event := event_of(e, worker)) is not None
        ]  # fmt: skip
        fresh = []
        for event in published:
            key = _event_key(event)
            if key not in self._seen_events:
                fresh.append(event)
                self._seen_events.add(key)
        fresh.sort(key=lambda e: e.get("at") or 0.0)
        self._events.extend(fresh)
        # What is remembered as seen is bounded by what is still shown or still published.
        self._seen_events &= {_event_key(e) for e in published} | {
            _event_key(e) for e in self._events
        }

    def _workers(self) -> list[dict[str, Any]]:
        held: dict[str, int] = {}
        load: dict[str, float] = {}
        for lease in self._leases:
            owner = lease.actual_owner
            if owner and lease.state(self._at).value == "ASSIGNED":
                held[owner] = held.get(owner, 0) + 1
                load[owner] = load.get(owner, 0.0) + (self._rates.get(lease.lease_key) or 0.0)
        rows = []
        for worker in sorted(set(held) | set(self._statuses)):
            status = self._statuses.get(worker, {})
            sink = status.get("sink")
            rows.append({
                "worker_id": worker,
                "live": is_live(status, self._at, self._worker_ttl)
                and not status.get("stopped"),
                "leases": held.get(worker, 0),
                "records_per_s": round(load.get(worker, 0.0), 2),
                "bytes_per_s": self._byte_rates.get(worker),
                "failures": status.get("failures", 0),
                "throttled": status.get("throttled", 0),
                "cpu_percent": status.get("cpu_percent"),
                "ready": status.get("ready"),
                "readiness": status.get("readiness", ""),
                "leader": bool(status.get("leader")),
                "assigns": bool(status.get("assigns")),
                "updated_at": status.get("updated_at"),
                "sink": {k: sink.get(k, 0) for k in SINK_FIGURES} if isinstance(sink, dict)
                else None,
            })  # fmt: skip
        return rows

    def snapshot(self) -> dict[str, Any]:
        rows = lease_rows(self._leases, self._statuses, self._at, silent_after=self._silent_after)
        places = layout(
            {x.lease_key: [x.sibling_key(p) for p in x.parent_shard_ids] for x in self._leases}
        )
        leases = []
        by_key = {x.lease_key: x for x in self._leases}
        for row in rows:
            item = asdict(row)
            lease = by_key[row.lease_key]
            item["parent_keys"] = sorted(lease.sibling_key(p) for p in lease.parent_shard_ids)
            item["records_per_s"] = self._rates.get(row.lease_key)
            item["checkpoint_moved_at"] = self._checkpoints.get(row.lease_key, ("", None))[1]
            item["column"], item["row"] = places.get(row.lease_key, (0, 0))
            leases.append(item)
        series = {  # rounded: the page polls this every few seconds
            key: {
                "t": [round(t, 1) for t in s.t],
                "lag": list(s.lag),
                "rate": [None if r is None else round(r, 2) for r in s.rate],
            }
            for key, s in self._series.items()
        }
        return {
            "application": self.application,
            "stream": self.stream,
            "version": __version__,  # of the process serving the page
            "generated_at": self._at,
            "suspended": self._suspended,
            "leases": leases,
            "workers": self._workers(),
            "series": series,
            "series_limited": self.series_limited,
            "step": self._step,
            "events": list(self._events)[::-1],  # newest first
        }
