"""Soak: the daemon as a user runs it (the CLI and a config file), for half an hour per part,
under a steady producer, sampled every few seconds for what it holds. Two parts, one after the
other (on 2 cores they do not fit side by side):

* A: the embedded defaults (SQLite lease store) with the built-in Parquet sink, batches every
  ~0.1 s (thousands of Spark micro-batches); its stream is on kinesalite (started here), which
  serves reads at a fraction of LocalStack's CPU;
* B: DynamoDB on LocalStack with a RecordProcessor on 8 shards, tens of thousands of batches, and a
  second worker started and stopped every minute (lease moves both ways each time).

Sampled from each worker's /metrics every ``--every`` seconds: descriptors, sockets, threads
(also by pool, with each pool's limit), asyncio tasks, RSS, leases held, SQLite connections, and
(part A) the Spark driver's heap after its last collection (reported from the JVM's first
collection of its old generation on, so its warm-up counts from its first sample). The verdict:

* threads by what bounds them, at every sample of every process: each pool within the limit it
  exports (``kclpy_spark_thread_pool_limit``), and the processor pool (processor code's half of
  the loop's default executor) within the most leases the same process held in the time an idle
  thread lives (30 s, plus two samples) and at the next sample, plus one per stream and one for
  calls of no lease; the threads of no pool by growth, as below;
* every other count and memory by growth after warm-up (the last tenth of the run against the
  tenth after warm-up: the maximum of each count, the median of RSS and heap) under 5%. A count
  that follows the leases held (descriptors, tasks), which part B's second worker moves back and
  forth, is judged at equal leases held (the largest growth of the maximum over every number of
  leases held in both windows); the growth of the plain maximum is shown beside it. The reads
  stored on the executors (``--read-on executors``) rise and fall with Python's collector, so
  their windows are the first and last quarter instead of a tenth;
* no record lost (every record produced is in the output), and each record exactly once in the
  Parquet output;
* no line at WARNING or worse in any worker's log, ours or the Spark JVM's (a daemon's log over
  weeks is read by people: what it warns of must be worth their time). The kinds found are listed.

    .venv/bin/python bench/bench_soak.py [--minutes 30] [--every 5] [--no-write] [--trace-memory]

Needs LocalStack on 127.0.0.1:4566 (``python3 localstack/lsctl.py start``) and Java (Spark).
Writes bench/results/soak.md, soak.png and soak-samples.csv (``--results NAME``: NAME.md, ...).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    CACHE,
    REPO,
    RESULTS,
    child_env,
    machine,
    reap,
    require_endpoint,
    stamp,
    write_results,
)

from checkpoint.base.threads import IDLE_SECONDS

ENDPOINT = "http://127.0.0.1:4566"
WATCHED = ("open_fds", "open_sockets", "threads", "asyncio_tasks", "rss_bytes",
           "lease_store_connections", "sink_jvm_heap_live_bytes",
           # --read-on executors: the reads the executors store, Spark's Python workers
           "sink_executor_reads_stored", "spark_python_workers",
           "spark_python_workers_rss_bytes")  # fmt: skip
# Memory figures: judged by their median in each window (the counts by their maximum).
MEMORY = ("rss_bytes", "sink_jvm_heap_live_bytes", "spark_python_workers_rss_bytes")
# Counts that rise and fall with Python's collector: a read stored on the executors is freed once
# the batches that held it are collected, a sawtooth of a few samples whose peaks differ cycle to
# cycle (15 to 21 in part A). A tenth of the run may hold none of the highest, so these are
# judged by their peaks over a quarter of it.
CYCLING = ("sink_executor_reads_stored",)
WINDOW = 0.1  # the share of the run after warm-up each window of the other figures spans
CYCLING_WINDOW = 0.25
GROWTH_LIMIT = 0.05
# The process figures the standard collector exports, by the names this benchmark reports.
_STANDARD = {"process_open_fds": "open_fds", "process_resident_memory_bytes": "rss_bytes"}
# Processor code's half of the loop's default executor (runtime/loop_executor.py): processor calls,
# the checkpoints they write, asyncio.to_thread in them. (Describes, TLS set-up and DNS lookups,
# counted in its bound below, run on the worker's half since 2026-12-06: the bound is the looser.)
PROCESSOR_POOL = "kclpy-spark"
STREAMS = 1
UNTIED = 1
# Part B's batches: one record per batch, and a shard is read at most every 0.2 s while behind
# (Kinesis' 5 GetRecords per second per shard), so 8 shards at 35 records/s make ~35 batches/s.
# The run of 2026-11-24 06:46 (12 shards polling every 0.05 s, up to 5 records per batch) spent
# LocalStack's CPU on empty polls and made 22.7k batches in 30 min; 4 shards cap at 20/s.
SHARDS_B = 8


def kinesis(endpoint: str = ENDPOINT) -> Any:
    import boto3

    return boto3.client(
        "kinesis", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    )  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    values: dict[str, float] = {}
    for line in text.splitlines():
        for standard, ours in _STANDARD.items():  # prometheus_client's process collector
            if line.startswith(standard + "{"):
                values[ours] = float(line.rpartition(" ")[2])
        if line.startswith("kclpy_spark_") and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            base = name.split("{", 1)[0].removeprefix("kclpy_spark_")
            pool = re.search(r'pool="([^"]*)"', name)
            if base == "threads_by_pool" and pool:  # kept apart: which pool a thread count is
                values[f"pool:{pool.group(1)}"] = float(value)
                continue
            if base == "thread_pool_limit" and pool:  # the most threads that pool may start
                values[f"limit:{pool.group(1)}"] = float(value)
                continue
            values[base] = values.get(base, 0.0) + float(value)
    return values


@dataclass(eq=False)
class Producer(threading.Thread):
    """PutRecords of numbered records at ``rate`` per second until stopped."""

    stream: str
    prefix: str
    rate: float
    endpoint: str = ENDPOINT
    produced: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True, name=f"producer-{self.prefix}")

    def run(self) -> None:
        client = kinesis(self.endpoint)
        n = 0
        tick = 0.5
        while not self.stop.is_set():
            started = time.monotonic()
            batch = [f"{self.prefix}-{n + i}" for i in range(int(self.rate * tick))]
            n += len(batch)
            pending = [{"Data": d.encode(), "PartitionKey": d} for d in batch]
            while pending:
                try:
                    resp = client.put_records(StreamName=self.stream, Records=pending)
                except Exception:  # LocalStack busy: try the same records again
                    time.sleep(0.5)
                    continue
                failed = [e for e, r in zip(pending, resp["Records"], strict=True)
                          if "ShardId" not in r]  # fmt: skip
                self.produced += [e["Data"].decode() for e in pending if e not in failed]
                pending = failed
            self.stop.wait(max(0.0, tick - (time.monotonic() - started)))


@dataclass
class Worker:
    name: str
    config: Path
    port: int
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    last: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)  # counters of earlier incarnations

    def start(self) -> None:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(self.config),
                 "--worker-id", self.name, "--metrics-port", str(self.port)],
                stdout=fh, stderr=subprocess.STDOUT, env=self.env, cwd=REPO,
            )  # fmt: skip

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        final = scrape(self.port)
        if final:
            self.last = final
        self.proc.send_signal(signal.SIGTERM)
        status = reap(self.proc, timeout)
        for key in ("lease_takes_total", "lease_steals_total", "records_processed_total"):
            self.totals[key] = self.totals.get(key, 0.0) + self.last.get(key, 0.0)
        self.last = {}
        self.proc = None
        return status


def config_a(
    work: Path, stream: str, endpoint: str, read_on: str = "driver", scope: str = "lease"
) -> Path:
    path = work / "a.toml"
    path.write_text(
        f'application_name = "{stream}"\nstream_name = "{stream}"\nendpoint_url = "{endpoint}"\n'
        f'initial_position = "TRIM_HORIZON"\nlease_store = "sqlite:{work / "a" / "leases.db"}"\n'
        "idle_time_between_reads = 0.2\n"
        f'[sink]\nsink = "parquet:{work / "a" / "out"}"\nspark_target = "local[2]"\n'
        f'max_wait = 0.1\nmax_records = 1000\nwriters = 2\nscope = "{scope}"\n'
        f'read_on = "{read_on}"\n'
    )
    return path


def spark_python_workers(pid: int) -> dict[str, float]:
    """Spark's Python worker processes under a worker (its JVM's ``pyspark.daemon`` and the
    workers it forks, which read on the executors): how many, and their resident memory."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    count, rss = 0, 0
    for child in children:  # one at a time: the JVM's short-lived children come and go
        try:
            if "pyspark.daemon" in " ".join(child.cmdline()):
                rss += child.memory_info().rss
                count += 1
        except psutil.Error:
            continue
    return {"spark_python_workers": float(count), "spark_python_workers_rss_bytes": float(rss)}


