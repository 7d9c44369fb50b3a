"""What a worker publishes about itself (its ``worker/<id>`` coordination record): for
``kclpy-spark status``, the status page and a duplicate worker id to find it. Small and bounded:
its held leases' figures, readiness, the last few lease events (of the last ten minutes) and,
with a Spark sink, the sink's totals."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from checkpoint.leasing.timing import LeaseTiming
from kclpy_spark.board.model import SINK_FIGURES
from kclpy_spark.logs import redact
from kclpy_spark.moves.rules.cpu_load import CPU_NOISE
from kclpy_spark.processor import ReportsSinkLanes
from kclpy_spark.runtime.identity import note_duplicate

if TYPE_CHECKING:
    from checkpoint.base.clock import Clock
    from checkpoint.coordination import StatusWriter
    from checkpoint.leasing.holder import LeaseHolder
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.cpu import CpuMeter
    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.health import Health
    from kclpy_spark.runtime.metrics import WorkerMetrics
    from kclpy_spark.runtime.run_state import RunView
    from shard_sync.leader import LeaderElection

EVENTS_PUBLISHED = 10
# ... of the last this many seconds: a quiet worker's record stays under 1 KB (one write unit
# per publish, and less for every Scan to read); a status page running meanwhile keeps them.
EVENTS_PUBLISHED_FOR = 600.0
# The per-lease figures of one status record (the Spark sink's) stay under this many bytes of
# JSON: DynamoDB refuses an item over 400 KB, and each KB costs a write unit at every publish.
LEASE_FIGURES_BYTES = 32_768
# The stream keys a worker with [[streams]] consumes (for whoever gives it leases), while they
# fit in this many bytes; past it none are named, and it is taken to consume every stream.
STREAMS_PUBLISHED_BYTES = 32_768
log = logging.getLogger(__name__)


def sink_figures(registry: CollectorRegistry) -> dict[str, float] | None:
    """The Spark sink's totals from a worker's metrics registry, or None without a sink (one
    pass over the registry: each collection reads every collector)."""
    wanted = {f"kclpy_spark_sink_{k}": k for k in SINK_FIGURES}
    figures: dict[str, float] = {}
    for metric in registry.collect():
        if metric.name in wanted:
            figures[wanted[metric.name]] = float(metric.samples[0].value) if metric.samples else 0.0
    if not figures:
        return None
    return {k: figures.get(k, 0.0) for k in SINK_FIGURES}


def sink_lanes(factory: object) -> dict[str, dict[str, Any]]:
    """The Spark sink's lanes by lease key (``{}`` for RecordProcessors, or when the sink cannot
    say: publishing the rest of the status must not depend on it)."""
    if not isinstance(factory, ReportsSinkLanes):
        return {}
    try:
        lanes = factory.sink_lanes()
    except Exception:
        log.exception("could not read the Spark sink's lanes for the status record")
        return {}
    return lanes if isinstance(lanes, dict) else {}


class StatusSource(Protocol):
    """What a worker's status payload is made of (the worker is one)."""

    @property
    def cfg(self) -> WorkerConfig: ...
    @property
    def processor_factory(self) -> object: ...
    @property
    def holder(self) -> LeaseHolder: ...
    @property
    def cpu(self) -> CpuMeter: ...
    @property
    def run_state(self) -> RunView: ...
    @property
    def leader(self) -> LeaderElection: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def timing(self) -> LeaseTiming: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    def readiness(self) -> tuple[bool, str]: ...
    def consumed_streams(self) -> list[str] | None: ...


@dataclass(frozen=True)
class StatusSnapshot:
    """A worker's status payload as of one control round, kept as the JSON text it publishes, so
    no reader can change what another reads (``payload()`` gives each reader its own copy)."""

    text: str
    at: float  # wall time of the round that made it

    def payload(self) -> dict[str, Any]:
        parsed = json.loads(self.text)
        return parsed if isinstance(parsed, dict) else {}


class LatestStatus:
    """The last ``StatusSnapshot`` the worker published: replaced whole at each control round,
    read by the status page (``board.feed.WorkerBoard``) without touching the worker."""

    def __init__(self) -> None:
        self._last: StatusSnapshot | None = None

    def put(self, payload: dict[str, Any], at: float) -> None:
        self._last = StatusSnapshot(json.dumps(payload, separators=(",", ":")), at)

    def get(self) -> StatusSnapshot | None:
        return self._last


def publish_snapshot(worker: StatusSource, latest: LatestStatus, now_wall: float) -> dict[str, Any]:
    """The status page's view of ``worker`` now: put after every control round whatever it came
    to (a failed read included), at start and when the worker is suspended. Returns the payload
    (the round's status record, when due, is written from it)."""
    payload = status_payload(worker, now_wall)
    latest.put(payload, now_wall)
    return payload


