"""Failover after kill -9: ``python bench/bench_failover.py [--lease-store sqlite|dynamodb]``.

Two worker processes (``python -m kclpy_spark.cli run --config ...``, failover_time 10 s, the
sample CountingProcessor) share a 4-shard stream on LocalStack (127.0.0.1:4566) and a lease store
(SQLite in a temporary directory by default; or DynamoDB on LocalStack). Once the leases are
spread over both, the one holding the most is killed with SIGKILL, and this process polls the lease
table every 50 ms until every lease it held is owned by the survivor. The kill comes at a random
moment (uniform over one take interval) after the leases balanced, so trials sample every phase of
the survivor's scan cycle. Then a fresh worker joins,
the leases rebalance, and the next trial kills again. Median of ``--trials``. With ``--against
COMMIT`` the same trials (same kill moments) run first with that commit's code as the baseline.

Reported per trial: the failover time from the kill, and from the victim's last renewal seen in
the table (the lease duration counts from there). The KCL's bound for the same failover time is
failover + take interval = 10 + (10 + 0.025) * 2 = 30.05 s: a lease expires a failover time after
its last renewal, and the KCL's taker scans every 2 x (failover + epsilon). kclpy-spark's taker
scans every 0.7 x (failover + epsilon) and reads a lease once more when it would expire
(``checkpoint/leasing/timing.py``). Writes ``bench/results/failover.md`` (with ``--rate``:
``failover-records.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, child_env, machine, median, reap, require_endpoint, stamp, write_results

from checkpoint.base.errors import KclpySparkError
from checkpoint.leasing.timing import LeaseTiming

ENDPOINT = os.environ.get("LOCALSTACK_ENDPOINT", "http://127.0.0.1:4566")
FAILOVER = 10.0
POLL = 0.05
SHARDS = 4


def _kinesis() -> Any:
    import boto3

    return boto3.client(
        "kinesis",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


class Fleet:
    """Worker processes of one application; each logs to a file in ``workdir``."""

    def __init__(self, workdir: Path, config: Path, tree: Path = REPO) -> None:
        self.workdir = workdir
        self.config = config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = child_env(PYTHONPATH=str(tree))

    def start(
        self, worker_id: str, prefix: Sequence[str] = (), env: dict[str, str] | None = None
    ) -> None:
        """Start a worker; ``prefix`` goes before the command (``taskset -c 0``), ``env`` over
        the fleet's environment."""
        log = (self.workdir / f"{worker_id}.log").open("wb")
        self.procs[worker_id] = subprocess.Popen(
            [*prefix, sys.executable, "-m", "kclpy_spark.cli", "--log-level", "INFO", "run",
             "--config", str(self.config), "--worker-id", worker_id],
            stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})},
            cwd=self.workdir,
        )  # fmt: skip
        log.close()

    def kill9(self, worker_id: str) -> None:
        proc = self.procs.pop(worker_id)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            reap(proc, 30)
        self.procs.clear()


