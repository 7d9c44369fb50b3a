"""The executor read job alone (``spark/cluster_read.py``): records/s with one and two executors.

A stand-in Kinesis endpoint (``standin_server.py``, no read limits, costs the machine almost
nothing) serves ``--shards`` shards of ``--pages`` pages of 10,000 records of ``--size`` bytes. A
child process starts a SparkSession on ``local-cluster[E,1,1024]`` (E separate executor JVMs of one
core each), then reads every shard from TRIM_HORIZON to its tip in rounds: one Spark job per round
with one range per shard (one GetRecords answer of at most ``--range-records``, as the worker
plans them), the next round from where each range ended;
every round's records are written to Spark's ``noop`` sink (every row produced, nothing stored).
It reports records/s from the first round to the last and the driver's CPU (its Python process,
and its JVM) per record. Variants alternate; medians of ``--repeat`` runs.

This is the read job, not yet the worker: no leases, checkpoints or sink acknowledgments.

    python bench/bench_cluster_read.py [--shards 4] [--pages 5] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import child_env, machine, median, run_child, stamp, write_results

PAGE = 10_000


def child(master: str, endpoint: str, shards: int, range_records: int) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from checkpoint.sequence import ExtendedSequenceNumber
    from kclpy_spark.spark.cluster_read import read_ranges
    from kclpy_spark.spark.executor_probe import probe_executors
    from kclpy_spark.spark.range_tasks import AwsTarget
    from kclpy_spark.spark.ranges import ReadRange, next_range

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master(master)
        .appName("bench-cluster-read")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    aws = AwsTarget("us-east-1", endpoint)
    probe_executors(session, aws, {"StreamName": "standin"})  # warm: executors and workers up
    me = os.getpid()
    driver_jvm = session.sparkContext._gateway.proc.pid

    def cpu(pid: int) -> float:
        """CPU seconds of a process so far (/proc: user + system)."""
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    ranges = [
        ReadRange(
            f"shardId-{i:012d}",
            "standin",
            {"StreamName": "standin"},
            f"shardId-{i:012d}",
            ExtendedSequenceNumber("TRIM_HORIZON"),
            max_records=range_records,
            max_bytes=1 << 30,
            max_pages=1,  # as the worker plans them: one GetRecords answer a task
            read_rate=0,
        )
        for i in range(shards)
    ]
    py0, jvm0, t0 = cpu(me), cpu(driver_jvm), time.perf_counter()
    total = rounds = 0
    while ranges:
        read = read_ranges(session, ranges, aws, description=f"bench round {rounds}")
        read.records.write.format("noop").mode("overwrite").save()
        rounds += 1
        total += sum(e.rows for e in read.ends.values())
        ranges = [
            next_range(r, read.ends[r.lease_key]) for r in ranges if read.ends[r.lease_key].rows
        ]
    seconds = time.perf_counter() - t0
    py, jvm = cpu(me) - py0, cpu(driver_jvm) - jvm0
    session.stop()
    return {
        "records": total,
        "rounds": rounds,
        "seconds": seconds,
        "records_per_s": total / seconds,
        "driver_python_us_per_record": py / total * 1e6,
        "driver_jvm_us_per_record": jvm / total * 1e6,
    }


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--range-records", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("MASTER", "ENDPOINT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        master, endpoint = args.child
        print(json.dumps(child(master, endpoint, args.shards, args.range_records)))
        return
    server = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("standin_server.py")),
            *("--synthetic", str(PAGE), "--size", str(args.size), "--shards", str(args.shards)),
            *("--pages", str(args.pages), "--read-limit", "-1"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    variants = {
        "1 executor x 1 core": "local-cluster[1,1,1024]",
        "2 executors x 1 core": "local-cluster[2,1,1024]",
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        for i in range(args.repeat):
            for name, master in variants.items():
                out = run_child(
                    [__file__, "--shards", str(args.shards), "--range-records",
                     str(args.range_records), "--child", master, endpoint],
                    env=child_env(), timeout=900,
                )  # fmt: skip
                print(f"run {i + 1} {name}: {json.dumps(out)}", flush=True)
                runs[name].append(out)
    finally:
        server.terminate()
        server.wait(timeout=10)
    report(args, runs)


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    names = list(runs)
    base = median([r["records_per_s"] for r in runs[names[0]]])
    lines = [
        f"# bench_cluster_read: {stamp()}",
        "",
        machine(),
        f"{args.shards} shards x {args.pages} pages x {PAGE:,} records of {args.size} bytes "
        f"(stand-in, no read limits), ranges of {args.range_records:,} records, "
        f"median of {args.repeat}",
        "",
        "| executors | records/s | vs 1 executor | driver Python us/record "
        "| driver JVM us/record |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        rs = runs[name]
        rate = median([r["records_per_s"] for r in rs])
        lines.append(
            f"| {name} | {rate:,.0f} | {rate / base:.2f}x | "
            f"{median([r['driver_python_us_per_record'] for r in rs]):.2f} | "
            f"{median([r['driver_jvm_us_per_record'] for r in rs]):.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    write_results("cluster_read.md", text)


if __name__ == "__main__":
    main(sys.argv[1:])
