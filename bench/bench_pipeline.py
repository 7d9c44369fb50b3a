"""The whole path as a user runs it: ``kclpy-spark run`` with a config file,
against the same stream, one variant after another (alternating, ``--rounds`` times). The
stream (``--source``) is on kinesalite, which spends ~24 us of its own CPU per record served on
the same two cores (so every variant shares the machine with its source), or on the stand-in
server (``standin_server.py --pages``: distinct records at ~0.1 us each, so the source costs
next to nothing), which enforces Kinesis's read limits per shard (``--read-limit``: 5 GetRecords a
second and 2 MiB a second, refusing calls over them as Kinesis does; about 9,700 records/s of
200 bytes per shard; ``--read-limit -1``: no limit, the consumer then held only by its own
pacing at 5 calls a second, 200,000 records/s with 4 shards, as in runs before 2026-11-28):

* **consumer** (the baseline): ``processor = "pipeline_app:Noop"`` (checkpoints every batch);
* **consumer unpaced**: the same with ``max_read_bytes_per_second = 0`` (no pacing by the
  shard's 2 MiB/s read limit: what the consumer did before 2026-11-28);
* **parquet**: a ``[sink]`` table writing the built-in Parquet sink (default settings but
  ``spark_target``: since 2026-11-28 two writers, i.e. two batches written at once; with the
  default ``batches_in_flight = 2`` the next batch of a lease is cut and written while the one
  before it is still being written);
* **parquet executors**: the same with ``read_on = "executors"`` (Spark tasks read the leased
  ranges; the daemon plans and acknowledges: its own process's CPU is the last column);
  ``key=value`` words after it are more ``[sink]`` settings
  (``parquet executors max_records=320000``);
* **parquet local relation**: the same with Spark's own ``localRelationThreshold`` (48 MB), as
  before 2026-12-03: each batch's rows became a local relation in the driver JVM (analysed row
  by row, Java-serialized into the tasks) instead of Arrow data the tasks convert;
* **parquet 1 writer**, **parquet 2 writers**: the same with ``writers`` set (1: the default
  before 2026-11-28; in the results files of earlier runs, **parquet** is one writer);
* **remote 1 writer**, **remote 2 writers**: a foreachBatch function standing for a store one
  second away (``pipeline_app:remote_store``: it waits 1 s per batch), ``scope = "worker"``,
  ``max_records = 20000``; with 2 writers the next batch is written while the one before it
  waits (pipelined batches), with 1 it waits its turn; **remote 2 writers unpipelined**: 2
  writers with ``batches_in_flight = 1`` (with one shard the second writer has nothing to cut
  until the first batch commits; with several it cuts other leases' records). Latency-bound,
  not CPU-bound: what pipelining is for;
* **parquet parallelgc**, **parquet serialgc**: the Parquet sink with the driver JVM on the
  Parallel or the Serial collector instead of G1 (``[sink.spark_conf]``
  ``spark.driver.extraJavaOptions``);
* **two sinks**: ``[[sinks]]`` with the same Parquet sink and a foreachBatch function
  (``pipeline_app:count_by_shard``: per-shard counts collected to the driver); **two sinks 1
  writer**, **two sinks 2 writers**: the same with ``writers`` set;
* **bare**: ``bare_pipeline.py``, an aiobotocore drain in one thread and
  ``createDataFrame(arrow)`` + Parquet append of 100,000 rows in another (no leases, no
  checkpoints), the issue's second baseline; its clock runs from its first GetRecords.

CPU: each run's process tree is sampled every 0.2 s (psutil), Python and the JVM apart. Rates
and CPU per record are read in the *warm window* (``--window``, by default from 30% to 70% of the
records checkpointed, at least three commits apart): the per-row code is compiled by then (in
a run's first half minute Spark's JIT compiler alone costs more CPU than the writes), and
records are still being read until its end (a sink's buffer runs ahead of its checkpoints, so
the last stretch is only writes). The per-write code keeps being compiled for minutes more; a
later window (``--window 0.5,0.85`` with more records) reads a daemon that has run longer. The
whole run's figures (start-up included) are printed too.

Each run starts a fresh application (its own SQLite lease table) as ``kclpy-spark run --config``
and reads every shard from TRIM_HORIZON; once the lease table shows every shard checkpointed at
its last record, the daemon gets SIGTERM. (``--until-caught-up`` cannot end these runs:
kinesalite's MillisBehindLatest is always 0.) Also printed: the rate from the first
``processing from checkpoint`` log line (Spark has started by then) to the last checkpoint. Every
run's output is checked: the Parquet rows, distinct, equal the records put.

    python bench/bench_pipeline.py        # 2,000,000 records, 4 shards, 3 rounds, every variant
    python bench/bench_pipeline.py --variants 'consumer,bare,parquet,two sinks'  # ~25 minutes
    python bench/bench_pipeline.py --source standin --records 4000000
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import CACHE, child_env, machine, median, stamp, write_results
from pipeline_measure import (
    Loaded,
    Progress,
    TreeCpu,
    parse_window,
    stream_source,
)

VARIANTS = (
    "consumer",
    "consumer unpaced",
    "bare",
    "parquet",
    "parquet executors",
    "parquet local relation",
    "parquet 1 writer",
    "parquet 2 writers",
    "two sinks",
    "two sinks 1 writer",
    "two sinks 2 writers",
    "remote 1 writer",
    "remote 2 writers",
    "remote 2 writers unpipelined",
    "parquet parallelgc",
    "parquet serialgc",
)
# The Parquet sink with one Spark setting changed: the driver JVM's collector for the "parquet
# ...gc" variants (G1 is the JVM's default); Spark's own local-relation threshold.
SPARK_CONF = {
    "parquet parallelgc": ("spark.driver.extraJavaOptions", "-XX:+UseParallelGC"),
    "parquet serialgc": ("spark.driver.extraJavaOptions", "-XX:+UseSerialGC"),
    "parquet local relation": ("spark.sql.execution.arrow.localRelationThreshold", "48MB"),
}
CLI = [sys.executable, "-m", "kclpy_spark.cli"]


def _app(variant: str, stream: str, work: Path) -> str:
    return f"{stream}-{variant.replace(' ', '-').replace('=', '-')}-{work.name}"


def config(variant: str, work: Path, endpoint: str, stream: str, target: str) -> Path:
    app = _app(variant, stream, work)
    head = (
        f'application_name = "{app}"\nstream_name = "{stream}"\nendpoint_url = "{endpoint}"\n'
        f'initial_position = "TRIM_HORIZON"\nlease_store = "sqlite:{work / "leases.db"}"\n'
    )
    out = work / "out"
    if variant == "consumer":
        body = 'processor = "pipeline_app:Noop"\n'
    elif variant == "consumer unpaced":
        body = 'max_read_bytes_per_second = 0\nprocessor = "pipeline_app:Noop"\n'
    elif variant == "parquet":
        body = f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\n'
    elif variant.startswith("parquet executors"):  # parquet executors [max_records=N ...]
        body = f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\nread_on = "executors"\n'
        body += "".join(f"{w.replace('=', ' = ')}\n" for w in variant.split()[2:])
    elif variant.startswith("remote"):
        body = (
            f'[sink]\nsink = "pipeline_app:remote_store"\nspark_target = "{target}"\n'
            f'scope = "worker"\nmax_records = 20000\nwriters = {variant.split()[1]}\n'
        )
        if variant.endswith("unpipelined"):
            body += "batches_in_flight = 1\n"
    elif variant in SPARK_CONF:
        key, value = SPARK_CONF[variant]
        body = (
            f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\n'
            f'[sink.spark_conf]\n"{key}" = "{value}"\n'
        )
    elif variant.startswith("parquet "):  # parquet 1 writer, parquet 2 writers
        writers = variant.split()[1]
        body = f'[sink]\nsink = "parquet:{out}"\nspark_target = "{target}"\nwriters = {writers}\n'
    else:  # two sinks (the defaults), two sinks 1 writer, two sinks 2 writers
        words = variant.split()
        writers = f"writers = {words[2]}\n" if len(words) > 2 else ""
        body = (
            f'[sink]\nspark_target = "{target}"\n{writers}'
            f'[[sinks]]\nsink = "parquet:{out}"\n'
            '[[sinks]]\nsink = "pipeline_app:count_by_shard"\n'
        )
    path = work / "app.toml"
    path.write_text(head + body)
    return path


def _time(line: dict[str, Any]) -> float:
    when = datetime.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return when.replace(tzinfo=UTC).timestamp()


def run(variant: str, endpoint: str, stream: str, loaded: Loaded, target: str) -> dict[str, Any]:
    records = loaded.records
    work = Path(tempfile.mkdtemp(prefix="pipeline-", dir=CACHE))
    if variant == "bare":
        args = [sys.executable, str(Path(__file__).parent / "bare_pipeline.py"), "--endpoint",
                endpoint, "--stream", stream, "--records", str(records), "--out",
                str(work / "out"), "--target", target,
                "--window", f"{loaded.window[0]},{loaded.window[1]}"]  # fmt: skip
    else:
        cfg = config(variant, work, endpoint, stream, target)
        args = [*CLI, "--log-format", "json", "run", "--config", str(cfg)]
    before = _standin_stats(endpoint)
    began = time.perf_counter()
    # Output goes to files, read once the run ended: a pipe nobody drains while the run goes
    # fills up (64 KiB of log lines) and then blocks the daemon and its JVM on their next line.
    out_path, err_path = work / "stdout.log", work / "stderr.log"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            args,
            env=child_env(
                PYTHONPATH=f"{Path(__file__).parent}:{child_env()['PYTHONPATH']}",
                BENCH_PIPELINE_OUT=str(work),
            ),
            stdout=out,
            stderr=err,
            text=True,
        )
    cpu = TreeCpu(proc.pid)
    progress = Progress()
    if variant != "bare":
        app = _app(variant, stream, work)
        served = functools.partial(_served, endpoint)
        _wait_for_checkpoints(proc, work / "leases.db", app, loaded, progress, served)
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=3600)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} exited {proc.returncode} (kept: {work}):\n{stderr[-3000:]}")
    used = cpu.totals()
    after = _standin_stats(endpoint)
    refused = None if before is None or after is None else after["throttled"] - before["throttled"]
    if variant == "bare":
        summary = json.loads(stdout.strip().splitlines()[-1])
        began_at, progress.done_at = float(summary["began"]), float(summary["ended"])
        opened, closed = summary["opened"], summary["closed"]
        progress.opened, progress.closed = (opened[0], opened[1]), (closed[0], closed[1])
        progress.steps = closed[2] - opened[2]
    else:
        began_at = _first_start(variant, stdout, stderr)
    steady = progress.done_at - began_at
    progress.check(variant)
    assert progress.opened is not None and progress.closed is not None
    warm_records = progress.closed[1] - progress.opened[1]
    warm_s = progress.closed[0] - progress.opened[0]
    in_warm = cpu.between(progress.opened[0], progress.closed[0])
    if variant.startswith("remote"):
        rows = _noted_rows(work / "pieces.jsonl")
        if rows != records:
            raise RuntimeError(f"{variant}: {rows} rows in distinct pieces, {records} put ({work})")
    elif not variant.startswith("consumer"):
        rows = _parquet_rows(work / "out")
        if rows != records:
            raise RuntimeError(f"{variant}: {rows} distinct Parquet rows, {records} put ({work})")
    shutil.rmtree(work, ignore_errors=True)  # ~170 MB a run at 2M records; kept when it failed
    return {
        "variant": variant,
        "steady_s": steady,
        "wall_s": wall,
        "rate": records / steady,
        "warm_rate": warm_records / warm_s,
        "python_us": used["python"] / records * 1e6,
        "jvm_us": used["jvm"] / records * 1e6,
        "warm_python_us": in_warm["python"] / warm_records * 1e6,
        "warm_jvm_us": in_warm["jvm"] / warm_records * 1e6,
        "warm_driver_us": in_warm["driver"] / warm_records * 1e6,
        "refused": refused,
        "read_share": progress.read_share(),
    }


def _standin_stats(endpoint: str) -> dict[str, int] | None:
    """The stand-in server's counters (calls served, calls refused over a read limit); None on
    another endpoint."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{endpoint}/_standin/stats", timeout=5) as answer:
            stats = json.loads(answer.read())
    except Exception:
        return None
    return stats if isinstance(stats, dict) and "throttled" in stats else None


