"""Helpers for tests that run real worker processes (`kclpy-spark run`) against LocalStack."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class WorkerProc:
    worker_id: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Fleet:
    """Worker processes sharing one config; each writes a log file in ``workdir``."""

    workdir: Path
    config: Path
    env: dict[str, str]
    procs: dict[str, WorkerProc] = field(default_factory=dict)

    def start(self, worker_id: str, *flags: str) -> WorkerProc:
        log = self.workdir / f"{worker_id}-{len(self.procs)}.log"
        fh = log.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.cli", "--log-level", "INFO", "run",
             "--config", str(self.config), "--worker-id", worker_id, *flags],
            stdout=fh, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir,
        )  # fmt: skip
        fh.close()
        self.procs[worker_id] = WorkerProc(worker_id, proc, log)
        return self.procs[worker_id]

    def kill(self, worker_id: str, sig: int = signal.SIGKILL) -> None:
        self.procs[worker_id].proc.send_signal(sig)

    def wait(self, worker_id: str, timeout: float) -> int:
        return self.procs[worker_id].proc.wait(timeout=timeout)

    def stop_all(self) -> None:
        for w in self.procs.values():
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for w in self.procs.values():
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(output: Path | None = None) -> dict[str, str]:
    """The environment of a `kclpy-spark` child process: this checkout first on PYTHONPATH, and
    where the sample processors write (KCLPY_SPARK_SAMPLE_OUTPUT) when ``output`` is given."""
    env = dict(os.environ)
    if output is not None:
        env["KCLPY_SPARK_SAMPLE_OUTPUT"] = str(output)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@contextmanager
def fleet(workdir: Path, config: str, output: Path) -> Iterator[Fleet]:
    cfg = workdir / "worker.toml"
    cfg.write_text(config)
    f = Fleet(workdir, cfg, worker_env(output))
    try:
        yield f
    finally:
        f.stop_all()


def read_output(output: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted(output.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


def wait_for(what: str, predicate: Callable[[], bool], timeout: float, step: float = 0.5) -> float:
    """Poll until ``predicate()``; returns the seconds it took; AssertionError naming ``what``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)
    return time.monotonic() - start


def produce(kinesis: Any, stream: str, numbers: range) -> dict[str, str]:
    """Put records whose data is their number; returns number -> shard id."""
    where: dict[str, str] = {}
    items = list(numbers)
    for i in range(0, len(items), 100):
        chunk = items[i : i + 100]
        pending = [{"Data": str(n).encode(), "PartitionKey": f"pk-{n}"} for n in chunk]
        while pending:
            resp = kinesis.put_records(StreamName=stream, Records=pending)
            retry = []
            for entry, result in zip(pending, resp["Records"], strict=True):
                if "ShardId" in result:
                    where[entry["Data"].decode()] = result["ShardId"]
                else:
                    retry.append(entry)
            pending = retry
    return where


def wait_active(kinesis: Any, stream: str) -> None:
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def spark_warnings(stderr: str) -> list[str]:
    """The Spark JVM's WARN, ERROR and FATAL lines in a daemon's text log (``jvm_logs``:
    ``<time> WARN    spark.<Class>: ...``)."""
    level = re.compile(r" (WARN|ERROR|FATAL) +spark\.")
    return [line for line in stderr.splitlines() if level.search(line)]
