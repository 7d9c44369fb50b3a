"""The readStream source against the daemon, as users run each, on the same stream (issue 44):

* **daemon**: ``kclpy-spark run --config app.toml --until-caught-up`` with a ``[sink]`` writing
  the built-in Parquet sink, ``read_on = "executors"`` (Spark tasks read, as the source does);
* **readstream**: ``readstream_app.py``, a Spark job reading ``format("kinesis-kcl")`` with
  Trigger.AvailableNow into Spark's Parquet file sink.

Both read the whole backlog from TRIM_HORIZON and exit; each is timed from its start to its exit
(JVM start-up included: what a scheduled job costs), alternated ``--rounds`` times, and checked
(Parquet rows equal the records put, none twice). The stream is the stand-in server
(``standin_server.py``: Kinesis's read limits per shard, ~0 CPU of its own).

    python bench/bench_readstream.py                      # 1,000,000 records, 4 shards, 2 rounds
    python bench/bench_readstream.py --records 400000 --rounds 1
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import CACHE, child_env, machine, median, stamp, write_results
from pipeline_measure import stream_source

HERE = Path(__file__).resolve().parent


def _rows(out: Path) -> tuple[int, int]:
    import pyarrow.dataset as ds  # type: ignore[import-untyped, unused-ignore]

    table = ds.dataset(str(out), format="parquet").to_table(columns=["shard_id", "sequence_number"])
    keys = set(zip(table.column(0).to_pylist(), table.column(1).to_pylist(), strict=True))
    return table.num_rows, len(keys)


def _daemon(endpoint: str, stream: str, work: Path, target: str) -> list[str]:
    app = work / "app.toml"
    app.write_text(
        f'application_name = "bench-{work.name}"\nstream_name = "{stream}"\n'
        f'endpoint_url = "{endpoint}"\ninitial_position = "TRIM_HORIZON"\n'
        f'lease_store = "sqlite:{work / "leases.db"}"\n'
        f'[sink]\nsink = "parquet:{work / "out"}"\nspark_target = "{target}"\n'
        'read_on = "executors"\n'
    )
    return [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(app),
            "--until-caught-up"]  # fmt: skip


def _readstream(endpoint: str, stream: str, work: Path, target: str) -> list[str]:
    return [sys.executable, str(HERE / "readstream_app.py"), endpoint, stream,
            str(work / "out"), target]  # fmt: skip


VARIANTS = {"daemon": _daemon, "readstream": _readstream}


def run_once(variant: str, endpoint: str, stream: str, target: str, records: int) -> float:
    work = Path(tempfile.mkdtemp(prefix=f"readstream-{variant}-", dir=CACHE))
    try:
        started = time.monotonic()
        command = VARIANTS[variant](endpoint, stream, work, target)
        done = subprocess.run(command, cwd=work, env=child_env(), capture_output=True, text=True,
                              check=False)  # fmt: skip
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"{variant} exited {done.returncode}: {done.stderr[-2000:]}")
        rows, distinct = _rows(work / "out")
        if rows != records or distinct != records:
            raise SystemExit(f"{variant}: {rows} rows, {distinct} distinct, {records} put")
        print(f"{variant}: {seconds:.1f} s, {records / seconds:,.0f} records/s", flush=True)
        return seconds
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", default="local[2]")
    limit = "the stand-in's read limit per shard, MiB/s (2: Kinesis's; -1: none)"
    parser.add_argument("--read-limit", type=float, default=2.0, help=limit)
    parser.add_argument("--results", default="readstream.md")
    args = parser.parse_args()
    args.source, args.window = "standin", (0.3, 0.7)
    CACHE.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with stream_source(args) as (endpoint, stream, loaded):
        records = sum(len(p) for p in loaded.positions.values())
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for variant in order:
                times[variant].append(run_once(variant, endpoint, stream, args.target, records))
    daemon, source = median(times["daemon"]), median(times["readstream"])
    rows = "\n".join(
        f"| {v} | " + ", ".join(f"{t:.1f}" for t in ts) + f" | {median(ts):.1f} | "
        f"{records / median(ts):,.0f} |"
        for v, ts in times.items()
    )
    text = f"""# readStream (AvailableNow) vs the daemon (--until-caught-up), read on the executors

{stamp()}; {machine()}. `python bench/bench_readstream.py --records {args.records} --shards \
{args.shards} --rounds {args.rounds}`: the stand-in server with Kinesis's read limits, {records:,} \
records of {args.size} bytes on {args.shards} shards, Spark `{args.target}`, each run from its \
start to its exit (JVM start-up included), alternated; every run's Parquet rows checked (each \
record once).

| variant | seconds per round | median s | records/s |
|---|---|---:|---:|
{rows}

**readstream / daemon wall time: {source / daemon:.2f}x** (goal <= 1.1x); records/s \
{daemon / source:.2f}x (goal >= 0.9x).
"""
    print(text)
    print(f"written to {write_results(args.results, text)}")


if __name__ == "__main__":
    main()