def _served(endpoint: str) -> int | None:
    """Records the stand-in server has served so far (None on another endpoint)."""
    stats = _standin_stats(endpoint)
    return None if stats is None else int(stats["records"])


def _wait_for_checkpoints(
    proc: subprocess.Popen[str],
    db: Path,
    app: str,
    loaded: Loaded,
    progress: Progress,
    served: Callable[[], int | None],
) -> None:
    """Poll the lease table until every shard's checkpoint is at its last record, noting in
    ``progress`` when that was, when the warm window opened and closed, and the records
    ``served`` by then (the stand-in's count). (kinesalite's
    MillisBehindLatest is always 0, so ``--until-caught-up`` would stop at the first batch: the
    daemon runs and is stopped from here.)"""
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
                at = {
                    x.shard_id: int(x.checkpoint.sequence_number)
                    for x in store.list_leases()
                    if x.checkpoint.sequence_number.isdigit()
                }
                now, done = time.time(), loaded.done(at)
                progress.note(now, done, loaded, served)
                if done == loaded.records:
                    progress.done_at = now
                    return
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
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=200, help="payload bytes per record")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--window",
        type=parse_window,
        default=(0.3, 0.7),
        help="the warm window, as shares of the records checkpointed: 'FROM,TO' (the JVM has "
        "compiled its per-row code after the first; records are still read before the second)",
    )
    parser.add_argument("--target", default="local[2]")
    parser.add_argument(
        "--source",
        choices=("kinesalite", "standin"),
        default="kinesalite",
        help="the endpoint: kinesalite (~24 us of its own CPU per record served, on the same "
        "cores) or the stand-in server (~0.1 us; readers then paced at 5 calls/s per shard)",
    )
    parser.add_argument(
        "--read-limit",
        type=float,
        default=2.0,
        help="the stand-in's read limit per shard, MiB a second (Kinesis: 2; 0: bytes "
        "unlimited, still 5 calls a second; -1: no limit at all, as before 2026-11-28)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which, comma-separated (the ratios need consumer, bare, parquet and two sinks)",
    )
    parser.add_argument("--results", default="pipeline.md", help="file name in bench/results")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",")] if args.variants else list(VARIANTS)
    # "parquet executors" may carry [sink] settings: "parquet executors max_records=320000"
    unknown = {v for v in chosen if " ".join(v.split()[:2]) != "parquet executors"
               or not all("=" in w for w in v.split()[2:])} - set(VARIANTS)  # fmt: skip
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    CACHE.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    with stream_source(args) as (endpoint, stream, loaded):
        for n in range(args.rounds):
            for variant in chosen:
                r = run(variant, endpoint, stream, loaded, args.target)
                results[variant].append(r)
                print(
                    f"round {n + 1} {variant}: {r['rate']:,.0f} records/s steady "
                    f"({r['steady_s']:.1f}s; wall {r['wall_s']:.1f}s); "
                    f"warm {r['warm_rate']:,.0f}/s",
                    flush=True,
                )
    report(results, args)
    return 0