def _dynamodb() -> Any:
    import boto3

    return boto3.client(
        "dynamodb",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


class SQLiteOwners:
    """Owners and counters read straight from a SQLite lease file: the same for every version
    of the store (a reader with this checkout's store would add its columns to an older
    version's file, which that version then refuses)."""

    def __init__(self, path: Path, app: str) -> None:
        self.path, self.app = path, app

    def ensure_table(self) -> None:
        self.list_leases()

    def list_leases(self) -> list[Any]:
        import sqlite3
        from types import SimpleNamespace

        sql = (
            "SELECT lease_key, lease_owner, lease_counter FROM kclpy_spark_leases "
            "WHERE namespace = ?"
        )
        try:
            with contextlib.closing(sqlite3.connect(self.path, timeout=5)) as conn:
                rows = conn.execute(sql, (self.app,)).fetchall()
        except sqlite3.Error as exc:  # not created yet, or busy
            raise KclpySparkError(str(exc)) from exc
        return [SimpleNamespace(lease_key=k, lease_owner=o, lease_counter=c) for k, o, c in rows]


def open_store(kind: str, path: Path, app: str) -> Any:
    if kind == "sqlite":
        return SQLiteOwners(path, app)
    from checkpoint.stores.dynamodb import DynamoDBLeaseTable

    return DynamoDBLeaseTable(_dynamodb(), app, create_if_missing=False)


def ensured(store: Any) -> bool:
    store.ensure_table()
    return True


def owners(store: Any) -> dict[str, tuple[str | None, int]]:
    """lease key -> (owner, counter)."""
    return {x.lease_key: (x.lease_owner, x.lease_counter) for x in store.list_leases()}


def wait_for(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except KclpySparkError:  # e.g. the DynamoDB table is still being created
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _produce(stream: str, rate: float, stop: threading.Event) -> None:
    """About ``rate`` records per second, spread over the shards, until ``stop``."""
    kinesis = _kinesis()
    n = 0
    while not stop.wait(1.0):
        count = max(1, round(rate))
        entries = [{"Data": str(n + i).encode(), "PartitionKey": f"k{n + i}"} for i in range(count)]
        try:
            kinesis.put_records(StreamName=stream, Records=entries)
        except Exception as exc:  # the stream is being deleted at the end
            print(f"producer: {exc!r}", flush=True)
        n += count


def trial(
    fleet: Fleet, store: Any, balance_timeout: float, rng: random.Random, take_interval: float
) -> dict[str, Any]:
    """Wait until both live workers hold leases (balanced if possible), kill the busier one,
    and time until the survivor owns everything the victim held."""
    live = set(fleet.procs)

    def counts() -> dict[str, int]:
        held = {w: 0 for w in live}
        for owner, _ in owners(store).values():
            if owner in held:
                held[owner] += 1
        return held

    try:
        wait_for("balanced leases", lambda: sorted(counts().values()) == [2, 2], balance_timeout)
    except TimeoutError:
        wait_for("leases on both workers", lambda: min(counts().values()) >= 1, balance_timeout)
    held = counts()
    victim = max(held, key=lambda w: held[w])
    survivor = next(w for w in live if w != victim)
    # Balance is reached right after a take round of the newest worker: kill at a random moment
    # of the survivor's scan cycle, not at a fixed phase of it.
    time.sleep(rng.uniform(0, take_interval))
    # Watch the victim's counters just before the kill to know when it last renewed.
    last_change = time.monotonic()
    seen = owners(store)
    for _ in range(int(4.0 / POLL)):
        time.sleep(POLL)
        now_owners = owners(store)
        if any(now_owners[k][1] != seen[k][1] for k in now_owners if seen[k][0] == victim):
            last_change = time.monotonic()
        seen = now_owners
    victims_leases = sorted(k for k, (owner, _) in seen.items() if owner == victim)
    killed = time.monotonic()
    fleet.kill9(victim)
    while True:
        now_owners = owners(store)
        if all(now_owners[k][0] == survivor for k in victims_leases):
            done = time.monotonic()
            break
        if time.monotonic() - killed > 120:
            raise TimeoutError("the survivor did not take the leases within 120 s")
        time.sleep(POLL)
    return {
        "victim": victim,
        "survivor": survivor,
        "leases": len(victims_leases),
        "from_kill": done - killed,
        "from_last_renewal": done - last_change,
        "renewed_before_kill": killed - last_change,
    }


def run_trials(
    args: argparse.Namespace, tree: Path, rng: random.Random, assignment: str = "worker"
) -> list[dict[str, Any]]:
    """One fleet of ``tree``'s code on a fresh stream and lease table: ``args.trials`` kills."""
    timing = LeaseTiming(failover=FAILOVER)
    app = f"failover-bench-{uuid.uuid4().hex[:8]}"
    stream = app
    kinesis = _kinesis()
    kinesis.create_stream(StreamName=stream, ShardCount=SHARDS)
    kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.5})
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        workdir = Path(tmp)
        db = workdir / "leases.db"
        store_setting = f"sqlite:{db}" if args.lease_store == "sqlite" else "dynamodb"
        config = workdir / "worker.toml"
        config.write_text(
            f'application_name = "{app}"\nstream_name = "{stream}"\n'
            f'endpoint_url = "{ENDPOINT}"\nregion = "us-east-1"\n'
            f'initial_position = "TRIM_HORIZON"\nlease_store = "{store_setting}"\n'
            f'processor = "kclpy_spark.demo.samples:CountingProcessor"\n'
            f"failover_time = {FAILOVER}\n"
            + (f'lease_assignment = "{assignment}"\n' if assignment != "worker" else "")
        )
        fleet = Fleet(workdir, config, tree)
        stop_producing = threading.Event()
        producer = threading.Thread(
            target=_produce, args=(stream, args.rate, stop_producing), daemon=True
        )
        try:
            if args.rate > 0:
                producer.start()
            fleet.start("worker-0")
            fleet.start("worker-1")
            wait_for("the lease table", lambda: db.exists() or args.lease_store != "sqlite", 60)
            store = open_store(args.lease_store, db, app)
            wait_for("4 leases", lambda: ensured(store) and len(owners(store)) == SHARDS, 60)
            for n in range(args.trials):
                result = trial(fleet, store, 90, rng, timing.take_interval)
                results.append(result)
                print(
                    f"{tree.name} trial {n + 1}: {result['leases']} leases of {result['victim']} "
                    f"owned by {result['survivor']} {result['from_kill']:.2f}s after kill -9 "
                    f"({result['from_last_renewal']:.2f}s after its last renewal)",
                    flush=True,
                )
                fleet.start(f"worker-{n + 2}")
        finally:
            stop_producing.set()
            fleet.stop_all()
            if producer.is_alive():
                producer.join(10)
            kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
            if args.lease_store == "dynamodb":
                _dynamodb().delete_table(TableName=app)
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1, help="for the kill moments")
    parser.add_argument("--lease-store", choices=("sqlite", "dynamodb"), default="sqlite")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--rate", type=float, default=0.0,
        help="records/s put into the stream during the trials (the processors checkpoint every "
        "batch, so the counter moves with each): 0 for idle shards",
    )  # fmt: skip
    parser.add_argument(
        "--against", metavar="COMMIT",
        help="first run the same trials (same kill moments) with that commit's code, checked out "
        "under .cache/bench/versions/, as the baseline",
    )  # fmt: skip
    parser.add_argument(
        "--assignment", nargs="+", choices=("worker", "leader"), default=["worker"],
        help="lease_assignment values, each a run of this checkout (same kill moments)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    require_endpoint(ENDPOINT)
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    if args.against:
        from bench_versions import worktree

        runs.append(
            (args.against, run_trials(args, worktree(args.against), random.Random(args.seed)))
        )
    for assignment in args.assignment:
        name = "this checkout" + (f" ({assignment})" if len(args.assignment) > 1 else "")
        runs.append((name, run_trials(args, REPO, random.Random(args.seed), assignment)))
    text = report(args, argv, runs)
    print(text)
    if not args.no_write:
        name = "failover-records.md" if args.rate > 0 else "failover.md"
        print(f"written to {write_results(name, text)}")


def report(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    runs: list[tuple[str, list[dict[str, Any]]]],
) -> str:
    timing = LeaseTiming(failover=FAILOVER)
    kcl_take = (FAILOVER + timing.epsilon) * 2
    kcl_bound = FAILOVER + kcl_take
    lines = [
        "# Failover after kill -9",
        "",
        f"Run {stamp()} with `python bench/bench_failover.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
        f"Endpoint: LocalStack at {ENDPOINT} (Kinesis, 4-shard stream); lease store "
        f"{args.lease_store}{' on LocalStack' if args.lease_store == 'dynamodb' else ''}; "
        f"failover_time {FAILOVER:.0f} s: this checkout moves each lease's counter every "
        f"{timing.renewal_period:.3f} s (by a renewal unless a checkpoint did), scans every "
        f"{timing.take_interval:.3f} s (the KCL: every {kcl_take:.2f} s) "
        f"and reads a lease once more when it would expire, dated by its write stamp plus "
        f"max_clock_skew {timing.max_clock_skew:g} s. "
        + (
            f"A producer puts ~{args.rate:g} records/s and CountingProcessor checkpoints every "
            "batch, so the counters move with the records too."
            if args.rate > 0
            else "No records flow (idle shards): only renewals move the counters."
        ),
        "",
        "| code | trial | leases moved | from kill -9 (s) | from last renewal (s) | vs KCL bound "
        f"{kcl_bound:.2f} s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    medians = []
    for name, results in runs:
        for n, r in enumerate(results, 1):
            lines.append(
                f"| {name} | {n} | {r['leases']} | {r['from_kill']:.2f} | "
                f"{r['from_last_renewal']:.2f} | {r['from_kill'] / kcl_bound:.2f}x |"
            )
        from_kill = median([r["from_kill"] for r in results])
        from_renewal = median([r["from_last_renewal"] for r in results])
        medians.append(from_kill)
        lines.append(
            f"| **{name}: median** | | | **{from_kill:.2f}** | **{from_renewal:.2f}** | "
            f"**{from_kill / kcl_bound:.2f}x** |"
        )
    if len(medians) == 2:
        lines += ["", f"Median from the kill, this checkout / {runs[0][0]}: "
                  f"**{medians[1] / medians[0]:.2f}x**."]  # fmt: skip
    lines += [
        "",
        "Expected for this checkout: the survivor sees the victim's last write at a scan (or a "
        "look), dates it by its stamp, and reads the lease again "
        f"{FAILOVER:g} + {timing.max_clock_skew:g} s after that write; finding it unchanged, it "
        "scans and takes it at once. So the take comes about "
        f"{FAILOVER + timing.max_clock_skew:g} s after the victim's last write: up to one renewal "
        f"period ({timing.renewal_period:.2f} s) before the kill on idle shards, about at the "
        "kill while checkpoints flow. Without stamps, a counter change is dated at the scan that "
        "first sees it, up to one scan interval late, and the take waits for a scan after the "
        "expiry. The KCL's taker, scanning every "
        f"{kcl_take:.2f} s, takes it {FAILOVER:g} to {FAILOVER + kcl_take:.2f} s after the last "
        "write.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    main(sys.argv[1:])
