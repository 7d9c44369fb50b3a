"""One hot shard: does load-aware balancing give the hot shard's worker nothing else, keep the
workers' CPU close, and move no lease back and forth?

    .venv/bin/python bench/bench_hot_shard.py [--minutes 10] [--no-write]
    .venv/bin/python bench/bench_hot_shard.py --burn-ms 10   # a busy fleet: balancing by CPU

As a user runs it (the CLI and a config file, default timing): a 4-shard stream on LocalStack, a
DynamoDB lease table, the soak's BatchLines processor; a producer puts ~1 KB records, 10x as many
into one shard (explicit hash keys) as into each other one. Worker w1 starts alone and takes all
four leases; w2 joins. Every 5 s the lease table is read (owners and throughputKBps) and each
worker's CPU seconds (/proc/<pid>/stat). Reported after the balancing settles: which leases each
worker holds, lease moves during the last ``--minutes`` (should be none), and the two workers' CPU
over that time. Needs LocalStack on 127.0.0.1:4566. Writes bench/results/hot-shard.md.

``--burn-ms N``: a busy fleet instead. The processor is the soak's Burner (N ms of CPU per record,
then a checkpoint), and each worker is pinned to one core (``taskset``; its limit is then one
CPU), so the fleet uses more than the 20% of its CPU from which ``load_metric = "auto"`` balances
by CPU. Writes bench/results/hot-shard-busy.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_failover import ENDPOINT, Fleet, _kinesis, open_store, wait_for
from common import REPO, machine, require_endpoint, stamp, write_results

COLD_RATE = 4  # records/s into each cold shard; the hot one gets 10x
PAYLOAD = 1000


def config(app: str, processor: str = "BatchLines") -> str:
    return f"""
