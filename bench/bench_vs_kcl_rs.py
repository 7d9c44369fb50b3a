"""kclpy-spark and kcl-rs (a Rust port of KCL v3, PyPI ``kcl-rs``) reading one stream side by side
(issue 48): records/s, process CPU per record and the time to the first record.

    .venv/bin/python bench/bench_vs_kcl_rs.py [--records 200000] [--rounds 2] [--read-data]

As users run them: kclpy-spark by its CLI and a config file (``max_records`` 10,000,
``max_read_bytes_per_second = 0``: no pacing by Kinesis's read limit, which an emulator does not
enforce, ``idle_time_between_reads`` 0.2 s), kcl-rs by its Scheduler (POLLING, ``max_records``
10,000, 200 ms idle; ``bench/race_kcl_rs.py``). Both read a ``--shards``-shard stream of
``--records`` records of 200 B from TRIM_HORIZON on kinesalite (started here), with their
DynamoDB lease tables on LocalStack (127.0.0.1:4566, ``python3 localstack/lsctl.py start``),
each in a fresh application. Each processor counts the records (``--read-data``: reads every
payload too) and checkpoints after every batch (``bench/race_tally.py``). Measured inside each
consumer's process: wall time and process CPU (every thread) from its first record to the last;
the time from launch to the first record. The two alternate, median of ``--rounds``. Writes
bench/results/vs_kcl_rs.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import child_env, machine, median, stamp, write_results
from kinesalite import Kinesalite, load_stream

BENCH = Path(__file__).resolve().parent
LOCALSTACK = "http://127.0.0.1:4566"


def ours_config(stream: str, app: str) -> str:
    return f"""
stream_name = "{stream}"
application_name = "{app}"
lease_store = "dynamodb"
initial_position = "TRIM_HORIZON"
processor = "race_ours:Counting"
max_records = 10000
max_read_bytes_per_second = 0
idle_time_between_reads = 0.2
"""


def run_one(variant: str, stream: str, kinesis: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path("/tmp") / f"race-{variant}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    app = f"race-{variant}-{uuid.uuid4().hex[:8]}"
    result = work / "result.json"
    env = child_env(
        AWS_ENDPOINT_URL_KINESIS=kinesis, AWS_ENDPOINT_URL_DYNAMODB=LOCALSTACK,
        AWS_ENDPOINT_URL_CLOUDWATCH=LOCALSTACK, AWS_REGION="us-east-1",
        RACE_TARGET=str(args.records), RACE_RESULT=str(result),
        RACE_READ_DATA="1" if args.read_data else "0",
    )  # fmt: skip
    env["PYTHONPATH"] = f"{BENCH}:{env['PYTHONPATH']}"
    if variant == "kclpy-spark":
        (work / "app.toml").write_text(ours_config(stream, app))
        cmd = [
            sys.executable,
            "-m",
            "kclpy_spark.cli",
            "run",
            "--config",
            str(work / "app.toml"),
            "--log-level",
            "WARNING",
        ]
    else:
        cmd = [sys.executable, str(BENCH / "race_kcl_rs.py"), stream, app]
    log = (work / "log.txt").open("w")
    launched = time.time()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + args.timeout
        while not result.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (work / "log.txt").read_text()[-2000:]
                raise RuntimeError(f"{variant}: no result (exit {proc.poll()}); log: {tail}")
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    got = json.loads(result.read_text())
    seconds = got["last_wall"] - got["first_wall"]
    return {
        "variant": variant,
        "records_per_s": got["records"] / seconds,
        "cpu_us_per_record": got["cpu"] / got["records"] * 1e6,
        "first_after_start": got["first_wall"] - launched,
        "records": got["records"],
    }


def report(runs: list[dict[str, Any]], args: argparse.Namespace, loaded: float) -> str:
    def med(variant: str, key: str) -> float:
        return median([r[key] for r in runs if r["variant"] == variant])

    rows = []
    for key, what in (("records_per_s", "records/s"), ("cpu_us_per_record", "CPU us/record"),
                      ("first_after_start", "first record after start (s)")):  # fmt: skip
        ours, theirs = med("kclpy-spark", key), med("kcl-rs", key)
        rows.append(f"| {what} | {ours:,.2f} | {theirs:,.2f} | {ours / theirs:.2f}x |")
    lines = [
        f"# kclpy-spark vs kcl-rs, reading side by side ({stamp()})", "", machine(), "",
        f"{args.records:,} records of 200 B on {args.shards} shards (kinesalite; loaded in "
        f"{loaded:.0f} s), lease tables on LocalStack; processor "
        f"{'reads every payload' if args.read_data else 'counts'} and checkpoints every batch; "
        f"median of {args.rounds} alternated rounds. Command: `.venv/bin/python "
        f"bench/bench_vs_kcl_rs.py --records {args.records} --rounds {args.rounds}"
        f"{' --read-data' if args.read_data else ''}`.", "",
        "| measure | kclpy-spark | kcl-rs | kclpy-spark / kcl-rs |", "|---|---|---|---|",
        *rows, "", "Each run:", "",
        *[f"- {r['variant']}: {r['records_per_s']:,.0f} records/s, "
          f"{r['cpu_us_per_record']:.2f} us CPU/record, first record "
          f"{r['first_after_start']:.1f} s after start" for r in runs],
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--read-data", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    runs = []
    with Kinesalite() as emulator:
        stream = f"race-{uuid.uuid4().hex[:8]}"
        loaded = load_stream(emulator.endpoint, stream, shards=args.shards, records=args.records)
        for i in range(args.rounds):
            order = ["kclpy-spark", "kcl-rs"] if i % 2 == 0 else ["kcl-rs", "kclpy-spark"]
            for variant in order:
                runs.append(run_one(variant, stream, emulator.endpoint, args))
                print(json.dumps(runs[-1]), flush=True)
    text = report(runs, args, loaded)
    print(text)
    if not args.no_write:
        name = "vs_kcl_rs_read_data.md" if args.read_data else "vs_kcl_rs.md"
        print(f"wrote {write_results(name, text)}")


if __name__ == "__main__":
    main()
