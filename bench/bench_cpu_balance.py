"""Balancing by CPU: two workers, one twice as slow per record. Does ``load_metric = "auto"``
(the default: the workers' CPU once the fleet is busy) even out their CPU where balancing the
bytes (``load_metric = "throughput"``) cannot, and then leave the leases alone?

    .venv/bin/python bench/bench_cpu_balance.py [--minutes 3] [--no-write]
    .venv/bin/python bench/bench_cpu_balance.py --fleet quotas   # three workers, CPU quotas

``--fleet quotas``: three workers of the same cost per record, each in its own cgroup with a CPU
quota (w1 one CPU, w2 and w3 half a CPU each, as containers of different sizes), unpinned; each
reads its limit from its cgroup (kclpy_spark.runtime.cgroups). Needs a writable cgroup v1 cpu
hierarchy (root). CPU is then reported as a share of each worker's quota. Results:
bench/results/cpu-balance-quotas.md.

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
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import ENDPOINT, Fleet, _kinesis, open_store, wait_for
from bench_hot_shard import settle_then_measure
from common import REPO, machine, require_endpoint, stamp, write_results

from kclpy_spark.runtime.cgroups import cgroup_mounts

PINNED = {"w1": ("0", "1"), "w2": ("1", "2")}  # worker -> (core, BURN_FACTOR)
QUOTAS = {"w1": 1.0, "w2": 0.5, "w3": 0.5}  # worker -> CPU quota (CPUs), same cost per record


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


def join_cgroup(group: Path) -> list[str]:
    """A command prefix: the shell moves itself into the cgroup, then becomes the worker (same
    pid, same cgroup; the worker's children inherit it)."""
    return ["sh", "-c", 'echo $$ > "$1" && shift && exec "$@"', "sh", str(group / "cgroup.procs")]


def quota_group(name: str, cpus: float) -> Path:
    """A cgroup v1 cpu group with a CFS quota of ``cpus``."""
    mountinfo = Path("/proc/self/mountinfo").read_text()
    for version, _, mount_point in cgroup_mounts(mountinfo):
        mount = Path(mount_point)
        if version == "v1" and os.access(mount, os.W_OK):
            group = mount / name
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
            return group
    raise SystemExit("--fleet quotas needs a writable cgroup v1 cpu hierarchy (run as root)")


def remove_group(group: Path) -> None:
    for _ in range(50):  # its processes may take a moment to be gone
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def run_variant(metric: str, args: argparse.Namespace) -> dict[str, Any]:
    app = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    work = REPO / ".cache" / "bench" / f"cpu-{metric}-{time.strftime('%H%M%S')}"
    work.mkdir(parents=True)
    (work / "worker.toml").write_text(config(app, metric))
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=app, ShardCount=args.shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=app)
    fleet = Fleet(work, work / "worker.toml")
    fleet.env.update(BURN_MS=str(args.burn_ms))
    fleet.env["PYTHONPATH"] += f":{REPO / 'bench'}"
    stop = threading.Event()
    thread = threading.Thread(target=producer, args=(kinesis, app, args.rate, stop))
    thread.start()
    groups: list[Path] = []
    try:
        if args.fleet == "quotas":
            for worker, cpus in QUOTAS.items():
                groups.append(quota_group(f"{app}-{worker}", cpus))
                fleet.start(worker, join_cgroup(groups[-1]), {"BURN_FACTOR": "1"})
        else:
            for worker, (core, factor) in PINNED.items():
                fleet.start(worker, ["taskset", "-c", core], {"BURN_FACTOR": factor})
        wait_for("the lease table", lambda: open_store("dynamodb", work, app).list_leases(), 120)
        store = open_store("dynamodb", work, app)

        def owners() -> dict[str, str | None]:
            return {x.shard_id: x.actual_owner for x in store.list_leases()}

        wait_for("every lease owned", lambda: None not in owners().values(), 120)
        pids = {w: p.pid for w, p in fleet.procs.items()}
        watched = settle_then_measure(owners, pids, args.minutes)
        held = {w: sum(1 for o in watched.owners.values() if o == w) for w in pids}
    finally:
        stop.set()
        thread.join()
        fleet.stop_all()
        for group in groups:
            remove_group(group)
        kinesis.delete_stream(StreamName=app, EnforceConsumerDeletion=True)
    limits = QUOTAS if args.fleet == "quotas" else dict.fromkeys(PINNED, 1.0)
    return {
        "metric": metric,
        "cpu": {w: used / limits[w] for w, used in watched.cpu.items()},  # share of its limit
        "held": held,
        "moves": watched.moves,
        "moves_before": watched.moves_before,
        "settled_after": watched.settled_after,
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    workers = list(QUOTAS if args.fleet == "quotas" else PINNED)
    names = " / ".join(workers)
    if args.fleet == "quotas":
        title = "Balancing by CPU: three workers with different CPU quotas"
        fleet = (f"three workers spending {args.burn_ms:g} ms of CPU per record, each in its own "
                 "cgroup with a CPU quota (w1 1 CPU, w2 and w3 0.5 CPU), unpinned; CPU as a "
                 "share of each worker's quota")  # fmt: skip
    else:
        title = "Balancing by CPU: one worker twice as slow per record"
        fleet = (f"w1 spends {args.burn_ms:g} ms of CPU per record, w2 {2 * args.burn_ms:g} ms; "
                 "each worker pinned to one core")  # fmt: skip
    lines = [
        f"# {title}",
        "",
        f"{stamp()} on {machine()}; `python bench/bench_cpu_balance.py --fleet {args.fleet} "
        f"--minutes {args.minutes:g} --rate {args.rate} --burn-ms {args.burn_ms:g}`. "
        f"{args.shards} shards, {args.rate} records/s of 100 B into each; {fleet}; DynamoDB "
        "lease table on LocalStack; the workers start together.",
        "",
        f"| load_metric | leases {names} | CPU {names} (of its limit) | CPU max / min | lease "
        "moves to settle | settled after | lease moves over the measured minutes |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        cpu = r["cpu"]
        ratio = max(cpu.values()) / min(cpu.values()) if min(cpu.values()) > 0 else float("inf")
        r["ratio"] = ratio
        held = " / ".join(str(r["held"][w]) for w in workers)
        used = " / ".join(f"{cpu[w]:.1%}" for w in workers)
        lines.append(
            f"| {r['metric']} | {held} | {used} | **{ratio:.2f}** | {r['moves_before']} | "
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
    parser.add_argument("--fleet", choices=["pinned", "quotas"], default="pinned")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    require_endpoint(ENDPOINT)
    results = [run_variant(metric, args) for metric in args.variants]
    text = report(results, args)
    print(text)
    if not args.no_write:
        name = "cpu-balance-quotas.md" if args.fleet == "quotas" else "cpu-balance.md"
        write_results(name, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
