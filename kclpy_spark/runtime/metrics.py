"""Prometheus metrics of one worker, and a small HTTP server for /metrics, /healthz and /readyz.

One registry per worker (not the process-global one), so several workers in one process (tests)
keep separate figures. The server binds 127.0.0.1 unless told otherwise.

Labels: every series carries ``application`` and ``worker`` (added at exposition); per-shard
series add ``stream`` and ``shard`` (the shard id). What that costs: per shard this worker holds
now, six series (records, bytes, lag, processing failures, KPL sub-records out of range, reads
refused for the shard's limits; all dropped when the tenure ends); per worker about fifty more
that do not grow with shards (leases, renewals, checkpoint latency buckets, the sink's and the
coordination counters, the process's resources).
"""

from __future__ import annotations

import contextlib
import logging
import platform
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from checkpoint.base.errors import ConfigError
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import split_lease_key, stream_key_parts
from checkpoint.port import CountsConnections, MetersCapacity
from checkpoint.stores.capacity import CapacityMeter
from kclpy_spark._version import __version__
from kclpy_spark.board.routes import Snapshot, add_routes, host_guard
from kclpy_spark.config import WorkerConfig
from kclpy_spark.logs import redact
from kclpy_spark.processor import ExportsMetrics
from kclpy_spark.runtime.events import EventLog

log = logging.getLogger(__name__)


