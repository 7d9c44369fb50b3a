"""``kclpy-spark demo``: the whole path, as a user runs it. A stream on the local endpoint, two
worker daemons (``kclpy-spark run`` with a ``[sink]`` table: Spark ``local[1]`` writing the
built-in Parquet sink, the embedded SQLite lease store shared between them), a steady producer,
a split of a shard, one worker killed with -9 and restarted. It ends with what a user can check:
records produced, rows written, distinct rows, children written after their parents, the final
checkpoints, and the lag per shard over the run (terminal chart, and a PNG with matplotlib).

Every worker is a real process with its own JVM; the demo itself only produces, watches (the
workers' /metrics, the lease table, the Parquet table with pyarrow) and reports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kclpy_spark.demo import create_demo_stream
from kclpy_spark.demo.chart import png_chart, terminal_chart
from kclpy_spark.demo.table import ParquetView

WORKERS = ("worker-a", "worker-b")


@dataclass(eq=False)
class Producer(threading.Thread):
    """PutRecords of numbered JSON records, ``rate`` per second, until stopped."""

    kinesis: Any
    stream: str
    rate: float
    produced: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True, name="demo-producer")

    def run(self) -> None:
        per_put = max(1, int(self.rate / 2))
        while not self.stop.wait(0.5):
            entries = [
                {"Data": json.dumps({"n": n}).encode(), "PartitionKey": f"key-{n}"}
                for n in range(self.produced, self.produced + per_put)
            ]
            while entries:
                resp = self.kinesis.put_records(StreamName=self.stream, Records=entries)
                entries = [
                    e for e, r in zip(entries, resp["Records"], strict=True) if "ShardId" not in r
                ]
            self.produced += per_put


@dataclass
class WorkerProcess:
    worker_id: str
    config: Path
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kclpy_spark.cli", "--log-level", "WARNING", "run",
                 "--config", str(self.config), "--worker-id", self.worker_id,
                 "--metrics-port", str(self.port)],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and its JVM
            self.proc.wait()

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def lag(self) -> dict[str, float]:
        """MillisBehindLatest per shard from this worker's /metrics ({} if it does not answer)."""
        try:
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("kclpy_spark_behind_latest_seconds{"):
                labels, _, value = line.rpartition(" ")
                shard = labels.split('shard="', 1)[1].split('"', 1)[0]
                out[shard] = float(value) * 1000
        return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(work: Path, stream: str, endpoint: str, read_on: str = "driver") -> Path:
    config = work / "app.toml"
    config.write_text(
        f"""# The demo's application: what `kclpy-spark run --config {config}` runs.
application_name = "{stream}"
stream_name = "{stream}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{work / "leases.db"}"
failover_time = 6.0
idle_time_between_reads = 0.5
max_records = 50
shard_sync_interval = 5.0
parent_shard_poll_interval = 1.0

[sink]
sink = "parquet:{work / "table"}"
spark_target = "local[1]"
max_wait = 2.0
read_on = "{read_on}"

[sink.spark_conf]
"spark.sql.shuffle.partitions" = "1"
"spark.driver.memory" = "512m"
"""
    )
    return config


@dataclass
class Run:
    """What the demo saw: lag samples per shard, and events with their times."""

    started: float = field(default_factory=time.monotonic)
    lag: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    events: list[tuple[float, str]] = field(default_factory=list)

    def at(self) -> float:
        return time.monotonic() - self.started

    def say(self, what: str) -> None:
        self.events.append((self.at(), what))
        print(f"[{self.at():5.0f}s] {what}", flush=True)

    def sample(self, workers: list[WorkerProcess]) -> None:
        now = self.at()
        seen: dict[str, float] = {}
        for w in workers:
            seen.update(w.lag())
        for shard in set(seen) | set(self.lag):
            self.lag.setdefault(shard, []).append((now, seen.get(shard)))


