"""Rolling restart under a steady producer: records delivered twice with graceful handoff (the
default) against the KCL 2.x steal (``graceful_handoff = false``), measured in one run.

    .venv/bin/python bench/bench_handoff.py [--rate 20] [--no-write] [--against COMMIT]

Per variant, as a user runs it (the CLI and a config file, default timing: failover_time 10 s):
a 4-shard stream on LocalStack, DynamoDB lease table; a producer at ``--rate`` records/s; the
soak's BatchLines processor (one JSON line per batch, 0.2 s of work per batch, a checkpoint after
each batch and in ``shutdown_requested``). Three workers start and balance; each is restarted once
with SIGTERM (waiting for the leases to settle in between); then a fourth joins. Counted from the
processor's lines: records delivered more than once, records never delivered, and per moved lease
the gap between the old owner's last batch and the new owner's first (split by moves at a SIGTERM
and the others). ``--against COMMIT`` adds the graceful variant run with that commit's code, as
the baseline of this one. Needs LocalStack on
127.0.0.1:4566 (``python3 localstack/lsctl.py start``). Writes bench/results/handoff.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import ENDPOINT, Fleet, _kinesis, open_store, wait_for
from common import REPO, machine, require_endpoint, stamp, write_results

SHARDS = 4
DELAY = 0.2


def config(app: str, graceful: bool) -> str:
    return f"""
