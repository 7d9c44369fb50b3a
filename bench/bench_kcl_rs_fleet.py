"""kclpy-spark workers and kcl-rs workers (a Rust port of KCL v3, PyPI ``kcl-rs``) on one lease
table, under a steady producer: how long a lease is unread when a worker of one kind stops or
dies and one of the other kind takes over, and how many records are delivered twice.

    .venv/bin/python bench/bench_kcl_rs_fleet.py [--rate 20] [--no-write] [--no-steal-from-kcl]

As users run them: kclpy-spark by its CLI and a config file (default timing, failover_time 10 s,
the sample JSON-lines processor, a checkpoint after every batch and in ``shutdown_requested``),
kcl-rs by its Scheduler (POLLING, 200 ms idle, its processor checkpoints after every batch and in
``shutdown_requested``: ``tests/integration/kcl_rs_worker.py``). A 2-shard stream on LocalStack,
a DynamoDB lease table, records numbered at ``--rate`` records/s. Steps, each once the leases
settle one per worker: SIGTERM of the kclpy-spark worker (kcl-rs takes over), a new kclpy-spark
worker joins, kill -9 of it, then a rolling migration: three kcl-rs workers replaced one by one
by kclpy-spark workers (SIGTERM each kcl-rs worker, then start its replacement). Per step, for
each lease that moved: the gap from the event to the new owner's first record of that shard.
Records delivered twice and never delivered are counted over the whole run. Needs LocalStack on
127.0.0.1:4566 (``python3 localstack/lsctl.py start``). Writes bench/results/kcl_rs_fleet.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import ENDPOINT, Fleet, _kinesis, open_store, wait_for
from bench_handoff import producer
from common import REPO, child_env, machine, require_endpoint, stamp, write_results

KCL_RS = REPO / "tests" / "integration" / "kcl_rs_worker.py"
SETTLE = 8.0  # after the leases settle: a worker that lost one stops reading it


def config(app: str, extra: str = "") -> str:
    return f"""{extra}
application_name = "{app}"
stream_name = "{app}"
endpoint_url = "{ENDPOINT}"
region = "us-east-1"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "kclpy_spark.demo.samples:JsonLinesProcessor"
"""


class Run:
    """One application's workers of both kinds, their outputs and the events between them."""

    def __init__(self, work: Path, app: str, extra: str = "") -> None:
        self.work, self.app = work, app
        cfg = work / "worker.toml"
        cfg.write_text(config(app, extra))
        self.ours = Fleet(work, cfg)
        self.ours.env["KCLPY_SPARK_SAMPLE_OUTPUT"] = str(work / "out-ours")
        self.rust: dict[str, subprocess.Popen[bytes]] = {}
        self.store = open_store("dynamodb", work, app)
        self.names: dict[int, str] = {}  # pid -> worker id, for the timeline
        self.events: list[tuple[float, str, set[str]]] = []

    def start_ours(self, worker_id: str) -> None:
        self.ours.start(worker_id)
        self.names[self.ours.procs[worker_id].pid] = worker_id

    def start_rust(self, worker_id: str) -> None:
        log = (self.work / f"{worker_id}.log").open("wb")
        self.rust[worker_id] = subprocess.Popen(
            [sys.executable, str(KCL_RS), ENDPOINT, self.app, self.app, worker_id,
             str(self.work / "out-kcl-rs")],
            stdout=log, stderr=subprocess.STDOUT, env=child_env(),
        )  # fmt: skip
        self.names[self.rust[worker_id].pid] = worker_id
        log.close()

    def stop_rust(self, worker_id: str, sig: int = signal.SIGTERM) -> None:
        proc = self.rust.pop(worker_id)
        proc.send_signal(sig)
        proc.wait(timeout=60)

    def owners(self) -> dict[str, str | None]:
        try:
            return {lease.lease_key: lease.lease_owner for lease in self.store.list_leases()}
        except Exception:  # not created yet
            return {}

    def settled(self, workers: set[str], exact: bool = True) -> bool:
        """Every lease owned, by exactly ``workers`` (or, not ``exact``, by some of them)."""
        held = set(self.owners().values())
        if not held or None in held:
            return False
        return held == workers if exact else held <= workers

    def records(self) -> list[dict[str, Any]]:
        lines = []
        for folder in (self.work / "out-ours", self.work / "out-kcl-rs"):
            for path in folder.glob("*.jsonl") if folder.is_dir() else []:
                lines += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return lines

    def stop(self) -> None:
        self.ours.stop_all()
        for worker_id in list(self.rust):
            self.stop_rust(worker_id)


