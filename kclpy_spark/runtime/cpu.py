"""The worker's CPU use, as KCL 3.x publishes it for load-aware balancing: the CPU seconds of this
process and its child processes (the Spark driver's JVM, a MultiLang child) over an interval, as a
percentage of the CPUs the process may use: the quota of its cgroup when one is set (a container,
a systemd unit with ``CPUQuota=``; kclpy_spark.runtime.cgroups), otherwise the CPUs it may run
on.

``CpuMeter.sample()`` gives the utilization since the previous sample (None at the first). The
worker samples it once per control round and publishes the figure in its status record
(``cpu_percent``: ``kclpy-spark status`` and the status page show it) and as the gauge
``kclpy_spark_cpu_utilization_ratio`` (a share). With it go ``cpu_settled`` (whether the worker
started or ended no consumer during the window the figure covers: ``sample(marker)``, the marker
being the consumer set's change count, the same at both ends), ``cpu_since`` (the wall time the
window began) and ``cpu_limit``. The load rule (kclpy_spark/moves/rules/cpu_load.py) balances CPU
only on settled figures whose window began after the worker's last lease move, so a move is never
judged on CPU measured before it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from kclpy_spark.runtime.cgroups import Read, cpu_quota

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_limit(read: Read = _read, cpus: int | None = None) -> float:
    """The CPUs this process may use: the CPU quota of its cgroup or of an ancestor (cgroup v2
    ``cpu.max`` or v1 CFS quota: kclpy_spark.runtime.cgroups), capped by the CPUs it may run on
    (``cpus``, default: its affinity)."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cpus = cpus or os.cpu_count() or 1
    quota = cpu_quota(read)
    return min(float(cpus), quota) if quota else float(cpus)


def children_cpu_seconds(read: Read = _read, pid: int | None = None) -> float:
    """CPU seconds of the live child processes of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for task in tasks:
        for child in (read(f"/proc/{pid}/task/{task}/children") or "").split():
            stat = read(f"/proc/{child}/stat")
            if stat:
                fields = stat.rsplit(")", 1)[-1].split()
                try:  # utime and stime: the 14th and 15th fields, 12th/13th after the name
                    total += (int(fields[11]) + int(fields[12])) / _TICKS
                except (IndexError, ValueError):
                    continue
    return total


class CpuMeter:
    def __init__(
        self,
        cpu_seconds: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        limit: float | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._cpu_seconds = cpu_seconds or (lambda: time.process_time() + children_cpu_seconds())
        self._monotonic = monotonic
        self.limit = limit if limit is not None else cpu_limit()
        self._last: tuple[float, float] | None = None
        self.last_percent: float | None = None
        self._marker: object = None
        self.settled = False  # last_percent measured over a window with one marker throughout
        self._wall = wall
        self._last_wall: float | None = None
        self.since: float | None = None  # wall time at which last_percent's window began

    def sample(self, marker: object = None) -> float | None:
        """Percent of ``limit`` CPUs used since the previous sample (0..100; None at first);
        ``settled`` says whether ``marker`` is what it was at the previous sample."""
        now, used = self._monotonic(), self._cpu_seconds()
        last, self._last = self._last, (now, used)
        previous, self._marker = self._marker, marker
        began, self._last_wall = self._last_wall, self._wall()
        if last is None or now <= last[0]:
            self.settled = False
            return None
        self.settled = previous == marker
        self.since = began
        # A child that ended takes its seconds with it: never below zero.
        share = max(0.0, used - last[1]) / ((now - last[0]) * self.limit)
        self.last_percent = round(min(100.0, 100.0 * share), 1)
        return self.last_percent