RATIOS = (  # (label, numerator, denominator, goal)
    ("Parquet sink / consumer alone", "parquet", "consumer", ">= 0.9"),
    ("Parquet sink, read on the executors / on the driver", "parquet executors", "parquet", "-"),
    ("Parquet sink, Arrow to the tasks / local relation", "parquet", "parquet local relation", "-"),
    ("consumer alone, paced (default) / unpaced", "consumer", "consumer unpaced", "-"),
    ("Parquet sink / bare overlapped pipeline", "parquet", "bare", ">= 1.2"),
    ("Parquet sink, 2 writers / 1 writer", "parquet 2 writers", "parquet 1 writer", "-"),
    ("Parquet sink (default: 2 writers) / 1 writer", "parquet", "parquet 1 writer", "-"),
    ("Parquet sink, 1 writer / consumer alone", "parquet 1 writer", "consumer", ">= 0.9"),
    ("two sinks (Parquet + a function) / Parquet alone", "two sinks", "parquet", ">= 0.8"),
    ("two sinks / Parquet, both 1 writer", "two sinks 1 writer", "parquet 1 writer", ">= 0.8"),
    ("remote store (1 s a write), 2 writers / 1", "remote 2 writers", "remote 1 writer", "-"),
    (
        "remote store, 2 writers, 1 batch in flight / 1 writer",
        "remote 2 writers unpipelined",
        "remote 1 writer",
        "-",
    ),
)