application_name = "{app}"
stream_name = "{app}"
endpoint_url = "{ENDPOINT}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "soak_processor:BatchLines"
graceful_handoff = {str(graceful).lower()}
"""


def producer(kinesis: Any, stream: str, rate: float, stop: threading.Event) -> list[str]:
    sent: list[str] = []
    n = 0
    while not stop.wait(1.0):
        batch = [str(i) for i in range(n, n + int(rate))]
        records = [{"Data": d.encode(), "PartitionKey": f"pk-{d}"} for d in batch]
        while records:
            result = kinesis.put_records(StreamName=stream, Records=records)["Records"]
            records = [r for r, x in zip(records, result, strict=True) if "ErrorCode" in x]
        sent += batch
        n += int(rate)
    return sent


def lines(out: Path) -> list[dict[str, Any]]:
    rows = []
    for path in out.glob("batches-*.jsonl"):
        pid = path.stem.split("-")[1]
        rows += [{**json.loads(x), "pid": pid} for x in path.read_text().splitlines() if x]
    return sorted(rows, key=lambda r: r["t"])


def gaps(rows: list[dict[str, Any]], stopped: dict[str, float]) -> list[tuple[float, bool]]:
    """Per change of the process delivering a shard: first batch of the new one minus last of
    the old one (negative: both delivered at once), and whether the move came from a SIGTERM
    (the old process had been sent it, ``stopped``: pid -> time, before the new owner's first
    batch)."""
    out = []
    last: dict[str, dict[str, Any]] = {}
    for row in rows:
        before = last.get(row["shard"])
        if before is not None and before["pid"] != row["pid"]:
            sigterm = before["pid"] in stopped and row["t"] >= stopped[before["pid"]]
            out.append((row["t"] - before["t"], sigterm))
        last[row["shard"]] = row
    return out


def variant(
    graceful: bool, rate: float, work: Path, tree: Path = REPO, code: str = "this checkout"
) -> dict[str, Any]:
    app = f"bench-handoff-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    (work / "worker.toml").write_text(config(app, graceful))
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=app, ShardCount=SHARDS)
    kinesis.get_waiter("stream_exists").wait(StreamName=app)
    fleet = Fleet(work, work / "worker.toml", tree)
    fleet.env.update(KCLPY_SPARK_SAMPLE_OUTPUT=str(work / "out"), BATCH_DELAY=str(DELAY))
    fleet.env["PYTHONPATH"] += f":{REPO / 'bench'}"
    stop = threading.Event()
    sent: list[str] = []
    thread = threading.Thread(target=lambda: sent.extend(producer(kinesis, app, rate, stop)))
    thread.start()
    store: Any = None
    stopped: dict[str, float] = {}  # pid -> time of its SIGTERM

    def settled(n: int) -> bool:
        held = Counter(x.actual_owner for x in store.list_leases() if x.actual_owner)
        return (
            len(held) == n
            and max(held.values()) - min(held.values()) <= 1
            and not any(x.handoff_pending for x in store.list_leases())
        )

    try:
        for w in ("w1", "w2", "w3"):
            fleet.start(w)
        wait_for("the lease table", lambda: open_store("dynamodb", work, app).list_leases(), 120)
        store = open_store("dynamodb", work, app)
        wait_for("3 workers balanced", lambda: settled(3), 180)
        for w in ("w1", "w2", "w3"):  # a rolling restart
            proc = fleet.procs.pop(w)
            stopped[str(proc.pid)] = time.time()
            proc.send_signal(15)
            proc.wait(timeout=60)
            time.sleep(2)
            fleet.start(w)
            wait_for(f"{w} back and balanced", lambda: settled(3), 180)
        fleet.start("w4")
        wait_for("4 workers balanced", lambda: settled(4), 180)
        time.sleep(5)
    finally:
        stop.set()
        thread.join()
        time.sleep(15)  # the last records reach their processors
        fleet.stop_all()
        kinesis.delete_stream(StreamName=app, EnforceConsumerDeletion=True)
    (work / "sigterms.json").write_text(json.dumps(stopped))  # for a look at single moves
    rows = lines(work / "out")
    delivered = Counter(d for r in rows for d in r["data"])
    moves = gaps(rows, stopped)
    g = [x for x, _ in moves]
    at_stop = [x for x, sigterm in moves if sigterm]
    return {
        "code": code,
        "graceful_handoff": graceful,
        "records": len(sent),
        "lost": len(set(sent) - set(delivered)),
        "twice": sum(n - 1 for n in delivered.values() if n > 1),
        "moves": len(g),
        "overlapping_moves": sum(1 for x in g if x < 0),
        "gap_median": statistics.median(g) if g else 0.0,
        "gap_max": max(g) if g else 0.0,
        "sigterm_moves": len(at_stop),
        "sigterm_gap_max": max(at_stop) if at_stop else 0.0,
        "other_gap_max": max((x for x, sigterm in moves if not sigterm), default=0.0),
    }


def report(results: list[dict[str, Any]], rate: float) -> str:
    head = (
        "| code | graceful_handoff | records | lost | delivered twice | lease moves | moves with "
        "both owners delivering | gap median (s) | gap max (s) | moves at a SIGTERM | their gap "
        "max (s) | other moves' gap max (s) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = "".join(
        f"| {r['code']} | {r['graceful_handoff']} | {r['records']} | {r['lost']} | {r['twice']} "
        f"| {r['moves']} | {r['overlapping_moves']} | {r['gap_median']:.2f} | "
        f"{r['gap_max']:.2f} | {r['sigterm_moves']} | {r['sigterm_gap_max']:.2f} | "
        f"{r['other_gap_max']:.2f} |\n"
        for r in results
    )
    return (
        f"# Rolling restart: graceful handoff vs the KCL 2.x steal\n\n{stamp()} on {machine()}; "
        f"4 shards, {rate:g} records/s, DynamoDB on LocalStack, BatchLines with {DELAY} s per "
        "batch, 3 workers each restarted once with SIGTERM, then a 4th joins.\n\n" + head + rows
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--against", metavar="COMMIT",
        help="also run the graceful variant with that commit's code (checked out under "
        ".cache/bench/versions/) as a baseline",
    )  # fmt: skip
    args = parser.parse_args()
    require_endpoint(ENDPOINT)
    base = REPO / ".cache" / "bench" / f"handoff-{time.strftime('%H%M%S')}"
    results = []
    if args.against:
        from bench_versions import worktree

        tree = worktree(args.against)
        results.append(variant(True, args.rate, base / "against", tree, args.against))
    results += [variant(g, args.rate, base / str(g).lower()) for g in (False, True)]
    text = report(results, args.rate)
    print(text)
    if not args.no_write:
        write_results("handoff.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
