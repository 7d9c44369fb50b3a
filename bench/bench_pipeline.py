"""The whole path as a user runs it: ``kclpy-spark run`` with a config file,
against the same kinesalite stream, one variant after another (alternating, ``--rounds`` times):

* **consumer** (the baseline): ``processor = "pipeline_app:Noop"`` (checkpoints every batch);
* **parquet**: a ``[sink]`` table writing the built-in Parquet sink (default batching settings
  but ``spark_target``);
* **parquet 2 writers**: the same with ``writers = 2`` (two batches written at once; with the
  default ``batches_in_flight = 2`` the next batch of a lease is cut and written while the one
  before it is still being written);
* **remote 1 writer**, **remote 2 writers**: a foreachBatch function standing for a store one
  second away (``pipeline_app:remote_store``: it waits 1 s per batch), ``scope = "worker"``,
  ``max_records = 20000``; with 2 writers the next batch is written while the one before it
  waits (pipelined batches), with 1 it waits its turn; **remote 2 writers unpipelined**: 2
  writers with ``batches_in_flight = 1`` (with one shard the second writer has nothing to cut
  until the first batch commits; with several it cuts other leases' records). Latency-bound,
  not CPU-bound: what pipelining is for;
* **two sinks**: ``[[sinks]]`` with the same Parquet sink and a foreachBatch function
  (``pipeline_app:count_by_shard``: per-shard counts collected to the driver);
* **bare**: ``bare_pipeline.py``, an aiobotocore drain in one thread and
  ``createDataFrame(arrow)`` + Parquet append of 100,000 rows in another (no leases, no
  checkpoints), the issue's second baseline; its clock runs from its first GetRecords.

CPU: each run's process tree is sampled every 0.2 s (psutil), Python and the JVM apart; CPU per
record is their CPU seconds over the records (start-up included: the JVM's start is a few CPU
seconds, which 400,000 records spread thin; use more records to read the steady state).

Each run starts a fresh application (its own SQLite lease table) as ``kclpy-spark run --config``
and reads every shard from TRIM_HORIZON; once the lease table shows every shard checkpointed at
its last record, the daemon gets SIGTERM. (``--until-caught-up`` cannot end these runs:
kinesalite's MillisBehindLatest is always 0.) Rate = records / steady-state seconds: from the
first ``processing from checkpoint`` log line (Spark has started by then) to the last
checkpoint. Wall time (start-up and shutdown included) is printed too. Every run's output is
checked: the Parquet rows, distinct, equal the records put.

    python bench/bench_pipeline.py                    # 400,000 records, 4 shards, 3 rounds
    python bench/bench_pipeline.py --records 2000000  # the issue's size (about 25 minutes)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from common import CACHE, child_env, machine, median, stamp, write_results
from kinesalite import Kinesalite, load_stream

VARIANTS = (
    "consumer",
    "bare",
    "parquet",
    "parquet 2 writers",
    "two sinks",
    "remote 1 writer",
    "remote 2 writers",
    "remote 2 writers unpipelined",
)
CLI = [sys.executable, "-m", "kclpy_spark.cli"]


def _app(variant: str, stream: str, work: Path) -> str:
    return f"{stream}-{variant.replace(' ', '-')}-{work.name}"


def config(variant: str, work: Path, endpoint: str, stream: str, target: str) -> Path:
    app = _app(variant, stream, work)
    head = (
        f'application_name = "{app}"\nstream_name = "{stream}"\nendpoint_url = "{endpoint}"\n'
        f'initial_position = "TRIM_HORIZON"\nlease_store = "sqlite:{work / "leases.db"}"\n'
    )
    out = work / "out"
    if variant == "consumer":
        body = 'processor = "pipeline_app:Noop"\n'
    elif variant == "parquet":
        body = f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\n'
    elif variant.startswith("remote"):
        body = (
            f'[sink]\nsink = "pipeline_app:remote_store"\nspark_target = "{target}"\n'
            f'scope = "worker"\nmax_records = 20000\nwriters = {variant.split()[1]}\n'
        )
        if variant.endswith("unpipelined"):
            body += "batches_in_flight = 1\n"
    elif variant == "parquet 2 writers":
        body = f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\nwriters = 2\n'
    else:
        body = (
            f'[sink]\nspark_target = "{target}"\n'
            f'[[sinks]]\nsink = "parquet:{out}"\n'
            '[[sinks]]\nsink = "pipeline_app:count_by_shard"\n'
        )
    path = work / "app.toml"
    path.write_text(head + body)
    return path


def _time(line: dict[str, Any]) -> float:
    return datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()


class TreeCpu:
    """CPU seconds of a process and its descendants, sampled until it ends: the last figure seen
    of each process, Python and the JVM (``java``) apart."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self._seen: dict[int, tuple[str, float]] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._root.is_running() and self._root.status() != psutil.STATUS_ZOMBIE:
            with contextlib.suppress(psutil.Error):
                for proc in [self._root, *self._root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        times = proc.cpu_times()
                        self._seen[proc.pid] = (proc.name(), times.user + times.system)
            time.sleep(0.2)

    def totals(self) -> dict[str, float]:
        self._thread.join(10.0)
        jvm = sum(cpu for name, cpu in self._seen.values() if name == "java")
        return {"jvm": jvm, "python": sum(c for _, c in self._seen.values()) - jvm}


def run(
    variant: str, endpoint: str, stream: str, tips: dict[str, int], records: int, target: str
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pipeline-", dir=CACHE))
    if variant == "bare":
        args = [sys.executable, str(Path(__file__).parent / "bare_pipeline.py"), "--endpoint",
                endpoint, "--stream", stream, "--records", str(records), "--out",
                str(work / "out"), "--target", target]  # fmt: skip
    else:
        cfg = config(variant, work, endpoint, stream, target)
        args = [*CLI, "--log-format", "json", "run", "--config", str(cfg)]
    began = time.perf_counter()
    proc = subprocess.Popen(
        args,
        env=child_env(
            PYTHONPATH=f"{Path(__file__).parent}:{child_env()['PYTHONPATH']}",
            BENCH_PIPELINE_OUT=str(work),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    cpu = TreeCpu(proc.pid)
    done_at = None
    if variant != "bare":
        done_at = _wait_for_checkpoints(proc, work / "leases.db", _app(variant, stream, work), tips)
        proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=3600)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} exited {proc.returncode}:\n{stderr[-3000:]}")
    used = cpu.totals()
    if done_at is None:
        steady = float(json.loads(stdout.strip().splitlines()[-1])["steady_s"])
    else:
        steady = done_at - _first_start(variant, stdout, stderr)
    if variant.startswith("remote"):
        rows = _noted_rows(work / "pieces.jsonl")
        if rows != records:
            raise RuntimeError(f"{variant}: {rows} rows in distinct pieces, {records} records put")
    elif variant != "consumer":
        rows = _parquet_rows(work / "out")
        if rows != records:
            raise RuntimeError(f"{variant}: {rows} distinct Parquet rows, {records} records put")
    return {
        "variant": variant,
        "steady_s": steady,
        "wall_s": wall,
        "rate": records / steady,
        "python_us": used["python"] / records * 1e6,
        "jvm_us": used["jvm"] / records * 1e6,
    }


def _wait_for_checkpoints(
    proc: subprocess.Popen[str], db: Path, app: str, tips: dict[str, int]
) -> float:
    """Poll the lease table until every shard's checkpoint is at its last record; the wall time
    then. (kinesalite's MillisBehindLatest is always 0, so ``--until-caught-up`` would stop at
    the first batch: the daemon runs and is stopped from here.)"""
    from checkpoint.stores.sqlite import SQLiteLeaseTable

    deadline = time.monotonic() + 3600
    while not db.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker ended before its lease table existed ({db})")
        time.sleep(0.2)
    store = SQLiteLeaseTable(db, namespace=app, create_if_missing=False)
    try:
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker ended before it checkpointed every record")
            with contextlib.suppress(Exception):  # the table may not be made yet
                at = {x.shard_id: x.checkpoint.sequence_number for x in store.list_leases()}
                if all(at.get(s, "").isdigit() and int(at[s]) >= t for s, t in tips.items()):
                    return time.time()
            time.sleep(0.2)
    finally:
        store.close()


def _first_start(variant: str, stdout: str, stderr: str) -> float:
    lines = []
    for text in stderr.splitlines() + stdout.splitlines():
        if text.startswith("{"):
            try:
                lines.append(json.loads(text))
            except ValueError:
                continue
    starts = [_time(x) for x in lines if "processing from checkpoint" in x.get("message", "")]
    if not starts:
        raise RuntimeError(f"{variant}: no 'processing from checkpoint' line in its log")
    return min(starts)


def _noted_rows(path: Path) -> int:
    """Rows of the distinct pieces ``remote_store`` noted (a piece written twice counts once)."""
    pieces = dict(json.loads(line) for line in path.read_text().splitlines())
    return sum(pieces.values())


def _parquet_rows(out: Path) -> int:
    import pyarrow.dataset as ds

    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["shard_id", "sequence_number"]
    )
    keys = zip(
        table.column("shard_id").to_pylist(),
        table.column("sequence_number").to_pylist(),
        strict=True,
    )
    return len(set(keys))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=200, help="payload bytes per record")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target", default="local[2]")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which, comma-separated (the ratios need consumer, bare, parquet and two sinks)",
    )
    parser.add_argument("--results", default="pipeline.md", help="file name in bench/results")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",")] if args.variants else list(VARIANTS)
    unknown = set(chosen) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    CACHE.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    with Kinesalite() as kinesalite:
        stream = f"pipeline-{int(time.time())}"
        tips: dict[str, int] = {}
        put_s = load_stream(
            kinesalite.endpoint,
            stream,
            shards=args.shards,
            records=args.records,
            size=args.size,
            tips=tips,
        )
        print(f"put {args.records:,} records in {put_s:.0f}s", flush=True)
        for n in range(args.rounds):
            for variant in chosen:
                r = run(variant, kinesalite.endpoint, stream, tips, args.records, args.target)
                results[variant].append(r)
                print(
                    f"round {n + 1} {variant}: {r['rate']:,.0f} records/s steady "
                    f"({r['steady_s']:.1f}s; wall {r['wall_s']:.1f}s)",
                    flush=True,
                )
    report(results, args)
    return 0