def first_reads(run: Run, event: float, moved: set[str], pids: set[int]) -> dict[str, float]:
    """Per moved shard, when a worker of ``pids`` (the new owners) first processed a record of
    it after ``event``."""
    firsts: dict[str, float] = {}
    for r in run.records():
        if r["shard"] in moved and r["pid"] in pids and r["t"] >= event:
            firsts[r["shard"]] = min(firsts.get(r["shard"], r["t"]), r["t"])
    return firsts


def unread(run: Run) -> dict[str, list[float]]:
    """Per step, per shard it moved: the longest time no record of that shard was processed
    between the step and the next one (records flow all along; a worker that reads on for a
    moment after losing a lease counts as reading, so this is the hole a consumer of the stream
    sees, whoever closed it)."""
    records = run.records()
    ends = [t for t, _, _ in run.events[1:]] + [max(r["t"] for r in records)]
    out: dict[str, list[float]] = {}
    for (event, name, moved), end in zip(run.events, ends, strict=True):
        out[name] = []
        for shard in sorted(moved):
            times = sorted(r["t"] for r in records if r["shard"] == shard and event <= r["t"] < end)
            seen = [event, *times, end]
            out[name].append(max(b - a for a, b in itertools.pairwise(seen)))
    return out


def step(
    run: Run, name: str, act: Any, to: set[str], pids: Any, results: dict[str, Any],
    exact: bool = True,
) -> None:  # fmt: skip
    """Do ``act`` (returns the shards it moves), wait until the workers ``to`` hold every lease
    and the new owners read each moved shard; record the gaps under ``name``."""
    event = time.time()
    moved = act()
    run.events.append((event, name, moved))
    wait_for(f"{name}: leases with {sorted(to)}", lambda: run.settled(to, exact), 180)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(first_reads(run, event, moved, pids())) < len(moved):
        time.sleep(0.5)
    print(f"{name}: done", flush=True)


def scenario(run: Run, rate: float, migration_only: bool = False) -> dict[str, Any]:
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=run.app, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(StreamName=run.app)
    results: dict[str, Any] = {}
    stop = threading.Event()
    sent: list[str] = []
    feeder = threading.Thread(target=lambda: sent.extend(producer(kinesis, run.app, rate, stop)))
    feeder.start()

    def ours_pids() -> set[int]:
        return {p.pid for p in run.ours.procs.values()}

    def rust_pids() -> set[int]:
        return {p.pid for p in run.rust.values()}

    def held_by(worker: str) -> set[str]:
        return {k for k, o in run.owners().items() if o == worker}

    try:
        if not migration_only:  # without steals from kcl-rs, a joining worker waits
            run.start_ours("ours-a")
            wait_for("ours-a's leases", lambda: run.settled({"ours-a"}), 120)
            run.start_rust("rust-a")
            wait_for("one lease each", lambda: run.settled({"ours-a", "rust-a"}), 180)
            time.sleep(SETTLE)

            def sigterm_ours() -> set[str]:
                moved = held_by("ours-a")
                run.ours.procs.pop("ours-a").send_signal(signal.SIGTERM)
                return moved

            step(run, "SIGTERM kclpy-spark -> kcl-rs", sigterm_ours, {"rust-a"}, rust_pids, results)
            run.start_ours("ours-b")
            wait_for("one lease each again", lambda: run.settled({"ours-b", "rust-a"}), 180)
            time.sleep(SETTLE)

            def kill_ours() -> set[str]:
                moved = held_by("ours-b")
                run.ours.kill9("ours-b")
                return moved

            step(run, "kill -9 kclpy-spark -> kcl-rs", kill_ours, {"rust-a"}, rust_pids, results)
            run.start_ours("ours-c")
            wait_for("one lease each, a third time", lambda: run.settled({"ours-c", "rust-a"}), 180)
            time.sleep(SETTLE)

            def kill_rust() -> set[str]:
                moved = held_by("rust-a")
                run.stop_rust("rust-a", signal.SIGKILL)
                return moved

            step(run, "kill -9 kcl-rs -> kclpy-spark", kill_rust, {"ours-c"}, ours_pids, results)
        # the rolling migration: three kcl-rs workers, replaced one by one
        run.ours.stop_all()
        for i in range(3):
            run.start_rust(f"rust-m{i}")
        wait_for("the kcl-rs workers' leases", lambda: run.settled(set(run.rust), exact=False),
                 240)  # fmt: skip
        for i in range(3):
            old, new = f"rust-m{i}", f"ours-m{i}"

            def replace_one(old: str = old) -> set[str]:
                moved = held_by(old)
                run.stop_rust(old)
                return moved

            left = set(run.rust) - {old} | {f"ours-m{j}" for j in range(i)}
            run.start_ours(new)
            step(run, f"migration {i + 1}: SIGTERM kcl-rs", replace_one, left | {new},
                 lambda: ours_pids() | rust_pids(), results, exact=False)  # fmt: skip
        time.sleep(3)
    finally:
        stop.set()
        feeder.join()
    wait_for("every record delivered", lambda: {r["data"] for r in run.records()} >= set(sent), 120)
    counts = Counter(r["data"] for r in run.records())
    results.update(unread(run))
    results["timeline"] = timeline(run)
    results["sent"] = len(sent)
    results["twice"] = sum(1 for n in sent if counts[n] > 1)
    results["lost"] = sum(1 for n in sent if counts[n] == 0)
    return results


