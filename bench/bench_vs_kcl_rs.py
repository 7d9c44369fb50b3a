"""kclpy-spark and kcl-rs (a Rust port of KCL v3, PyPI ``kcl-rs``) reading one stream side by side
(issue 48): records/s, process CPU per record and the time to the first record.

    .venv/bin/python bench/bench_vs_kcl_rs.py [--source kinesalite|standin]
        [--settings fastest|defaults] [--no-read-limits] [--records N] [--rounds 2] [--read-data]

As users run them: kclpy-spark by its CLI and a config file, kcl-rs by its Scheduler
(``bench/race_kcl_rs.py``). ``--settings fastest``: kclpy-spark with ``max_records`` 10,000,
``max_read_bytes_per_second = 0`` (no pacing by Kinesis's read limit, which an emulator does not
enforce) and ``idle_time_between_reads`` 0.2 s; kcl-rs POLLING with ``max_records`` 10,000 and
200 ms idle. ``--settings defaults``: both with their defaults (kcl-rs: POLLING).

Sources (``--source``): kinesalite (started here, one stream loaded once; its one Node thread
spends ~21-24 us of CPU per record served, so on two cores it bounds both consumers near 45,000
records/s), or the stand-in (``standin_server.py --pages``, started fresh for each run: distinct
records at ~0.1 us of its CPU each, so the consumers are the bound; it enforces Kinesis's per-shard
read limits unless ``--no-read-limits``, and counts the calls it refused).

Both read ``--shards`` shards of ``--records`` records of 200 B from TRIM_HORIZON, with their
DynamoDB lease tables on LocalStack (127.0.0.1:4566, ``python3 localstack/lsctl.py start``), each
in a fresh application. Each processor counts the records (``--read-data``: reads every payload
too) and checkpoints after every batch (``bench/race_tally.py``). The window is from the
consumer's first GetRecords (as the source saw it) to its last record: records/s, the consumer
process's CPU (sampled from outside, every thread) and the source's CPU per record in it. kcl-rs
fetches ~2 s ahead before it delivers its first record, so a window from the first delivered
record would leave that reading out; that rate is reported too. The two alternate, median of
``--rounds``. Writes bench/results/vs_kcl_rs[_<source>][_<settings>][_read_data].md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CpuTrace, child_env, machine, median, reap, stamp, write_results
from kinesalite import Kinesalite, load_stream

PAGE = 10_000  # records in one stand-in page

BENCH = Path(__file__).resolve().parent
LOCALSTACK = "http://127.0.0.1:4566"


FASTEST = """
max_records = 10000
max_read_bytes_per_second = 0
idle_time_between_reads = 0.2
"""


def ours_config(stream: str, app: str, settings: str) -> str:
    return f"""