def config_b(work: Path, stream: str) -> Path:
    path = work / "b.toml"
    path.write_text(
        f'application_name = "{stream}"\nstream_name = "{stream}"\nendpoint_url = "{ENDPOINT}"\n'
        'initial_position = "TRIM_HORIZON"\nlease_store = "dynamodb"\n'
        'processor = "soak_processor:BatchLines"\nidle_time_between_reads = 0.2\n'
        "max_records = 1\n"
    )
    return path


def make_stream(client: Any, name: str, shards: int) -> None:
    client.create_stream(StreamName=name, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120}
    )


def parquet_data(out: Path) -> list[str]:
    import pyarrow.dataset as ds

    if not out.exists():
        return []
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["data"])
    return [bytes(v).decode() for v in table.column("data").to_pylist()]


def batch_lines(out: Path, until: float = float("inf")) -> tuple[int, list[str]]:
    """(batches processed before wall time ``until``, the data of every batch)."""
    batches, data = 0, []
    for path in out.glob("batches-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                batches += entry["t"] < until
                data += entry["data"]
    return batches, data


def restarter(worker: Worker, stop: threading.Event, period: float, moves: list[float]) -> None:
    """Start the second worker, let it take its share, stop it; once per ``period``."""
    stop.wait(20.0)
    while not stop.is_set():
        worker.start()
        stop.wait(period * 0.8)
        worker.stop()
        moves.append(time.monotonic())
        stop.wait(period * 0.2)


def growth(
    samples: list[dict[str, Any]], worker: str, metric: str, warmup: float
) -> tuple[float, float, float] | None:
    """(median after warm-up, median at the end, growth) of one metric of one worker."""
    rows = [s for s in samples if s["worker"] == worker and metric in s]
    if len(rows) < 10:
        return None
    early, late = windows(rows, warmup, CYCLING_WINDOW if metric in CYCLING else WINDOW)
    first, last = [r[metric] for r in early], [r[metric] for r in late]
    if not first or not last:
        return None
    # Counts (descriptors, threads...) by their maximum in each window: they follow the leases
    # held, which cycle with the second worker; a leak raises the maximum. Memory by its median.
    pick = statistics.median if metric in MEMORY else max
    a, b = float(pick(first)), float(pick(last))
    return a, b, (b - a) / a if a else 0.0


def windows(
    rows: list[dict[str, Any]], warmup: float, share: float = WINDOW
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows (in time order) of the first ``share`` after warm-up and of the last."""
    t_end = rows[-1]["t"]
    t0 = rows[0]["t"] + warmup * (t_end - rows[0]["t"])
    span = t_end - t0
    early = [r for r in rows if t0 <= r["t"] < t0 + share * span]
    return early, [r for r in rows if r["t"] >= t_end - share * span]


def growth_at_equal_leases(
    samples: list[dict[str, Any]], worker: str, metric: str, warmup: float
) -> tuple[float, float, float, int] | None:
    """A count's growth at equal leases held: for each number of leases held in both windows
    (the tenth after warm-up and the last tenth; a quarter for ``CYCLING``), the maximum in
    each; the worst of them (after warm-up, at the end, growth, leases held). None without a
    number of leases held in both."""
    rows = [s for s in samples if s["worker"] == worker and metric in s and "leases_held" in s]
    if len(rows) < 10 or metric in MEMORY:
        return None
    early, late = windows(rows, warmup, CYCLING_WINDOW if metric in CYCLING else WINDOW)
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for window, peaks in ((early, first), (late, last)):
        for r in window:
            n, value = int(r["leases_held"]), float(r[metric])
            peaks[n] = max(peaks.get(n, value), value)
    worst: tuple[float, float, float, int] | None = None
    for n in sorted(set(first) & set(last)):
        a, b = first[n], last[n]
        change = (b - a) / a if a else 0.0
        if worst is None or change > worst[2]:
            worst = (a, b, change, n)
    return worst


def pool_keys(samples: list[dict[str, Any]], prefix: str = "pool:") -> list[str]:
    """The per-pool thread counts (``pool:<name>``) or limits (``limit:<name>``) the samples
    hold, sorted."""
    return sorted({k for row in samples for k in row if k.startswith(prefix)})


def alive_bound(rows: list[dict[str, Any]], i: int, every: float) -> float | None:
    """The processor pool's bound at ``rows[i]``: the most leases held by the same process in
    the time an idle thread lives before it ends (``IDLE_SECONDS``, plus two sample intervals, as
    leases held are seen only at samples) and at the next sample (slack for a take whose first
    calls began just before it was counted), plus one per stream (a stream's describe or a lease's
    release beside its consumers' calls) and ``UNTIED`` (calls of no lease: the store's opening
    at start, the SDK's credentials and TLS set-up). None without leases held sampled."""
    t, pid = rows[i]["t"], rows[i].get("pid")
    held = [r["leases_held"] for r in rows
            if "leases_held" in r and r.get("pid") == pid
            and -1.5 * every <= t - r["t"] <= IDLE_SECONDS + 2 * every]  # fmt: skip
    return max(held) + STREAMS + UNTIED if held else None


def pool_bounds(
    samples: list[dict[str, Any]], worker: str, every: float
) -> tuple[int, list[str], list[str]]:
    """Every sample's threads against what bounds them, whatever the time: each pool within
    the limit it exports (its size), and the processor pool within the leases held in the
    time its idle threads live (``alive_bound``). (samples checked, table lines, misses)."""
    rows = [s for s in samples if s["worker"] == worker]
    peak: dict[str, tuple[float, float]] = {}  # pool: (most threads, least headroom)
    misses: list[str] = []
    checked = 0  # samples with a limit to judge: one without any checked nothing
    for i, row in enumerate(rows):
        limits = [k for k in row if k.startswith("limit:")]
        checked += bool(limits)
        if limits and not any(k.startswith("pool:") for k in row):
            # A pool without threads is left out of the gauge (none, rightly); a sample without
            # the gauge at all would have passed every bound at 0.
            misses.append(f"{worker}: no thread counts at {row['t']:.0f} s")
            continue
        for key in limits:
            pool = key.removeprefix("limit:")
            count = row.get(f"pool:{pool}", 0.0)
            bound = row[key]
            if pool == PROCESSOR_POOL:
                bound = min(bound, alive_bound(rows, i, every) or bound)
            most, room = peak.get(pool, (0.0, float("inf")))
            peak[pool] = (max(most, count), min(room, bound - count))
            if count > bound:
                misses.append(f"{worker} {pool} {count:g} > {bound:g} at {row['t']:.0f} s")
    lines = [f"| {worker} | {pool} | {most:g} | {room:g} |"
             for pool, (most, room) in sorted(peak.items())]  # fmt: skip
    return checked, lines, misses


def outside_pools(samples: list[dict[str, Any]]) -> None:
    """Adds ``threads_unpooled`` to each sample: the threads of no pool with a limit (the main
    thread, Spark's and py4j's threads): judged by growth, as they have no bound of their own."""
    for row in samples:
        if "threads" in row and any(k.startswith("limit:") for k in row):
            pooled = sum(row.get(f"pool:{k.removeprefix('limit:')}", 0.0)
                         for k in row if k.startswith("limit:"))  # fmt: skip
            row["threads_unpooled"] = row["threads"] - pooled


def pool_lines(samples: list[dict[str, Any]], warmup: float) -> list[str]:
    """The threads by pool (``kclpy_spark_threads_by_pool``) whose maximum differs between the
    tenth after warm-up and the last tenth: where a change in the thread count comes from (not
    judged; the total is)."""
    lines = ["", "Threads by pool whose maximum changed (not judged):", "",
             "| worker | pool | after warm-up | at the end |", "|---|---|---:|---:|"]  # fmt: skip
    for worker in ("a", "b1"):
        for pool in pool_keys(samples):
            g = growth(samples, worker, pool, warmup)
            if g is not None and g[0] != g[1]:
                lines.append(f"| {worker} | {pool.removeprefix('pool:')} | {g[0]:g} | {g[1]:g} |")
    return lines if len(lines) > 5 else []


def stored_reads_lines(samples: list[dict[str, Any]]) -> list[str]:
    """The most reads the executors stored at once (``--read-on executors``; judged above by
    growth, as the other counts: a read is freed once the batches that held it are garbage, so
    how many are stored depends on when Python's collector frees those, not a count per lease)."""
    rows = [r for r in samples if "sink_executor_reads_stored" in r]
    if not rows:
        return []
    most = max(rows, key=lambda r: r["sink_executor_reads_stored"])
    return ["", f"Reads stored on the executors: most {most['sink_executor_reads_stored']:g} at "
            f"{most.get('leases_held', 0):g} leases held, {len(rows)} samples."]  # fmt: skip


# A worker's log line at WARNING or worse: ours ("<date> <time> WARNING <logger>: ...") and the
# Spark JVM's as the daemon logs them ("<date> <time> WARN    spark.<Class>: ...", jvm_logs.py).
LOUD = re.compile(r"^\S+ \S+ (WARNING|WARN|ERROR|CRITICAL|FATAL) +\S+: ")


def loud_lines(*logs: Path) -> list[str]:
    """The lines at WARNING or worse in the worker logs that exist."""
    texts = [log.read_text(errors="replace") for log in logs if log.exists()]
    return [line for text in texts for line in text.splitlines() if LOUD.match(line)]


def loud_kinds(lines: list[str], most: int = 5) -> list[str]:
    """The commonest kinds of loud line (level, logger and message with its numbers as N), with
    how many of each: what a failed verdict on the logs is about."""
    kinds: dict[str, int] = {}
    for line in lines:
        kind = re.sub(r"\d+", "N", line.split(" ", 2)[2])[:160]
        kinds[kind] = kinds.get(kind, 0) + 1
    ranked = sorted(kinds.items(), key=lambda kv: -kv[1])[:most]
    return [f"{count} x `{kind}`" for kind, count in ranked]


def plot(samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(18, 7))
    for ax in axes.flat[len(WATCHED) :]:
        ax.set_visible(False)
    for ax, metric in zip(axes.flat, WATCHED, strict=False):
        for worker, style in (("a", "-"), ("b1", "-"), ("b2", ":")):
            rows = [s for s in samples if s["worker"] == worker and metric in s]
            if not rows:
                continue
            scale = 1 / 2**20 if metric in MEMORY else 1
            ax.plot([r["t"] / 60 for r in rows], [r[metric] * scale for r in rows], style,
                    label=worker, linewidth=1)  # fmt: skip
        ax.set_title(
            metric.replace("rss_bytes", "RSS (MiB)").replace(
                "sink_jvm_heap_live_bytes", "Spark driver heap after GC (MiB)"
            )
        )
        ax.set_xlabel("minutes")
        if ax.lines:  # a metric no part sampled draws nothing, and needs no legend
            ax.legend(fontsize=7)
    fig.suptitle(
        "kclpy-spark soak: A = SQLite + Parquet sink; then B = DynamoDB + RecordProcessor "
        "(b2 restarted every minute); minutes since each part began"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def wait_drained(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(5)
    return bool(check())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="per part")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--rate-a", type=float, default=20.0, help="records/s into part A")
    parser.add_argument("--rate-b", type=float, default=35.0, help="records/s into part B")
    parser.add_argument("--parts", default="ab", help="a, b or ab (one after the other)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--read-on", choices=("driver", "executors"), default="driver",
        help="part A's [sink] read_on (executors: also samples Spark's Python workers)",
    )  # fmt: skip
    parser.add_argument("--shards-a", type=int, default=2, help="part A's stream's shards")
    parser.add_argument(
        "--scope-a", choices=("lease", "worker"), default="lease",
        help="part A's [sink] scope (worker: a batch holds many leases' pieces)",
    )  # fmt: skip
    parser.add_argument(
        "--trace-memory", action="store_true", help="part B's workers trace their allocations"
    )
    parser.add_argument(
        "--results", default="soak", help="results file names: NAME.md, NAME.png, NAME-samples.csv"
    )
    args = parser.parse_args()
    if "b" in args.parts:  # part B runs on LocalStack
        require_endpoint(ENDPOINT)
    run = time.strftime("%H%M%S")
    work = CACHE / f"soak-{run}"
    work.mkdir(parents=True)
    env = child_env(KCLPY_SPARK_SAMPLE_OUTPUT=str(work / "b"))
    if args.trace_memory:
        env["SOAK_TRACE_MEMORY"] = "1"
    env["PYTHONPATH"] += os.pathsep + str(REPO / "bench")
    print(f"soak: {args.minutes:g} min per part, work dir {work}", flush=True)
    result: dict[str, Any] = {"minutes per part": args.minutes}
    samples: list[dict[str, Any]] = []
    parts = {"a": soak_a, "b": soak_b}
    for name in args.parts:
        part, rows = parts[name](args, work, env, f"soak-{name}-{run}")
        result |= part
        samples += rows
        # Kept as soon as a part ends: a later part that fails loses nothing measured so far.
        (work / f"part-{name}.json").write_text(json.dumps({"result": part, "samples": rows}))
    report(result, samples, args, write=not args.no_write)
    return 0


def sample(workers: list[Worker], args: Any, samples: list[dict[str, Any]]) -> None:
    """Scrape each running worker every ``args.every`` seconds for ``args.minutes``."""
    started = time.monotonic()
    while time.monotonic() - started < args.minutes * 60:
        for worker in workers:
            proc = worker.proc
            values = scrape(worker.port) if proc is not None else None
            if values and proc is not None:
                worker.last = values
                row = {k: v for k, v in values.items() if k in WATCHED
                       or k.startswith(("pool:", "limit:")) or k == "leases_held"}  # fmt: skip
                if args.read_on == "executors":
                    row |= spark_python_workers(proc.pid)
                t = time.monotonic() - started
                samples.append({"t": t, "worker": worker.name, "pid": proc.pid, **row})
        time.sleep(args.every)


def soak_a(
    args: Any, work: Path, env: dict[str, str], stream: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Part A: SQLite lease store and the built-in Parquet sink, one worker, on kinesalite."""
    from kinesalite import Kinesalite

    samples: list[dict[str, Any]] = []
    with Kinesalite() as kinesalite:
        make_stream(kinesis(kinesalite.endpoint), stream, args.shards_a)
        config = config_a(work, stream, kinesalite.endpoint, args.read_on, args.scope_a)
        a = Worker("a", config, free_port(), env, work / "a.log")
        producer = Producer(stream, "a", args.rate_a, kinesalite.endpoint)
        a.start()
        try:
            producer.start()
            sample([a], args, samples)
            in_window = a.last.get("sink_batches_total", 0.0)
            producer.stop.set()
            producer.join()
            produced = set(producer.produced)
            drained = wait_drained(lambda: produced <= set(parquet_data(work / "a" / "out")), 300)
            final = scrape(a.port) or a.last
            a.stop()
        finally:
            if a.proc is not None:
                a.proc.kill()
    rows = parquet_data(work / "a" / "out")
    return {
        "A spark_batches (in the window)": in_window,
        "A spark_batches (with the drain)": final.get("sink_batches_total", 0.0),
        "A produced": len(produced), "A lost": len(produced - set(rows)),
        "A rows": len(rows), "A duplicates": len(rows) - len(set(rows)), "A drained": drained,
        "A log lines at WARNING or worse": loud_lines(a.log),
    }, samples  # fmt: skip


def soak_b(
    args: Any, work: Path, env: dict[str, str], stream: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Part B: DynamoDB and Kinesis on LocalStack, a RecordProcessor, a second worker restarted
    every minute."""
    samples: list[dict[str, Any]] = []
    make_stream(kinesis(), stream, SHARDS_B)
    b1 = Worker("b1", config_b(work, stream), free_port(), env, work / "b1.log")
    b2 = Worker("b2", b1.config, free_port(), env, work / "b2.log")
    stop = threading.Event()
    moves: list[float] = []
    producer = Producer(stream, "b", args.rate_b)
    b1.start()
    try:
        producer.start()
        restart = threading.Thread(target=restarter, args=(b2, stop, 60.0, moves), daemon=True)
        restart.start()
        sample([b1, b2], args, samples)
        window_end = time.time()
        stop.set()
        producer.stop.set()
        producer.join()
        restart.join(120)
        produced = set(producer.produced)
        drained = wait_drained(lambda: produced <= set(batch_lines(work / "b")[1]), 300)
        for worker in (b1, b2):
            worker.stop()
    finally:
        for worker in (b1, b2):
            if worker.proc is not None:
                worker.proc.kill()
    batches, data = batch_lines(work / "b", window_end)
    takes = sum(w.totals.get("lease_takes_total", 0) + w.totals.get("lease_steals_total", 0)
                for w in (b1, b2))  # fmt: skip
    return {
        "B processor_batches (in the window)": batches,
        "B lease_moves": max(0.0, takes - SHARDS_B),  # the first takes are no moves
        "B restarts of b2": len(moves),
        "B produced": len(produced), "B lost": len(produced - set(data)),
        "B duplicates (at-least-once)": len(data) - len(set(data)), "B drained": drained,
        "B log lines at WARNING or worse": loud_lines(b1.log, b2.log),
    }, samples  # fmt: skip


# What 30 minutes per part must reach (issue 14), scaled to shorter runs.
TARGETS = {
    "A spark_batches (in the window)": 5000,
    "B processor_batches (in the window)": 50000,
    "B lease_moves": 20,
}


def missed_targets(result: dict[str, Any], minutes: float) -> list[str]:
    scale = minutes / 30.0
    return [
        f"{key} {result[key]:g} < {need * scale:g}"
        for key, need in TARGETS.items()
        if key in result and result[key] < need * scale
    ]


def report(
    result: dict[str, Any], samples: list[dict[str, Any]], args: Any, *, write: bool
) -> None:
    warmup = 0.15
    parts = {
        "a": "part A (kinesalite, SQLite, Parquet sink)",
        "b": "part B (LocalStack: Kinesis and DynamoDB)",
    }
    ran = ", then ".join(parts[p] for p in args.parts if p in parts)
    lines = [
        f"# Soak ({stamp()})", "", f"Machine: {machine()}.", "",
        f"`bench/bench_soak.py --minutes {args.minutes:g} --parts {args.parts} --read-on "
        f"{args.read_on} --shards-a {args.shards_a} --scope-a {args.scope_a}`: {ran}, sampled "
        f"every {args.every:g} s; warm-up {warmup:.0%} of each part.", "",
        "| what | value |", "|---|---|",
    ]  # fmt: skip
    loud: list[str] = []
    for key, value in result.items():
        if isinstance(value, list):  # a part's loud log lines: counted here, kinds below
            loud += value
            value = len(value)
        lines.append(
            f"| {key} | {value:g} |" if isinstance(value, float) else f"| {key} | {value} |"
        )
    lines += [
        "",
        "| worker | metric | after warm-up | at the end | growth | at equal leases held (judged) |",
        "|---|---|---|---|---|---|",
    ]
    worst = 0.0
    outside_pools(samples)
    bounded = any("threads_unpooled" in row for row in samples)
    metrics = [*WATCHED, "threads_unpooled"] if bounded else list(WATCHED)
    for worker in ("a", "b1"):
        for metric in metrics:
            g = growth(samples, worker, metric, warmup)
            if g is None:
                if worker == "a" and metric == "sink_jvm_heap_live_bytes" and "a" in args.parts:
                    why = "not known: the JVM's old generation was collected too late in the run"
                    lines.append(f"| a | {metric} | {why} | | |")
                continue
            first, last, change = g
            equal = growth_at_equal_leases(samples, worker, metric, warmup)
            if metric == "threads" and bounded:
                judged, change = "(not judged: its pools by their bounds, the rest below)", 0.0
            elif equal is not None:
                judged = f"{equal[0]:,.0f} -> {equal[1]:,.0f} at {equal[3]} leases: {equal[2]:+.1%}"
                change = equal[2]
            else:
                judged = "(the plain growth)"
            worst = max(worst, change)
            lines.append(f"| {worker} | {metric} | {first:,.0f} | {last:,.0f} | "
                         f"{g[2]:+.1%} | {judged} |")  # fmt: skip
    lines += pool_lines(samples, warmup)
    lines += stored_reads_lines(samples)
    checked, misses = 0, []
    if bounded:
        lines += ["", "Threads by pool against their bounds at every sample (judged; the processor "
                  f"pool's bound: the most leases held in the last {IDLE_SECONDS:g} s + "
                  f"{2 * args.every:g} s by the same process and at its next sample, plus "
                  f"{STREAMS} per stream and {UNTIED} for calls of no lease):", "",
                  "| worker | pool | most threads | least headroom |",
                  "|---|---|---:|---:|"]  # fmt: skip
        for worker in ("a", "b1", "b2"):
            n, table, missed_bounds = pool_bounds(samples, worker, args.every)
            checked, misses = checked + n, misses + missed_bounds
            lines += table
        lines += ["", f"Samples checked: {checked}; over a bound: {len(misses)}"
                  + (f" ({'; '.join(misses[:5])})" if misses else "") + "."]  # fmt: skip
    if loud:
        lines += ["", "Log lines at WARNING or worse, commonest kinds (judged):", "",
                  *[f"- {kind}" for kind in loud_kinds(loud)]]  # fmt: skip
    lost = result.get("A lost", 0) + result.get("B lost", 0)
    drained = result.get("A drained", True) and result.get("B drained", True)
    missed = missed_targets(result, args.minutes)
    ok = (
        worst < GROWTH_LIMIT and not misses and lost == 0 and result.get("A duplicates", 0) == 0
        and drained and not missed and not loud
    )  # fmt: skip
    parquet = f"Parquet duplicates {result.get('A duplicates', 0)}; " if "a" in args.parts else ""
    lines += ["", f"Verdict: {'PASS' if ok else 'FAIL'}: largest growth after warm-up "
              f"{worst:+.1%} (limit {GROWTH_LIMIT:.0%}); threads over a pool's bound "
              f"{len(misses) if bounded else 'not checked'}; records lost {lost}; {parquet}"
              f"drained {drained}; log lines at WARNING or worse {len(loud)}; volume targets "
              f"{'met' if not missed else 'missed: ' + ', '.join(missed)}."]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if write:
        write_results(f"{args.results}.md", text)
        with (RESULTS / f"{args.results}-samples.csv").open("w", newline="") as fh:
            fields = ["t", "worker", "pid", "leases_held", *metrics, *pool_keys(samples),
                      *pool_keys(samples, "limit:")]  # fmt: skip
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(samples)
        try:  # the samples are kept whether or not they can be drawn
            plot(samples, RESULTS / f"{args.results}.png")
        except ModuleNotFoundError as exc:
            print(f"no plot ({exc}): pip install -e '.[bench]' draws one", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