class StatusPublisher(StatusSource, Protocol):
    """A worker that writes its status record at the cadence's rounds (the worker is one)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def status_writer(self) -> StatusWriter: ...
    @property
    def status_cadence(self) -> StatusCadence: ...
    @property
    def health(self) -> Health: ...


def status_payload(worker: StatusSource, now_wall: float) -> dict[str, Any]:
    # Per lease only what renewals do not write into the lease itself (records, lag and the
    # renewal time ride on them): the Spark sink's batches in flight and rows buffered.
    leases: dict[str, Any] = {}
    lanes = sink_lanes(worker.processor_factory)
    for held in worker.holder.held():
        lane = lanes.get(held.lease_key)
        if lane is not None:
            leases[held.lease_key] = {
                "sink_in_flight": lane.get("in_flight_batches", 0),
                "sink_buffered": lane.get("buffered_rows", 0),
            }
    ready, why = worker.readiness()
    leases, omitted = bounded(leases, LEASE_FIGURES_BYTES)
    payload = status_fields(
        ready=ready, readiness=why, cpu_percent=_rounded(worker.cpu.last_percent, 2),
        suspended=worker.run_state.suspended, leader=worker.leader.is_leader,
        assigns=worker.leader.assigning,  # the leader that assigns leases (not every one does)
        leases=leases, leases_omitted=omitted,
        events=published_events(worker.events.recent(EVENTS_PUBLISHED), now_wall),
        live_for=worker.timing.status_quiet_max_age if worker.holder.held() else None,
        totals=worker.metrics.totals(),
        streams=published_streams(worker.consumed_streams()),
    )  # fmt: skip
    if worker.cfg.load_metric == "auto":  # else others must not balance CPU with us
        since = worker.cpu.since  # rounded down: a figure may only look older, never newer
        since = math.floor(since * 10) / 10 if isinstance(since, float) else since
        payload |= {"cpu_settled": worker.cpu.settled, "cpu_since": since,
                    "cpu_limit": worker.cpu.limit}  # fmt: skip
    sink = sink_figures(worker.metrics.registry)
    if sink is not None:
        payload["sink"] = sink
    return payload


def status_fields(
    *,
    ready: bool,
    readiness: str,
    cpu_percent: float | None,
    suspended: bool,
    leader: bool,
    assigns: bool,
    leases: dict[str, Any],
    leases_omitted: int,
    events: list[list[Any]],
    live_for: float | None = None,
    totals: dict[str, int] | None = None,
    streams: list[str] | None = None,
) -> dict[str, Any]:
    """A status record's fields, those at their default left out: every take round's scan reads
    every status record (DynamoDB: the coordination table's Scan). Readers take a missing one
    as its default (false, 0, none, no readiness reason: only a reason other than "ready" is
    written; and for how long the record says its worker runs, ``live_for``, the reader's own
    figure)."""
    optional = {
        # redacted as events are: an exception's text in a reason may carry a password
        "readiness": redact(readiness) if readiness != "ready" else None,
        "suspended": suspended,
        "leader": leader,
        "assigns": assigns,
        "leases": leases,
        "leases_omitted": leases_omitted,
        "events": events,
        "live_for": None if live_for is None else round(live_for, 1),
        **(totals or {}),  # bytes, failures, throttled: for the status page (not a write cause)
    }
    fields: dict[str, Any] = {"ready": ready, "cpu_percent": cpu_percent}
    fields |= {k: v for k, v in optional.items() if v}
    if streams is not None:  # the stream keys of a worker with [[streams]], even none
        fields["streams"] = streams
    return fields


def published_streams(stream_keys: list[str] | None) -> list[str] | None:
    """The stream keys a status record names: a multi-stream worker's, even none (its streams
    not open yet: given leases, it would not take them); None (the field left out, and its
    readers take the worker to consume every stream): one stream per table, or too many to fit
    ``STREAMS_PUBLISHED_BYTES``."""
    if stream_keys is None or sum(len(k) + 3 for k in stream_keys) > STREAMS_PUBLISHED_BYTES:
        return None
    return sorted(stream_keys)


class StatusCadence:
    """When a worker writes its status record (its control round asks every lease duration).

    A worker holding leases (its record says ``live_for``: the readers' time it runs after
    the write) writes when something a reader acts on changed since its last write (its
    readiness, roles, lease figures, events, the Spark sink's totals, whether its CPU figure
    is settled, or the figure itself by ``cpu_band`` points: two figures each off by half of
    CPU_NOISE differ by no more than the noise the load rule allows for), once more at the
    round after such a change (a reader that saw a lease move after the changed figure's
    window began gets a figure whose window began after it), and otherwise every
    ``quiet_interval``. Its lease renewals show it alive meanwhile. A worker holding no lease
    writes every round: its record is all that shows it runs. A write that failed is not
    noted, so the next round tries again. Not thread-safe: the control round's alone."""

    # The window's start moves at every round; the totals move with every record (they ride
    # along on the writes other changes or the quiet interval make).
    IGNORED = ("cpu_percent", "cpu_since", "bytes", "failures", "throttled")

    def __init__(
        self, quiet_interval: float, round_interval: float, cpu_band: float = CPU_NOISE / 2
    ) -> None:
        self._quiet = quiet_interval
        self._slack = round_interval / 2  # rounds come late or early by a little
        self._band = cpu_band
        self._last: dict[str, Any] | None = None
        self._at = float("-inf")
        self._why: str | None = None  # why the last payload asked about is due
        self._follow = False  # the last write was for a change: write at the next round too

    @classmethod
    def of(cls, timing: LeaseTiming) -> StatusCadence:
        """A worker's: quiet writes every ``timing.status_quiet_interval``, rounds every lease
        duration."""
        return cls(timing.status_quiet_interval, timing.lease_duration)

    def due(self, payload: dict[str, Any], now: float) -> bool:
        """Whether ``payload`` should be written at ``now`` (monotonic seconds)."""
        self._why = self.reason(payload, now)
        return self._why is not None

    def reason(self, payload: dict[str, Any], now: float) -> str | None:
        """Why ``payload`` is due at ``now``, or None: "first", "no lease", "changed",
        "after a change" or "quiet interval"."""
        if self._last is None:
            return "first"
        if not payload.get("live_for"):
            return "no lease"
        if self.changed(self._last, payload):
            return "changed"
        if self._follow:
            return "after a change"
        if now - self._at >= self._quiet - self._slack:
            return "quiet interval"
        return None

    def wrote(self, payload: dict[str, Any], now: float) -> None:
        self._follow = self._why == "changed"
        self._last, self._at = dict(payload), now

    def changed(self, last: dict[str, Any], new: dict[str, Any]) -> bool:
        """Whether ``new`` tells a reader something ``last`` did not."""
        strip = self.IGNORED
        if {k: v for k, v in last.items() if k not in strip} != {
            k: v for k, v in new.items() if k not in strip
        }:
            return True
        before, now = last.get("cpu_percent"), new.get("cpu_percent")
        if not isinstance(before, int | float) or not isinstance(now, int | float):
            return before != now
        return abs(now - before) >= self._band