stream_name = "{stream}"
application_name = "{app}"
lease_store = "dynamodb"
initial_position = "TRIM_HORIZON"
processor = "race_ours:Counting"
{FASTEST if settings == "fastest" else ""}"""


@dataclass(frozen=True)
class RunSource:
    """What one run reads from: the endpoint and stream, the server's pid (its CPU is sampled),
    when it saw the first GetRecords at or after a time, how many calls it refused."""

    endpoint: str
    stream: str
    pid: int
    first_read: Callable[[float], float]
    refused: Callable[[], int]


class KinesaliteSource:
    """One kinesalite and one loaded stream for every run (it logs each GetRecords' arrival)."""

    def __init__(self, records: int, shards: int) -> None:
        self._emulator = Kinesalite(log_reads=True)
        self._records, self._shards = records, shards
        self.loaded = 0.0

    def __enter__(self) -> KinesaliteSource:
        self._emulator.start()
        self.stream = f"race-{uuid.uuid4().hex[:8]}"
        self.loaded = load_stream(
            self._emulator.endpoint, self.stream, shards=self._shards, records=self._records
        )
        return self

    def __exit__(self, *_: object) -> None:
        self._emulator.stop()

    @contextlib.contextmanager
    def run(self) -> Iterator[RunSource]:
        times = self._emulator.read_times
        yield RunSource(
            self._emulator.endpoint, self.stream, self._emulator.pid,
            lambda after: min(t for t in times if t >= after), lambda: 0,
        )  # fmt: skip

    def describe(self) -> str:
        return f"kinesalite (loaded in {self.loaded:.0f} s)"


class StandInSource:
    """A fresh stand-in server for each run: ``records`` distinct records in pages of 10,000."""

    def __init__(self, records: int, shards: int, read_limits: bool) -> None:
        if records % (PAGE * shards):
            raise SystemExit(f"--records must be a multiple of {PAGE} x --shards for the stand-in")
        self._pages, self._shards = records // (PAGE * shards), shards
        self._read_limits = read_limits

    def __enter__(self) -> StandInSource:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    @contextlib.contextmanager
    def run(self) -> Iterator[RunSource]:
        server = subprocess.Popen(
            [sys.executable, str(BENCH / "standin_server.py"), "--synthetic", str(PAGE),
             "--shards", str(self._shards), "--pages", str(self._pages),
             "--read-limit", "2" if self._read_limits else "-1"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            endpoint = server.stdout.readline().strip()

            def stats() -> dict[str, Any]:
                import urllib.request

                with urllib.request.urlopen(f"{endpoint}/_standin/stats", timeout=10) as got:
                    return dict(json.loads(got.read()))

            yield RunSource(
                endpoint, "standin", server.pid,
                lambda _after: float(stats()["first_read"]), lambda: int(stats()["throttled"]),
            )  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=10)

    def describe(self) -> str:
        limits = "Kinesis's read limits enforced" if self._read_limits else "no read limits"
        return f"the stand-in server ({limits})"


def run_one(variant: str, source: RunSource, args: argparse.Namespace) -> dict[str, Any]:
    work = Path("/tmp") / f"race-{variant}-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    app = f"race-{variant}-{uuid.uuid4().hex[:8]}"
    result = work / "result.json"
    env = child_env(
        AWS_ENDPOINT_URL_KINESIS=source.endpoint, AWS_ENDPOINT_URL_DYNAMODB=LOCALSTACK,
        AWS_ENDPOINT_URL_CLOUDWATCH=LOCALSTACK, AWS_REGION="us-east-1",
        RACE_TARGET=str(args.records), RACE_RESULT=str(result),
        RACE_READ_DATA="1" if args.read_data else "0", RACE_SETTINGS=args.settings,
    )  # fmt: skip
    env["PYTHONPATH"] = f"{BENCH}:{env['PYTHONPATH']}"
    if variant == "kclpy-spark":
        (work / "app.toml").write_text(ours_config(source.stream, app, args.settings))
        cmd = [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(work / "app.toml"),
               "--log-level", "WARNING"]  # fmt: skip
    else:
        cmd = [sys.executable, str(BENCH / "race_kcl_rs.py"), source.stream, app]
    log = (work / "log.txt").open("w")
    launched = time.time()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    with CpuTrace(source.pid) as source_cpu, CpuTrace(proc.pid) as consumer_cpu:
        try:
            deadline = time.monotonic() + args.timeout
            while not result.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = (work / "log.txt").read_text()[-2000:]
                    raise RuntimeError(f"{variant}: no result (exit {proc.poll()}); log: {tail}")
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
    reap(proc, 30)
    got = json.loads(result.read_text())
    records, last = got["records"], got["last_wall"]
    first_read = source.first_read(launched)
    return {
        "variant": variant,
        "records_per_s": records / (last - first_read),
        "cpu_us_per_record": consumer_cpu.between(first_read, last) / records * 1e6,
        "source_cpu_us_per_record": source_cpu.between(first_read, last) / records * 1e6,
        "records_per_s_from_first_record": records / (last - got["first_wall"]),
        "read_ahead_s": got["first_wall"] - first_read,
        "first_after_start": got["first_wall"] - launched,
        "refused": source.refused(),
        "records": records,
    }


MEASURES = (
    ("records_per_s", "records/s from its first GetRecords"),
    ("cpu_us_per_record", "process CPU us/record (same window)"),
    ("source_cpu_us_per_record", "source's CPU us/record (same window)"),
    ("records_per_s_from_first_record", "records/s from its first delivered record"),
    ("first_after_start", "first record after start (s)"),
    ("refused", "calls the source refused (read limits)"),
)


def command(args: argparse.Namespace) -> str:
    return (
        f".venv/bin/python bench/bench_vs_kcl_rs.py --source {args.source} --settings "
        f"{args.settings} --records {args.records} --shards {args.shards} --rounds {args.rounds}"
        f"{' --read-data' if args.read_data else ''}"
        f"{' --no-read-limits' if args.no_read_limits else ''}"
    )


def report(runs: list[dict[str, Any]], args: argparse.Namespace, source: str) -> str:
    def med(variant: str, key: str) -> float:
        return median([r[key] for r in runs if r["variant"] == variant])

    rows = []
    for key, what in MEASURES:
        ours, theirs = med("kclpy-spark", key), med("kcl-rs", key)
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        rows.append(f"| {what} | {ours:,.2f} | {theirs:,.2f} | {ratio} |")
    lines = [
        f"# kclpy-spark vs kcl-rs, reading side by side ({stamp()})", "", machine(), "",
        f"{args.records:,} records of 200 B on {args.shards} shards from {source}, lease tables "
        f"on LocalStack; settings: {args.settings}; processor "
        f"{'reads every payload' if args.read_data else 'counts'} and checkpoints every batch; "
        f"median of {args.rounds} alternated rounds. Command: `{command(args)}`.", "",
        "| measure | kclpy-spark | kcl-rs | kclpy-spark / kcl-rs |", "|---|---|---|---|",
        *rows, "", "Each run:", "",
        *[f"- {r['variant']}: {r['records_per_s']:,.0f} records/s "
          f"({r['records_per_s_from_first_record']:,.0f} from its first record, "
          f"{r['read_ahead_s']:.1f} s after its first read), {r['cpu_us_per_record']:.2f} us "
          f"CPU/record, source {r['source_cpu_us_per_record']:.2f} us/record, first record "
          f"{r['first_after_start']:.1f} s after start, {r['refused']} refused" for r in runs],
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def results_name(args: argparse.Namespace) -> str:
    parts = ["vs_kcl_rs"]
    if args.source != "kinesalite":
        parts.append(args.source + ("_unlimited" if args.no_read_limits else ""))
    if args.settings != "fastest":
        parts.append(args.settings)
    if args.read_data:
        parts.append("read_data")
    return "_".join(parts) + ".md"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=["kinesalite", "standin"], default="kinesalite")
    parser.add_argument("--settings", choices=["fastest", "defaults"], default="fastest")
    parser.add_argument("--no-read-limits", action="store_true", help="stand-in: no read limits")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--read-data", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--only", choices=["kclpy-spark", "kcl-rs"], help="one side, no report")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    runs = []
    sources = {
        "kinesalite": lambda: KinesaliteSource(args.records, args.shards),
        "standin": lambda: StandInSource(args.records, args.shards, not args.no_read_limits),
    }
    with sources[args.source]() as source:
        for i in range(args.rounds):
            order = ["kclpy-spark", "kcl-rs"] if i % 2 == 0 else ["kcl-rs", "kclpy-spark"]
            for variant in [args.only] if args.only else order:
                with source.run() as run_source:
                    runs.append(run_one(variant, run_source, args))
                print(json.dumps(runs[-1]), flush=True)
        described = source.describe()
    if args.only:
        return
    text = report(runs, args, described)
    print(text)
    if not args.no_write:
        print(f"wrote {write_results(results_name(args), text)}")


if __name__ == "__main__":
    main()