application_name = "{app}"
stream_name = "{app}"
endpoint_url = "{ENDPOINT}"
initial_position = "LATEST"
lease_store = "dynamodb"
processor = "soak_processor:{processor}"
"""


def producer(kinesis: Any, stream: str, stop: threading.Event) -> None:
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    keys = [s["HashKeyRange"]["StartingHashKey"] for s in shards]
    n = 0
    while not stop.wait(1.0):
        records = []
        for i, key in enumerate(keys):
            for _ in range(COLD_RATE * (10 if i == 0 else 1)):
                data = (str(n).encode() + b" " + b"x" * PAYLOAD)[:PAYLOAD]
                records.append({"Data": data, "PartitionKey": "p", "ExplicitHashKey": key})
                n += 1
        for start in range(0, len(records), 500):
            kinesis.put_records(StreamName=stream, Records=records[start : start + 500])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Watched:
    settled_after: float  # seconds from the start until the last move before a quiet minute
    moves_before: int  # lease moves until then
    moves: int  # lease moves over the measured minutes
    cpu: dict[str, float]  # worker -> CPU seconds per second over the measured minutes
    owners: dict[str, str | None]  # lease -> owner at the end


def settle_then_measure(
    owners: Callable[[], dict[str, str | None]], pids: dict[str, int], minutes: float
) -> Watched:
    """Read the owners every 5 s until none has changed for a minute (at most 10 minutes),
    then count moves and each process's CPU over ``minutes``."""
    start = time.monotonic()
    previous, stable_since, moves_before = owners(), start, 0
    while time.monotonic() - stable_since < 60 and time.monotonic() - start < 600:
        time.sleep(5)
        now = owners()
        if now != previous:
            moves_before += sum(1 for k in now if now[k] != previous.get(k))
            previous, stable_since = now, time.monotonic()
    cpu0 = {w: cpu_seconds(pid) for w, pid in pids.items()}
    t0, moves, last = time.monotonic(), 0, owners()
    while time.monotonic() - t0 < minutes * 60:
        time.sleep(5)
        now = owners()
        moves += sum(1 for k in now if now[k] != last.get(k))
        last = now
    elapsed = time.monotonic() - t0
    cpu = {w: (cpu_seconds(pid) - cpu0[w]) / elapsed for w, pid in pids.items()}
    return Watched(stable_since - start, moves_before, moves, cpu, last)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--burn-ms", type=float, default=0.0, help="a busy fleet (see above)")
    parser.add_argument("--results", help="results file name (default hot-shard[-busy].md)")
    args = parser.parse_args()
    require_endpoint(ENDPOINT)
    app = f"bench-hot-{uuid.uuid4().hex[:8]}"
    work = REPO / ".cache" / "bench" / f"hot-{time.strftime('%H%M%S')}"
    work.mkdir(parents=True)
    busy = args.burn_ms > 0
    (work / "worker.toml").write_text(config(app, "Burner" if busy else "BatchLines"))
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=app, ShardCount=4)
    kinesis.get_waiter("stream_exists").wait(StreamName=app)
    hot = kinesis.list_shards(StreamName=app)["Shards"][0]["ShardId"]
    fleet = Fleet(work, work / "worker.toml")
    fleet.env.update(KCLPY_SPARK_SAMPLE_OUTPUT=str(work / "out"))
    fleet.env["PYTHONPATH"] += f":{REPO / 'bench'}"
    fleet.env["BURN_MS"] = str(args.burn_ms)
    pin = {"w1": ["taskset", "-c", "0"], "w2": ["taskset", "-c", "1"]} if busy else {}
    stop = threading.Event()
    thread = threading.Thread(target=producer, args=(kinesis, app, stop))
    thread.start()
    try:
        fleet.start("w1", pin.get("w1", []))
        wait_for("the lease table", lambda: open_store("dynamodb", work, app).list_leases(), 120)
        store = open_store("dynamodb", work, app)
        wait_for("w1 holding all leases",
                 lambda: {x.lease_owner for x in store.list_leases()} == {"w1"}, 120)  # fmt: skip
        time.sleep(20)  # throughput measured and written
        fleet.start("w2", pin.get("w2", []))

        def owners() -> dict[str, str | None]:
            return {x.shard_id: x.actual_owner for x in store.list_leases()}

        pids = {w: p.pid for w, p in fleet.procs.items()}
        watched = settle_then_measure(owners, pids, args.minutes)
        settled_after, moves, cpu = watched.settled_after, watched.moves, watched.cpu
        leases = store.list_leases()
    finally:
        stop.set()
        thread.join()
        fleet.stop_all()
        kinesis.delete_stream(StreamName=app, EnforceConsumerDeletion=True)
    hot_owner = next(x.actual_owner for x in leases if x.shard_id == hot)
    rows = "".join(
        f"| {x.shard_id}{' (hot)' if x.shard_id == hot else ''} | {x.actual_owner} | "
        f"{x.throughput_kbps if x.throughput_kbps is not None else '-'} |\n"
        for x in sorted(leases, key=lambda x: x.shard_id)
    )
    others = [x.shard_id for x in leases if x.actual_owner == hot_owner and x.shard_id != hot]
    spread = max(cpu.values()) / min(cpu.values()) if min(cpu.values()) > 0 else float("inf")
    fleet_text = (
        f"the Burner processor, {args.burn_ms:g} ms of CPU per record, each worker pinned to "
        "one core" if busy else "the BatchLines processor"
    )  # fmt: skip
    text = (
        f"# One hot shard, load-aware balancing\n\n{stamp()} on {machine()}; 4 shards, "
        f"{COLD_RATE} records/s of {PAYLOAD} B into each cold shard, {10 * COLD_RATE} into the "
        f"hot one; {fleet_text}; DynamoDB on LocalStack; w1 alone, then w2 joins.\n\n"
        f"Settled {settled_after:.0f} s after w2 joined. Then, over {args.minutes:g} minutes: "
        f"**{moves} lease moves**; CPU w1 {cpu.get('w1', 0):.1%}, w2 {cpu.get('w2', 0):.1%} of a "
        f"core (ratio {spread:.2f}); the hot shard's worker ({hot_owner}) holds "
        f"{'no other lease' if not others else 'also ' + ', '.join(others)}.\n\n"
        "| lease | owner | throughputKBps |\n|---|---|---|\n" + rows
    )
    print(text)
    if not args.no_write:
        write_results(args.results or ("hot-shard-busy.md" if busy else "hot-shard.md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