def _split_first(kinesis: Any, stream: str) -> str:
    first = kinesis.list_shards(StreamName=stream)["Shards"][0]
    lo = int(first["HashKeyRange"]["StartingHashKey"])
    hi = int(first["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(
        StreamName=stream, ShardToSplit=first["ShardId"], NewStartingHashKey=str((lo + hi) // 2)
    )
    return str(first["ShardId"])


def _script(args: argparse.Namespace) -> list[tuple[float, str]]:
    """When each scripted step happens, in seconds after the workers start."""
    s = float(args.seconds)
    return [(0.35 * s, "split"), (0.55 * s, "kill"), (0.70 * s, "restart"), (s, "stop")]


def run_pipeline_demo(args: argparse.Namespace) -> int:
    import importlib.util

    from checkpoint.base.errors import ConfigError
    from kclpy_spark.aws import boto3_client
    from kclpy_spark.config import WorkerConfig

    missing = [m for m in ("pyspark", "pyarrow", "pandas") if importlib.util.find_spec(m) is None]
    if missing:  # before a stream is made: its workers would stop at once
        raise ConfigError(
            f"the Spark demo needs {', '.join(missing)}, which this install lacks: pip install "
            "'kclpy-spark[spark]' (or `kclpy-spark demo --processor` runs one without Spark)"
        )

    stamp = time.strftime("%Y%m%d-%H%M%S")
    stream = f"kclpy-spark-demo-{stamp}"
    work = (Path(".cache") / "demo" / stamp).resolve()
    kinesis = boto3_client("kinesis", WorkerConfig(stream_name=stream, endpoint_url=args.endpoint))
    create_demo_stream(kinesis, stream, args.shards, args.endpoint)
    work.mkdir(parents=True, exist_ok=True)
    config = write_config(work, stream, args.endpoint, args.read_on)
    print(f"kclpy-spark demo: stream {stream} ({args.shards} shards) on {args.endpoint}")
    print(f"  two workers run `kclpy-spark run --config {config}`; output in {work}")
    workers = [WorkerProcess(w, config, free_port(), work / f"{w}.log") for w in WORKERS]
    producer = Producer(kinesis, stream, args.rate)
    run = Run()
    try:
        for w in workers:
            w.start()
        print(f"  status page: http://127.0.0.1:{workers[0].port}/  (while the demo runs)")
        producer.start()
        run.say(f"producing {args.rate:.0f} records/s; two workers starting (Spark local[1] each)")
        _play(args, run, kinesis, stream, workers)
        producer.stop.set()
        producer.join()
        run.say(f"producer stopped after {producer.produced} records; waiting for the table")
        view = ParquetView(work / "table")
        caught = _wait_written(run, workers, view, producer.produced, args.timeout)
    finally:
        producer.stop.set()
        for w in workers:
            w.stop()
    return _report(run, work, kinesis, stream, config, producer.produced, caught)


def _play(
    args: argparse.Namespace,
    run: Run,
    kinesis: Any,
    stream: str,
    workers: list[WorkerProcess],
) -> None:
    view = ParquetView(workers[0].config.parent / "table")
    said = 0.0
    for when, step in _script(args):
        while run.at() < when:
            run.sample(workers)
            time.sleep(1.0)
            if run.at() - said >= 10.0:
                said = run.at()
                run.say(f"rows written so far: {view.count()}")
        if step == "split":
            run.say(f"splitting {_split_first(kinesis, stream)} (a reshard while consuming)")
        elif step == "kill":
            workers[1].kill9()
            run.say(f"kill -9 {workers[1].worker_id} (and its JVM) in the middle of the run")
        elif step == "restart":
            workers[1].start()
            run.say(f"{workers[1].worker_id} restarted")


def _wait_written(
    run: Run, workers: list[WorkerProcess], view: ParquetView, produced: int, timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.sample(workers)
        if len(view.numbers()) >= produced:
            run.say("every record produced is in the table")
            return True
        time.sleep(2.0)
    run.say(f"gave up waiting after {timeout:.0f}s")
    return False


def _report(
    run: Run,
    work: Path,
    kinesis: Any,
    stream: str,
    config: Path,
    produced: int,
    caught: bool,
) -> int:
    from kclpy_spark.config import load_toml
    from kclpy_spark.runtime.lease_store import open_lease_store

    view = ParquetView(work / "table")
    numbers = view.numbers()
    rows = view.count()
    missing = produced - len(set(numbers) & set(range(produced)))
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    parents = {s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))
                              if p] for s in shards}  # fmt: skip
    order = view.children_after_parents(parents)
    print("\n=== what to check ===")
    print(f"records produced       {produced}")
    print(f"rows written           {rows}")
    print(f"distinct records       {len(set(numbers))} (duplicates: {rows - len(set(numbers))})")
    print(f"missing                {missing}")
    for line in order.lines:
        print(line)
    print("final checkpoints:")
    store = open_lease_store(load_toml(str(config)))
    for lease in sorted(store.list_leases(), key=lambda x: x.lease_key):
        print(f"  {lease.shard_id:<24}{lease.checkpoint!s:<58}{lease.lease_owner or '-'}")
    print("lag per shard over the run (MillisBehindLatest):")
    for line in terminal_chart(run.lag):
        print(line)
    png = work / "lag.png"
    if png_chart(run.lag, png):
        print(f"  chart: {png}")
    ok = caught and missing == 0 and rows == len(set(numbers)) and order.ok
    print(f"\ndemo {'finished: every check passed' if ok else 'FAILED: see the checks above'}")
    return 0 if ok else 1
