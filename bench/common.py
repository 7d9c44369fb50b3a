"""Helpers shared by the benchmarks: imports from a checkout, machine facts, child runs, medians.

Benchmarks here run on a small machine shared with other work (2 cores, emulator included), so
each one measures its baseline in the same run, alternates the variants, repeats them, and reports
medians and ratios rather than absolute numbers alone.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
CACHE = REPO / ".cache" / "bench"

if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark child process: the checkout importable, dummy AWS
    credentials for local endpoints, no instance-metadata lookups."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("AWS_ACCESS_KEY_ID", "test")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env.update(extra)
    return env


def run_child(args: Sequence[str], *, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``python <args>``; its last stdout line is a JSON object, returned."""
    proc = subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"child {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def machine() -> str:
    """One line describing where a benchmark ran."""
    load = os.getloadavg()
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; load average at start "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (the cores are shared with other work)"
    )


def stamp() -> str:
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def write_results(name: str, text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path


class CpuMeter:
    """CPU seconds used by another process (an emulator) between ``start`` and ``stop``."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self._began = 0.0

    def total(self) -> float:
        """The process's CPU seconds so far (user and system)."""
        times = self._proc.cpu_times()
        return float(times.user + times.system)

    def start(self) -> None:
        self._began = self.total()

    def stop(self) -> float:
        return self.total() - self._began


class CpuTrace:
    """Another process's CPU seconds sampled every ``every`` s in a thread (with ``time.time()``),
    so the CPU it used between two wall-clock instants another process reported can be read."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        import threading

        self._meter = CpuMeter(pid)
        self._every = every
        self._samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._samples.append((time.time(), self._meter.total()))
            self._stop.wait(self._every)

    def __enter__(self) -> CpuTrace:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def samples(self) -> list[tuple[float, float]]:
        return list(self._samples)

    def between(self, start: float, end: float) -> float:
        """CPU seconds from ``start`` to ``end`` (epoch seconds)."""
        return cpu_between(self.samples, start, end)


def cpu_between(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds used from ``start`` to ``end``, from ``(time, cumulative CPU)`` samples in time
    order, each end interpolated linearly between the samples around it (held flat outside)."""

    def at(when: float) -> float:
        before = [s for s in samples if s[0] <= when] or list(samples[:1])
        after = [s for s in samples if s[0] >= when] or list(samples[-1:])
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 <= t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)

    return at(end) - at(start)


def wall() -> float:
    return time.perf_counter()


def require_endpoint(url: str, what: str = "LocalStack", start: str = "") -> None:
    """Exit with one line unless something listens at ``url`` (host and port): a benchmark that
    needs a local endpoint says so before it starts, instead of a stack of connection errors."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = (
        parts.hostname or "127.0.0.1",
        parts.port or (443 if parts.scheme == "https" else 80),
    )
    try:
        socket.create_connection((host, port), timeout=3.0).close()
    except OSError as exc:
        how = start or "start it with: python3 localstack/lsctl.py start"
        raise SystemExit(
            f"{what} is not reachable at {url} ({exc.strerror or exc}); {how}"
        ) from None


def reap(proc: subprocess.Popen[Any], timeout: float) -> int:
    """``proc``'s exit status, waiting at most ``timeout`` seconds after it was asked to stop;
    then it is killed (and waited for)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
