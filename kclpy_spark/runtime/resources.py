"""What this process holds right now: descriptors, sockets, threads (also by pool), asyncio tasks,
memory and lease-store connections. Exported as Prometheus gauges (``kclpy_spark_open_sockets``
...; descriptors and memory by prometheus_client's process collector instead). A daemon that
runs for weeks must hold what is alive, not what ever ran: these are what an operator (and the
soak benchmark) watches for growth."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import threading
from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from checkpoint.base.threads import pool_limits

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_NUMBERED = re.compile(r"[-_]\d+")


def process_resources() -> dict[str, float]:
    """Descriptors, sockets, threads, asyncio tasks (of the running loop) and resident memory."""
    fds = sockets = 0
    try:
        entries = os.listdir("/proc/self/fd")
    except OSError:
        entries = []
    for entry in entries:
        fds += 1
        try:
            if os.readlink(f"/proc/self/fd/{entry}").startswith("socket:"):
                sockets += 1
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, for one)
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop in this thread
        tasks = 0
    try:
        with open("/proc/self/statm") as fh:
            rss = int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        rss = 0
    return {
        "open_fds": fds,
        "open_sockets": sockets,
        "threads": threading.active_count(),
        "asyncio_tasks": tasks,
        "rss_bytes": rss,
    }


def thread_pools() -> dict[str, int]:
    """Live threads by pool: each thread's name without its numbers (a pool of ours names its
    threads ``<prefix>_<n>``, Python ``Thread-<n> (<target>)``), so that a count that grows
    names the pool that grows it."""
    return dict(collections.Counter(_NUMBERED.sub("", t.name) for t in threading.enumerate()))


# What prometheus_client's ProcessCollector already exports (process_open_fds,
# process_resident_memory_bytes): not exported twice.
_STANDARD = frozenset({"open_fds", "rss_bytes"})


class ResourceCollector(Collector):
    """``kclpy_spark_<name>`` gauges for ``process_resources()`` and the lease store's
    connections (when the store counts them)."""

    def __init__(self, store_connections: Callable[[], int] | None = None) -> None:
        self._store_connections = store_connections

    def collect(self) -> Iterable[GaugeMetricFamily]:
        values = process_resources()
        if self._store_connections is not None:
            values["lease_store_connections"] = self._store_connections()
        for name, value in values.items():
            if name in _STANDARD:  # the process collector exports these in base form
                continue
            yield GaugeMetricFamily(
                f"kclpy_spark_{name}", f"This process's {name.replace('_', ' ')} now", value=value
            )
        pools = GaugeMetricFamily(
            "kclpy_spark_threads_by_pool",
            "This process's threads now, by pool (the thread's name without its numbers)",
            labels=["pool"],
        )
        for pool, count in sorted(thread_pools().items()):
            pools.add_metric([pool], count)
        yield pools
        limits = GaugeMetricFamily(
            "kclpy_spark_thread_pool_limit",
            "The most threads each pool may start (its size; pools that retire idle threads)",
            labels=["pool"],
        )
        by_name: collections.Counter[str] = collections.Counter()
        for prefix, limit in pool_limits().items():  # named as thread_pools() names its threads
            by_name[_NUMBERED.sub("", f"{prefix}_0")] += limit
        for pool, limit in sorted(by_name.items()):
            limits.add_metric([pool], limit)
        yield limits