def _refused(runs: list[dict[str, Any]]) -> str:
    counts = [r["refused"] for r in runs if r.get("refused") is not None]
    return f"{median(counts):,.0f}" if counts else "-"


def _read_share(runs: list[dict[str, Any]]) -> str:
    shares = [r["read_share"] for r in runs if r.get("read_share") is not None]
    return f"{median(shares):.2f}" if shares else "-"


def report(results: dict[str, list[dict[str, Any]]], args: Any) -> None:
    variants = list(results)

    def med(variant: str, key: str) -> float:
        return median([r[key] for r in results[variant]])

    rounds = len(results[variants[0]])
    ratios = []
    for label, num, den, goal in RATIOS:
        if num in results and den in results:
            for key, what in (("warm_rate", "warm"), ("rate", "from the first lease, cold")):
                value = median(
                    [results[num][i][key] / results[den][i][key] for i in range(rounds)]
                )  # ratios within a round: same load
                ratios.append(
                    f"| {label} ({what}) | {value:.2f} | {goal if key == 'warm_rate' else '-'} |"
                )
    if "parquet" in results and "bare" in results:
        for keys, what, goal in (
            (("warm_python_us", "warm_jvm_us"), "warm", "<= 0.6"),
            (("python_us", "jvm_us"), "whole run, start-up included", "-"),
        ):
            value = sum(med("parquet", k) for k in keys) / sum(med("bare", k) for k in keys)
            ratios.append(
                f"| CPU per record, Parquet sink / bare, Python and JVM together ({what}) "
                f"| {value:.2f} | {goal} |"
            )
    lines = [
        f"# The whole path: Kinesis -> Spark sinks, as a user runs it ({stamp()})",
        "",
        f"Machine: {machine()}.",
        "",
        f"`bench/bench_pipeline.py --source {args.source} "
        + (f"--read-limit {args.read_limit} " if args.source == "standin" else "")
        + f"--records {args.records} --shards "
        f"{args.shards} --rounds "
        f"{args.rounds} --window {args.window[0]},{args.window[1]} --target {args.target} "
        f"--variants '{','.join(variants)}'`: {args.source}, {args.size}-byte records, "
        "`kclpy-spark run` per variant (fresh application, SQLite lease table, default "
        "batching settings unless the variant says), stopped once every record is "
        "checkpointed; variants alternate within each round.",
        "",
        f"*Warm*: from the commit that took the records checkpointed (the bare pipeline: "
        f"written) past {args.window[0]:.0%} of them to the one that took them past "
        f"{args.window[1]:.0%}: the JVM has compiled its per-row code by then (in a run's "
        "first half minute Spark's JIT compiler alone costs more CPU than the writes; per-write "
        "code is compiled for minutes longer), and records are still being read until the "
        "window closes (*read / written*: records the stand-in served in the window over "
        "those checkpointed; near 1, reading kept pace; well below 1, a read-ahead buffer "
        "filled before the window and the window measured mostly writes). *From the "
        "first lease*: from the first lease started (the bare pipeline: its first read), JIT "
        "warm-up included. Whole run: start-up included.",
        "",
        "| variant | records/s warm | records/s from the first lease | wall s (whole run) "
        "| warm CPU us/record: Python | JVM | together | whole run: Python | JVM | together "
        "| calls refused (read limits) | warm CPU us/record of the daemon's own process "
        "| read / written (warm) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {v} | {med(v, 'warm_rate'):,.0f} | {med(v, 'rate'):,.0f} "
            f"| {med(v, 'wall_s'):.1f} | {med(v, 'warm_python_us'):.1f} "
            f"| {med(v, 'warm_jvm_us'):.1f} "
            f"| {med(v, 'warm_python_us') + med(v, 'warm_jvm_us'):.1f} "
            f"| {med(v, 'python_us'):.1f} | {med(v, 'jvm_us'):.1f} "
            f"| {med(v, 'python_us') + med(v, 'jvm_us'):.1f} | {_refused(results[v])} "
            f"| {med(v, 'warm_driver_us'):.2f} | {_read_share(results[v])} |"
            for v in variants
        ),
        "",
        "| ratio (median of per-round ratios) | value | goal |",
        "|---|---:|---:|",
        *ratios,
        "",
        "| round | " + " | ".join(f"{v} (warm)" for v in variants) + " |",
        "|---:|" + "---:|" * len(variants),
        *(
            f"| {i + 1} | "
            + " | ".join(f"{results[v][i]['warm_rate']:,.0f}" for v in variants)
            + " |"
            for i in range(rounds)
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(args.results, text)


if __name__ == "__main__":
    sys.exit(main())