def timeline(run: Run) -> list[str]:
    """Who processed each shard when (seconds from the first record), with the steps."""
    records = sorted(run.records(), key=lambda r: r["t"])
    if not records:
        return []
    t0 = records[0]["t"]
    lines = [f"- {t - t0:6.1f} s: {name}" for t, name, _ in run.events]
    for shard in sorted({r["shard"] for r in records}):
        spans: list[list[Any]] = []
        for r in (x for x in records if x["shard"] == shard):
            who = run.names.get(r["pid"], str(r["pid"]))
            if spans and spans[-1][0] == who:
                spans[-1][2], spans[-1][3] = r["t"], spans[-1][3] + 1
            else:
                spans.append([who, r["t"], r["t"], 1])
        lines += [f"- {shard}: " + "; ".join(
            f"{w} {a - t0:.1f}-{b - t0:.1f} s ({n})" for w, a, b, n in spans)]  # fmt: skip
    return lines


def report(results: dict[str, Any], rate: float, extra: str) -> str:
    rows = [(k, v) for k, v in results.items() if isinstance(v, list) and k != "timeline"]
    lines = [
        f"# kclpy-spark and kcl-rs on one lease table ({stamp()})", "", machine(), "",
        f"kclpy-spark settings beyond the defaults: `{extra or 'none'}`.", "",
        f"Producer {rate:g} records/s on 2 shards; {results['sent']} records sent, "
        f"{results['twice']} delivered twice, {results['lost']} never delivered.", "",
        "| step | per lease it moved: the longest time (s) no record of it was processed, "
        "until the next step |",
        "|---|---|",
        *[f"| {k} | {', '.join(f'{g:.1f}' for g in v) or 'none moved'} |" for k, v in rows],
        "", "Who processed each shard when (worker: from-to seconds, records):", "",
        *results["timeline"],
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--no-steal-from-kcl",
        action="store_true",
        help="steal_from_kcl_workers = false (as docs/migration.md advises)",
    )
    args = parser.parse_args()
    require_endpoint(ENDPOINT)
    extra = "steal_from_kcl_workers = false" if args.no_steal_from_kcl else ""
    work = Path("/tmp") / f"bench-kcl-rs-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    run = Run(work, f"bench-kcl-rs-{uuid.uuid4().hex[:8]}", extra)
    try:
        results = scenario(run, args.rate, migration_only=bool(extra))
    finally:
        run.stop()
    text = report(results, args.rate, extra)
    print(text)
    if not args.no_write:
        print(f"wrote {write_results('kcl_rs_fleet.md', text)}")


if __name__ == "__main__":
    main()