async def publish_if_due(
    worker: StatusPublisher,
    io: Callable[..., Awaitable[Any]],
    now_wall: float,
    payload: dict[str, Any] | None = None,
) -> None:
    """The control round's status write of ``payload`` (made now if not given), when
    ``worker.status_cadence`` says it is due; a duplicate worker id it reveals goes to health
    (kclpy_spark.runtime.identity)."""
    payload = status_payload(worker, now_wall) if payload is None else payload
    if not worker.status_cadence.due(payload, worker.clock.monotonic()):
        return
    other = await io(worker.status_writer.publish, payload, now_wall)
    worker.status_cadence.wrote(payload, worker.clock.monotonic())
    note_duplicate(worker.health, worker.cfg.worker_id, other)


def _rounded(value: Any, digits: int) -> Any:
    """A published figure to ``digits`` decimals (fewer bytes for every Scan); None and other
    types as they are."""
    return round(value, digits) if isinstance(value, float) else value


def published_events(events: list[dict[str, Any]], now_wall: float) -> list[list[Any]]:
    """The events a status record carries: those of the last EVENTS_PUBLISHED_FOR seconds, each
    as ``[at, kind, lease key, detail]`` (the worker is the record's; the time to a tenth of a
    second). Half the bytes of the event as a dict: every take round's scan reads them, and a
    table over 4 KB costs a read unit per Scan instead of half of one. Readers take both
    forms (``board.model.event_of``); an older reader skips this one."""
    return [
        [round(e["at"], 1), e["kind"], e["lease_key"], e["detail"]]
        for e in events
        if now_wall - e["at"] <= EVENTS_PUBLISHED_FOR
    ]


def bounded(leases: dict[str, Any], budget: int) -> tuple[dict[str, Any], int]:
    """The figures of as many leases as fit in ``budget`` bytes of JSON, those with the most rows
    buffered first (then by key); and how many were left out."""
    if len(json.dumps(leases)) <= budget:  # with spaces: what is written is smaller
        return leases, 0

    def order(key: str) -> tuple[float, str]:
        buffered = leases[key].get("sink_buffered")
        return (-float(buffered) if isinstance(buffered, int | float) else 0.0, key)

    kept: dict[str, Any] = {}
    used = 2
    for key in sorted(leases, key=order):
        entry = len(json.dumps({key: leases[key]})) + 1
        if used + entry <= budget:
            kept[key] = leases[key]
            used += entry
    return kept, len(leases) - len(kept)