class _CoordinationCollector(Collector):
    def __init__(self, counters: CoordinationCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterable[CounterMetricFamily]:
        for name, value in self._counters.snapshot().items():
            yield CounterMetricFamily(
                f"kclpy_spark_coordination_{_snake(name)}",
                f"Source-coordination counter {name} (Data Prepper's name)",
                value=value,
            )


def _snake(name: str) -> str:
    """``partitionsCreated`` -> ``partitions_created`` (Prometheus names are snake case)."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


class _ReadinessCollector(Collector):
    """``kclpy_spark_ready``: 1 while /readyz answers 200 (its reason is free text: /readyz and
    the log have it; as a label it would make one series per wording)."""

    def __init__(self, ready: Callable[[], tuple[bool, str]]) -> None:
        self._ready = ready

    def collect(self) -> Iterable[GaugeMetricFamily]:
        ok, _ = self._ready()
        yield GaugeMetricFamily(
            "kclpy_spark_ready", "1 while the worker is ready (/readyz answers 200)", value=ok
        )


class _CapacityCollector(Collector):
    """The DynamoDB lease table's requests and consumed capacity units, by operation."""

    def __init__(self, meter: CapacityMeter) -> None:
        self._meter = meter

    def collect(self) -> Iterable[CounterMetricFamily]:
        requests = CounterMetricFamily(
            "kclpy_spark_lease_table_requests",
            "Requests on the DynamoDB lease table",
            labels=["operation"],
        )
        units = CounterMetricFamily(
            "kclpy_spark_lease_table_capacity_units",
            "Capacity units the DynamoDB lease table's requests consumed (read units for "
            "GetItem, Scan and Query; write units for the others)",
            labels=["operation"],
        )
        for operation, usage in sorted(self._meter.snapshot().items()):
            requests.add_metric([operation], usage.requests)
            units.add_metric([operation], usage.units)
        yield requests
        yield units


SHARD_LABELS = ("stream", "shard")


class _WithLabels:
    """A registry's metrics with constant labels added to every sample (at exposition)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self._registry = registry
        self._labels = labels

    def collect(self) -> Iterable[Any]:
        for metric in self._registry.collect():
            # No ``_created`` samples: nothing reads them, and beside each counter they nearly
            # doubled every per-shard family (dropped here, not for the whole process: a Spark
            # driver running the readStream source has its own counters).
            metric.samples = [
                Sample(s.name, {**self._labels, **s.labels}, s.value, s.timestamp, s.exemplar)
                for s in metric.samples
                if not s.name.endswith("_created")
            ]
            yield metric


class WorkerMetrics:
    def __init__(
        self,
        counters: CoordinationCounters,
        events: EventLog | None = None,
        *,
        application: str = "",
        worker: str = "",
        stream: str = "",
        shared_names: frozenset[str] = frozenset(),
    ) -> None:
        # Recent lease events (takes, losses, parkings, ...) for the published status and page.
        self.events = events or EventLog(worker, time.time)
        self._stream = stream  # the stream of a plain shard-id lease key
        self._shared_names = shared_names  # stream names of two accounts: ``shard``'s labels
        self._constant = {"application": application, "worker": worker}
        self._retired: dict[str, float] = {}  # totals of the shards whose series were dropped
        self.registry = CollectorRegistry()
        r = self.registry
        self.records = Counter(
            "kclpy_spark_records_processed", "Records delivered to processors", SHARD_LABELS,
            registry=r,
        )  # fmt: skip
        self.bytes = Counter(
            "kclpy_spark_bytes_processed", "Record data bytes delivered", SHARD_LABELS, registry=r
        )
        self.behind = Gauge(
            "kclpy_spark_behind_latest_seconds",
            "How far the last batch was behind the shard's tip (MillisBehindLatest / 1000)",
            SHARD_LABELS,
            registry=r,
        )
        self.leases_held = Gauge("kclpy_spark_leases_held", "Leases held now", registry=r)
        self.cpu_ratio = Gauge(
            "kclpy_spark_cpu_utilization_ratio",
            "CPU used by this process and its children over the last status interval, as a "
            "share of the CPUs it may use (cgroup quota or affinity; 1 = all of them)",
            registry=r,
        )
        self._about(r)
        self.renewals = Counter("kclpy_spark_lease_renewals", "Successful renewals", registry=r)
        skipped = "Renewals not made: a checkpoint had moved the lease's counter lately"
        self.renewals_skipped = Counter("kclpy_spark_lease_renewals_skipped", skipped, registry=r)
        self.renewal_failures = Counter(
            "kclpy_spark_lease_renewal_failures", "Renewals that raised", registry=r
        )
        self.leases_lost = Counter("kclpy_spark_leases_lost", "Leases lost", registry=r)
        self.loop_stalls = Counter(
            "kclpy_spark_event_loop_stalls",
            "Times the worker's event loop, where renewals are scheduled, was blocked for a "
            "quarter of the failover time or longer (an async processor method that blocks)",
            registry=r,
        )
        self._lease_moves(r)
        self.checkpoint_seconds = Histogram(
            "kclpy_spark_checkpoint_seconds", "Checkpoint write latency", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )  # fmt: skip
        self._shard_problems(r)
        self._repairs(r)
        r.register(_CoordinationCollector(counters))

    def _about(self, r: CollectorRegistry) -> None:
        """The version, and how long processor calls take."""
        self.process_seconds = Histogram(
            "kclpy_spark_process_records_seconds",
            "How long each process_records call that returned took (the Spark sink's: until its "
            "batch was taken, not written)",
            registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
        )
        build = Gauge("kclpy_spark_build_info", "1, labelled with this worker's version",
                      ["version", "python"], registry=r)  # fmt: skip
        build.labels(__version__, platform.python_version()).set(1)

    def _repairs(self, r: CollectorRegistry) -> None:
        """What this worker repaired in the lease table (counted, never expected)."""
        self.false_ends_reopened = Counter(
            "kclpy_spark_false_shard_ends_reopened",
            "Leases checkpointed at SHARD_END on a shard ListShards shows open, reopened at "
            "TRIM_HORIZON by this worker's shard sync",
            registry=r,
        )
        self.corrupt_lease_reads = Counter(
            "kclpy_spark_corrupt_lease_reads",
            "Lease-table reads that failed on an item no code can read (/readyz names it)",
            registry=r,
        )
        self.vanished_leases_restored = Counter(
            "kclpy_spark_vanished_leases_restored",
            "Held leases whose item vanished from the table, put back at their last checkpoint",
            registry=r,
        )

    def reopened(self, lease_key: str) -> None:
        """A false SHARD_END this worker's shard sync replaced (shard_sync/false_ends.py)."""
        self.false_ends_reopened.inc()
        self.events.add(lease_key, "reopened", "SHARD_END on an open shard; from TRIM_HORIZON")

    def restored(self, lease_key: str) -> None:
        """A held lease whose item vanished, put back (checkpoint/leasing/vanished.py)."""
        self.vanished_leases_restored.inc()
        self.events.add(lease_key, "restored", "its item vanished; put back at its checkpoint")

    def _lease_moves(self, r: CollectorRegistry) -> None:
        """Leases arriving here, and hand-offs asked for."""
        # A lease that moves counts once: where it arrives (a take, or a steal without hand-off);
        # a graceful steal's ask is a hand-off asked, and its arrival a take (of a handed lease).
        self.takes = Counter(
            "kclpy_spark_lease_takes",
            "Leases taken: free, from a worker that stopped renewing, or handed over to this one",
            registry=r,
        )
        self.steals = Counter(
            "kclpy_spark_lease_steals",
            "Leases stolen without a hand-off (graceful_handoff = false)",
            registry=r,
        )
        self.handoffs_asked = Counter(
            "kclpy_spark_lease_handoffs_asked",
            "Graceful hand-offs this worker asked for to balance the leases (to itself, or as "
            "the leader to another worker); the lease counts as a take where it arrives",
            registry=r,
        )

    def _shard_problems(self, r: CollectorRegistry) -> None:
        """The per-shard series of what went wrong (dropped with the shard's others)."""
        self.processing_failures = Counter(
            "kclpy_spark_processing_failures", "process_records calls that raised", SHARD_LABELS,
            registry=r,
        )  # fmt: skip
        self.read_throttled = Counter(
            "kclpy_spark_read_throttled",
            "Calls for the shard refused as over a limit: GetRecords over its read limits "
            "(ProvisionedThroughputExceeded), throttled GetShardIterator or SubscribeToShard. "
            "Steadily above 0 on GetRecords: other readers share the shard (lower "
            "max_read_bytes_per_second, or use enhanced fan-out)",
            SHARD_LABELS,
            registry=r,
        )
        self.kpl_out_of_range = Counter(
            "kclpy_spark_kpl_subrecords_out_of_range",
            "KPL sub-records skipped because their hash key lies outside the shard's range",
            SHARD_LABELS,
            registry=r,
        )

    def shard(self, lease_key: str) -> tuple[str, str]:
        """The (stream, shard) label values of a lease key; the stream ``account:name`` for a
        name configured streams of two accounts share (their series were one, and one tenure's
        end dropped both)."""
        stream_key, shard_id = split_lease_key(lease_key)
        parts = stream_key_parts(stream_key)
        if parts is None:
            return self._stream, shard_id
        account, name, _ = parts
        return (f"{account}:{name}" if name in self._shared_names else name), shard_id

    def forget(self, lease_key: str) -> None:
        """A tenure ended: drop every series of the shard, so what a worker exports is bounded
        by the leases it holds (a lag gauge left behind would alert falsely; counters of shards
        that moved away or ended would pile up over weeks of moves and reshards). A lease that
        comes back counts from 0 again, which Prometheus' rate() reads as a counter reset."""
        metrics: list[Counter | Gauge] = [
            self.behind, self.records, self.bytes, self.processing_failures,
            self.kpl_out_of_range, self.read_throttled,
        ]  # fmt: skip
        shard = self.shard(lease_key)
        for name, counter in self._summed().items():  # the worker's totals keep what it counted
            self._retired[name] = self._retired.get(name, 0.0) + _sum(counter, shard)
        for metric in metrics:
            with contextlib.suppress(KeyError):
                metric.remove(*shard)

    def _summed(self) -> dict[str, Counter]:
        return {"bytes": self.bytes, "failures": self.processing_failures,
                "throttled": self.read_throttled}  # fmt: skip

    def totals(self) -> dict[str, int]:
        """Bytes delivered, failed process_records calls and refused reads since the worker
        started, over every shard it ever held (the status page's figures)."""
        return {
            name: int(self._retired.get(name, 0.0) + _sum(counter, None))
            for name, counter in self._summed().items()
        }

    def watch_resources(self, store_connections: Callable[[], int] | None = None) -> None:
        """Export this process's resources: prometheus_client's process and platform collectors
        (``process_open_fds``, ``process_resident_memory_bytes``, ``process_cpu_seconds_total``,
        ``python_info``, ...) and ours (``kclpy_spark_open_sockets``, ...: resources.py)."""
        from kclpy_spark.runtime.resources import ResourceCollector

        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(ResourceCollector(store_connections))

    def watch_readiness(self, ready: Callable[[], tuple[bool, str]]) -> None:
        """Export ``kclpy_spark_ready`` from the worker's readiness check."""
        self.registry.register(_ReadinessCollector(ready))

    def exposition(self) -> bytes:
        return generate_latest(_WithLabels(self.registry, self._constant))


def _sum(counter: Counter, shard: tuple[str, str] | None) -> float:
    """A labelled counter's total, over every shard or one (stream, shard)."""
    total = 0.0
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and (
                shard is None or (sample.labels.get("stream"), sample.labels.get("shard")) == shard
            ):
                total += sample.value
    return total


def shared_stream_names(cfg: WorkerConfig) -> frozenset[str]:
    """The names of configured streams that more than one configured stream has (in other
    accounts, named by their ARNs)."""
    names = [spec.name for spec in cfg.streams]
    return frozenset(name for name in names if names.count(name) > 1)


def worker_metrics(
    cfg: WorkerConfig,
    counters: CoordinationCounters,
    processor_factory: object,
    store: object,
    events: EventLog,
) -> WorkerMetrics:
    """A worker's metrics: its own, the Spark sink's (when the processor factory has them) and
    the process's resources (with the SQLite store's open connections)."""
    metrics = WorkerMetrics(
        counters,
        events,
        application=cfg.application_name,
        worker=cfg.worker_id,
        stream=cfg.stream_name or cfg.stream.rsplit("/", 1)[-1],
        shared_names=shared_stream_names(cfg),
    )
    if isinstance(processor_factory, ExportsMetrics):
        metrics.registry.register(processor_factory.metrics_collector())
    if isinstance(store, MetersCapacity) and isinstance(store.capacity, CapacityMeter):
        metrics.registry.register(_CapacityCollector(store.capacity))
    pool = store if isinstance(store, CountsConnections) else None
    metrics.watch_resources((lambda: pool.open_connections) if pool is not None else None)
    return metrics


# How long a connection may stay open without a request. aiohttp's own default kept one that
# never sent anything for an hour: any peer that reaches the port (metrics_host 0.0.0.0, as
# Prometheus needs) could hold the worker's file descriptors until its AWS calls failed.
IDLE_CONNECTION_SECONDS = 15.0


class StatusServer:
    """``/metrics`` (Prometheus text), ``/healthz`` (the event loop answers), ``/readyz`` (the
    worker started and its last lease-table round trip succeeded recently), and with ``board``
    the read-only status page (``/``, ``/status``, ``/status.json``: board/routes.py)."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        ready: Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        board: Snapshot | None = None,
        host_names: tuple[str, ...] = (),
        idle_seconds: float = IDLE_CONNECTION_SECONDS,
    ) -> None:
        self._idle_seconds = idle_seconds
        self._metrics = metrics
        self._host_names = host_names  # names besides addresses and this host's (routes.py)
        self._board = board  # the status page's snapshot (the page is served when given)
        self._ready = ready
        self._host = host
        self._port = port
        self._runner: Any = None
        self.port: int | None = None

    async def start(self) -> None:
        from aiohttp import web

        from kclpy_spark.runtime.http_site import CappedSite, status_runner

        async def metrics(_: web.Request) -> web.Response:
            body = self._metrics.exposition()
            return web.Response(body=body, content_type="text/plain", charset="utf-8")

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text=f"ok {time.time():.0f}\n")

        async def readyz(_: web.Request) -> web.Response:
            ok, why = self._ready()
            return web.Response(text=redact(why) + "\n", status=200 if ok else 503)

        app = web.Application(middlewares=[host_guard(self._host_names)])
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        if self._board is not None:
            add_routes(app, self._board)
        self._runner = status_runner(app, self._idle_seconds)
        await self._runner.setup()
        site = CappedSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:  # port in use, host that does not resolve or is not ours
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(
                f"config 'metrics_port' / 'metrics_host': cannot listen on "
                f"{self._host}:{self._port}: {exc.strerror or exc}"
            ) from None
        self.port = site.sockets[0].getsockname()[1] if site.sockets else self._port
        shown = f"[{self._host}]" if ":" in self._host else self._host  # IPv6 in a URL
        log.info("metrics and health on http://%s:%s/metrics", shown, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
