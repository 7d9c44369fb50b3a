"""Balancing by CPU: two workers, one twice as slow per record. Does ``load_metric = "auto"``
(the default: the workers' CPU once the fleet is busy) even out their CPU where balancing the
bytes (``load_metric = "throughput"``) cannot, and then leave the leases alone?

    .venv/bin/python bench/bench_cpu_balance.py [--minutes 3] [--no-write]

As a user runs it (the CLI, a config file, default timing, a DynamoDB lease table on LocalStack):
an 8-shard stream, a producer putting ``--rate`` records/s of 100 B into every shard, the
``soak_processor:Burner`` processor spending ``--burn-ms`` ms of CPU per record on w1 and twice
that on w2. Each worker is pinned to one core (``taskset``; its CPU limit is then one core, as in
a 1-vCPU container). Both start together. Once no lease has moved for a minute, for ``--minutes``:
lease moves, and each worker's CPU from /proc/<pid>/stat. Each variant is a fresh application;
both run in the same invocation. Needs LocalStack on 127.0.0.1:4566. Writes
bench/results/cpu-balance.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import ENDPOINT, Fleet, _kinesis, open_store, wait_for
from bench_hot_shard import settle_then_measure
from common import REPO, machine, stamp, write_results

WORKERS = {"w1": ("0", "1"), "w2": ("1", "2")}  # worker -> (core, BURN_FACTOR)


def config(app: str, metric: str) -> str:
    return f"""
application_name = "{app}"
stream_name = "{app}"
endpoint_url = "{ENDPOINT}"
initial_position = "LATEST"
lease_store = "dynamodb"
processor = "soak_processor:Burner"
load_metric = "{metric}"
"""


def producer(kinesis: Any, stream: str, rate: int, stop: threading.Event) -> None:
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards]
    while not stop.wait(1.0):
        records = [
            {"Data": b"x" * 100, "PartitionKey": "p", "ExplicitHashKey": key}
            for key in keys
            for _ in range(rate)
        ]
        for start in range(0, len(records), 500):
            kinesis.put_records(StreamName=stream, Records=records[start : start + 500])


class PinnedFleet(Fleet):
    def start_pinned(self, worker_id: str, core: str, factor: str) -> None:
        log = (self.workdir / f"{worker_id}.log").open("wb")
        env = dict(self.env, BURN_FACTOR=factor)
        self.procs[worker_id] = subprocess.Popen(
            ["taskset", "-c", core, sys.executable, "-m", "kclpy_spark.cli", "--log-level",
             "INFO", "run", "--config", str(self.config), "--worker-id", worker_id],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir,
        )  # fmt: skip
        log.close()


def run_variant(metric: str, args: argparse.Namespace) -> dict[str, Any]:
    app = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    work = REPO / ".cache" / "bench" / f"cpu-{metric}-{time.strftime('%H%M%S')}"
    work.mkdir(parents=True)
    (work / "worker.toml").write_text(config(app, metric))
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=app, ShardCount=args.shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=app)
    fleet = PinnedFleet(work, work / "worker.toml")
    fleet.env.update(BURN_MS=str(args.burn_ms))
    fleet.env["PYTHONPATH"] += f":{REPO / 'bench'}"
    stop = threading.Event()
    thread = threading.Thread(target=producer, args=(kinesis, app, args.rate, stop))
    thread.start()
    try:
        for worker, (core, factor) in WORKERS.items():
            fleet.start_pinned(worker, core, factor)
        wait_for("the lease table", lambda: open_store("dynamodb", work, app).list_leases(), 120)
        store = open_store("dynamodb", work, app)

        def owners() -> dict[str, str | None]:
            return {x.shard_id: x.actual_owner for x in store.list_leases()}

        wait_for("every lease owned", lambda: None not in owners().values(), 120)
        pids = {w: p.pid for w, p in fleet.procs.items()}
        watched = settle_then_measure(owners, pids, args.minutes)
        held = {w: sum(1 for o in watched.owners.values() if o == w) for w in WORKERS}
    finally:
        stop.set()
        thread.join()
        fleet.stop_all()
        kinesis.delete_stream(StreamName=app, EnforceConsumerDeletion=True)
    return {
        "metric": metric,
        "cpu": watched.cpu,
        "held": held,
        "moves": watched.moves,
        "moves_before": watched.moves_before,
        "settled_after": watched.settled_after,
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Balancing by CPU: one worker twice as slow per record",
        "",
        f"{stamp()} on {machine()}; `python bench/bench_cpu_balance.py "
        f"--minutes {args.minutes:g} --rate {args.rate} --burn-ms {args.burn_ms:g}`. "
        f"{args.shards} shards, {args.rate} records/s of 100 B into each; w1 spends "
        f"{args.burn_ms:g} ms of CPU per record, w2 {2 * args.burn_ms:g} ms; each worker pinned "
        "to one core; DynamoDB lease table on LocalStack; both workers start together.",
        "",
        "| load_metric | leases w1 / w2 | CPU w1 / w2 (of its core) | CPU max / min | lease moves "
        "to settle | settled after | lease moves over the measured minutes |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        cpu = r["cpu"]
        ratio = max(cpu.values()) / min(cpu.values()) if min(cpu.values()) > 0 else float("inf")
        r["ratio"] = ratio
        lines.append(
            f"| {r['metric']} | {r['held']['w1']} / {r['held']['w2']} | {cpu['w1']:.1%} / "
            f"{cpu['w2']:.1%} | **{ratio:.2f}** | {r['moves_before']} | "
            f"{r['settled_after']:.0f} s | **{r['moves']}** |"
        )
    by = {r["metric"]: r for r in results}
    if {"auto", "throughput"} <= set(by):
        lines += ["", f"CPU spread (max / min), auto against throughput: "
                  f"**{by['auto']['ratio'] / by['throughput']['ratio']:.2f}x**"]  # fmt: skip
    return "\n".join([*lines, ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=25, help="records/s into each shard")
    parser.add_argument("--burn-ms", type=float, default=3.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--variants", nargs="+", default=["throughput", "auto"])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    results = [run_variant(metric, args) for metric in args.variants]
    text = report(results, args)
    print(text)
    if not args.no_write:
        write_results("cpu-balance.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