RATIOS = (  # (label, numerator, denominator, goal)
    ("Parquet sink / consumer alone", "parquet", "consumer", ">= 0.9"),
    ("Parquet sink / bare overlapped pipeline", "parquet", "bare", ">= 1.2"),
    ("Parquet sink, 2 writers / 1 writer", "parquet 2 writers", "parquet", "-"),
    ("Parquet sink, 2 writers / consumer alone", "parquet 2 writers", "consumer", ">= 0.9"),
    ("two sinks (Parquet + a function) / Parquet alone", "two sinks", "parquet", ">= 0.8"),
    ("remote store (1 s a write), 2 writers / 1", "remote 2 writers", "remote 1 writer", "-"),
    (
        "remote store, 2 writers, 1 batch in flight / 1 writer",
        "remote 2 writers unpipelined",
        "remote 1 writer",
        "-",
    ),
)


def report(results: dict[str, list[dict[str, Any]]], args: Any) -> None:
    variants = list(results)
    rate = {v: median([r["rate"] for r in rs]) for v, rs in results.items()}
    wall = {v: median([r["wall_s"] for r in rs]) for v, rs in results.items()}
    rounds = len(results[variants[0]])
    per_round = [
        {v: results[v][i]["rate"] for v in variants} for i in range(rounds)
    ]  # ratios within a round: same load
    cpu = {
        v: (median([r["python_us"] for r in rs]), median([r["jvm_us"] for r in rs]))
        for v, rs in results.items()
    }
    ratios = [
        f"| {label} | {median([r[num] / r[den] for r in per_round]):.2f} | {goal} |"
        for label, num, den, goal in RATIOS
        if num in results and den in results
    ]
    if "parquet" in cpu and "bare" in cpu:
        cpu_vs = sum(cpu["parquet"]) / sum(cpu["bare"])
        ratios.append(f"| CPU per record, Parquet sink / bare (together) | {cpu_vs:.2f} | <= 0.6 |")
    lines = [
        f"# The whole path: Kinesis -> Spark sinks, as a user runs it ({stamp()})",
        "",
        f"Machine: {machine()}.",
        "",
        f"`bench/bench_pipeline.py --records {args.records} --shards {args.shards} --rounds "
        f"{args.rounds} --target {args.target} --variants '{','.join(variants)}'`: kinesalite, "
        f"{args.size}-byte records, `kclpy-spark run` per variant (fresh application, SQLite "
        "lease table, default batching settings unless the variant says), stopped once every "
        "record is checkpointed; variants alternate within each round.",
        "",
        "| variant | records/s steady (median) | wall s (median, start-up included) "
        "| CPU us/record: Python | JVM | together |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {v} | {rate[v]:,.0f} | {wall[v]:.1f} | {cpu[v][0]:.1f} | {cpu[v][1]:.1f} "
            f"| {cpu[v][0] + cpu[v][1]:.1f} |"
            for v in variants
        ),
        "",
        "| ratio (median of per-round ratios) | value | goal |",
        "|---|---:|---:|",
        *ratios,
        "",
        "| round | " + " | ".join(variants) + " |",
        "|---:|" + "---:|" * len(variants),
        *(
            f"| {i + 1} | " + " | ".join(f"{r[v]:,.0f}" for v in variants) + " |"
            for i, r in enumerate(per_round)
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.results, text)


if __name__ == "__main__":
    sys.exit(main())
