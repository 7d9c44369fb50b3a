"""Steady-state lease-table cost per lease per minute: ``python bench/bench_lease_requests.py``.

In-process workers (``run_worker``; ``--workers``, one by default, which then holds every lease)
share the leases of an N-shard stream on kinesalite (in memory, idle: no records, so no
checkpoints). Each one's lease store is wrapped in a counter of every port call. After the leases
settled and a warm-up, the calls of every worker in a steady-state window are counted and turned
into requests per lease per minute, against the KCL's models for the same failover time and
number of workers (bench/kcl_model.py: 3.x, and 2.x).

``--store dynamodb`` (the default when ``LOCALSTACK_ENDPOINT`` is set) puts the lease table on
LocalStack's DynamoDB, and counts what DynamoDB itself reports for every request (the store's
capacity meter, ReturnConsumedCapacity): requests and read and write capacity units by
operation. ``--store sqlite`` / ``memory`` count port calls only: every call is one request
(GetItem, PutItem, UpdateItem, DeleteItem), ``list_leases`` a Scan of one page.
``--rate N`` puts N records per second per shard on the stream while the workers run (a
producer thread), so each lease is checkpointed after every batch that carried records:
steady state with records flowing. The KCL 3.x model then gets the same checkpoints as ours
(the application's choice, one write unit each for the KCL's item), on top of its renewals.
``--renewals skip kcl`` runs each value of ``skip_checkpointed_renewals`` (true: a lease's
counter moves every half failover time, by a renewal unless a checkpoint moved it; false: every
lease every third of it, the KCL's).
Writes ``bench/results/lease_requests.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, stamp, write_results
from kcl_model import Cost, kcl2, kcl3

from checkpoint.leasing.timing import LeaseTiming
from checkpoint.sequence import InitialPosition
from checkpoint.stores.capacity import Usage, item_size, split_units, write_units
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker

# What each port method is for, to group the counts.
ROLES = {
    "renew_lease": "renewal",
    "list_leases": "scan (leader maintenance, status page)",
    "scan_table": "scan (taker; with lease_assignment = leader, the leader only)",
    "list_lease_keys_by_owner": "owner-index query (lease_assignment = leader, non-leaders)",
    "get_lease": "lease read",
    "take_lease": "take",
    "evict_lease": "release",
    "update_lease": "lease update",
    "update_checkpoint": "checkpoint",
    "create_lease_if_absent": "lease creation",
    "delete_lease": "lease deletion",
    "get_record": "coordination read (leader, suspend flag, worker status)",
    "put_record": "coordination write (leader heartbeat, worker status)",
    "is_empty": "lease read",
    "ensure_table": "table check",
}


class CountingStore:
    """Wraps a lease store; counts every call of a port method, with its time."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls.append((time.monotonic(), name))
            return attr(*args, **kwargs)

        return counted


class Idle(RecordProcessor):
    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        process_records_input.checkpointer.checkpoint()


def _produce(endpoint: str, stream: str, per_second: float, stop: threading.Event) -> None:
    """Put ``per_second`` records a second, spread over the shards by random partition keys."""
    from kinesalite import sync_client

    client = sync_client(endpoint)
    batch = max(1, round(per_second / 10))
    while not stop.wait(batch / per_second):
        records = [{"Data": b"x" * 100, "PartitionKey": uuid.uuid4().hex} for _ in range(batch)]
        client.put_records(StreamName=stream, Records=records)


def _delete_stream(endpoint: str, stream: str) -> None:
    """Gone before the next run: kinesalite counts every stream's shards against one limit
    (a second 1,000-shard stream was refused)."""
    from kinesalite import sync_client

    client = sync_client(endpoint)
    client.delete_stream(StreamName=stream)
    client.get_waiter("stream_not_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def _dynamo_client(endpoint: str) -> Any:
    """A DynamoDB client for LocalStack (the workers' own store is replaced by a table on it)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
        aws_secret_access_key="bench", config=Config(max_pool_connections=32),
    )  # fmt: skip


def _lease_bytes(table: Any) -> float:
    """The mean size DynamoDB would bill for one lease item of ``table`` as the KCL 3.x writes
    it (what its model prices): without kclpy-spark's stamps and figures."""
    from dataclasses import replace

    from checkpoint.stores import dynamo_codec

    leases = [replace(x, written=None, figures=None) for x in table.list_leases()]
    sizes = [item_size(dynamo_codec.lease_to_item(x)) for x in leases]
    return sum(sizes) / len(sizes) if sizes else 0.0


def worker_id(i: int, host: str | None) -> str:
    """``w<i>``; with ``host``, the product's default form on that host (``host:pid:hex6``)."""
    if host is None:
        return f"w{i}"
    return f"{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _dump(directory: Path, name: str, items: list[dict[str, Any]]) -> None:
    """The table's items, largest first, each with its size as DynamoDB counts it."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    sized = sorted(((item_size(i), i) for i in items), key=lambda pair: -pair[0])
    rows = [{"bytes": size, "item": item} for size, item in sized]
    (directory / f"table-{name}.json").write_text(json.dumps(rows, indent=1) + "\n")


def run(
    endpoint: str,
    shards: int,
    store: str,
    warmup: float,
    window: float,
    workers: int = 1,
    *,
    dynamodb: str | None = None,
    failover: float = 10.0,
    idle: float = 1.0,
    assignment: str = "worker",
    rate: float = 0.0,
    skip: bool = True,
    host: str | None = None,
    dump: Path | None = None,
) -> dict[str, Any]:
    """``workers`` in-process workers on one stream and one lease store; calls counted over all."""
    from kinesalite import create_stream

    stream = f"bench-lease-requests-{uuid.uuid4().hex[:6]}"
    create_stream(endpoint, stream, shards)
    with tempfile.TemporaryDirectory() as tmp:
        base = WorkerConfig(
            application_name=stream,
            stream_name=stream,
            endpoint_url=endpoint,
            initial_position=InitialPosition.trim_horizon(),
            lease_store=f"sqlite:{Path(tmp) / 'leases.db'}" if store == "sqlite" else "memory",
            failover_time=failover,
            idle_time_between_reads=idle,
            lease_assignment=assignment,
            skip_checkpointed_renewals=skip,
        )  # fmt: skip
        if store == "memory" and workers > 1:
            raise SystemExit("several workers need a shared store: --store sqlite or dynamodb")
        wrapped: list[CountingStore] = []
        started: list[Worker] = []
        span: dict[str, Any] = {}

        client = _dynamo_client(dynamodb) if dynamodb is not None else None

        def wrap(inner: Any) -> Any:
            if client is not None:
                from checkpoint.stores.dynamodb import DynamoDBLeaseTable

                inner = DynamoDBLeaseTable(client, stream)
                inner.ensure_table()
            counting = CountingStore(inner)
            wrapped.append(counting)
            return counting

        def meters() -> list[dict[str, Usage]]:
            return [c.capacity.snapshot() for c in wrapped if hasattr(c, "capacity")]

        async def scenario(worker: Worker) -> None:
            started.append(worker)
            if len(started) > 1:
                return  # the first worker's scenario times the window for all
            try:
                await _settle(started, workers, shards)
                await asyncio.sleep(warmup)
                span["start"], span["meters_before"] = time.monotonic(), meters()
                await asyncio.sleep(window)
                span["end"], span["meters_after"] = time.monotonic(), meters()
                span["held"] = sum(len(w.holder.held()) for w in started)
                span["lease_bytes"] = _lease_bytes(wrapped[0])
                if client is not None:  # what each Scan read at the end (after the window)
                    items = client.scan(TableName=stream)["Items"]
                    span["table_bytes"] = sum(item_size(i) for i in items)
                    if dump is not None:
                        renewals = "skip" if skip else "kcl"
                        _dump(dump, f"{shards}x{workers}-{assignment}-{renewals}", items)
            finally:
                for w in started:
                    w.request_shutdown()

        async def fleet() -> None:
            await asyncio.gather(*(
                run_worker(base.with_overrides(worker_id=worker_id(i, host)), Idle,
                           on_started=scenario,
                           install_signal_handlers=False, wrap_store=wrap)
                for i in range(workers)
            ))  # fmt: skip

        stop = threading.Event()
        producer = threading.Thread(
            target=_produce, args=(endpoint, stream, rate * shards, stop), daemon=True
        )
        if rate > 0:
            producer.start()
        try:
            asyncio.run(fleet())
        finally:
            stop.set()
            if client is not None:
                client.delete_table(TableName=stream)
            _delete_stream(endpoint, stream)
    counts = collections.Counter(
        name for store_calls in wrapped for t, name in store_calls.calls
        if span["start"] <= t < span["end"]
    )  # fmt: skip
    return {
        "counts": counts,
        "units": _units(span.get("meters_before", []), span.get("meters_after", [])),
        "minutes": (span["end"] - span["start"]) / 60,
        "held": span["held"],
        "workers": workers,
        "assignment": assignment,
        "rate": rate,
        "skip": skip,
        "failover": base.failover_time,
        "lease_bytes": span["lease_bytes"],
        "table_bytes": span.get("table_bytes"),
    }


def _units(before: list[dict[str, Usage]], after: list[dict[str, Usage]]) -> dict[str, Usage]:
    """What every worker's DynamoDB requests cost in the window, by operation."""
    total: dict[str, Usage] = {}
    for was, now in zip(before, after, strict=True):
        for op, usage in now.items():
            old = was.get(op, Usage())
            got = total.get(op, Usage())
            total[op] = Usage(
                got.requests + usage.requests - old.requests, got.units + usage.units - old.units
            )
    return total


async def _settle(started: list[Worker], workers: int, shards: int) -> None:
    """Until every worker runs, every lease is held and no lease has moved for 20 s (with
    records flowing, balancing by load need not end at equal counts)."""
    deadline = time.monotonic() + 180 + shards  # a thousand leases spread in minutes
    last: list[int] = []
    since = time.monotonic()
    while True:
        held = [len(w.holder.held()) for w in started]
        if held != last:
            last, since = held, time.monotonic()
        spread = len(started) == workers and sum(held) == shards and min(held) > 0
        if spread and time.monotonic() - since >= 20.0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the leases did not settle: {held}")
        await asyncio.sleep(0.2)


def _ours(r: dict[str, Any]) -> Cost | None:
    """Our cost per lease per minute, as DynamoDB reported it (None without DynamoDB)."""
    units: dict[str, Usage] = r["units"]
    if not units:
        return None
    reads, writes = split_units(units)
    requests = sum(u.requests for u in units.values())
    return Cost(requests, reads, writes).per(r["minutes"] * r["held"])


def _row(r: dict[str, Any]) -> str:
    n, k, minutes = r["held"], r["workers"], r["minutes"]
    per_min = {name: c / minutes for name, c in sorted(r["counts"].items())}
    size = round(r["lease_bytes"])
    # The same checkpoints as ours (the application's choice), each a write of the KCL's item.
    checkpoints = r["counts"].get("update_checkpoint", 0) / minutes
    theirs = Cost(checkpoints, 0.0, checkpoints * write_units(size, size))
    k3 = (kcl3(n, k, r["failover"], size) + theirs).per(n)
    k2 = (kcl2(n, k, r["failover"], size) + theirs).per(n)
    ours = _ours(r)
    calls = ", ".join(f"{name} {v:.1f}" for name, v in per_min.items())
    requests = ours.requests if ours else sum(per_min.values()) / n
    ratio = f"**{requests / k3.requests:.2f}x**"
    how = f"{r['assignment']}, {'skip' if r['skip'] else 'every round'}"
    cells = [f"{n}", f"{k} ({how})", f"{r['rate'] * n:g}", f"{minutes * 60:.0f} s", calls,
             f"{requests:.2f}", f"{k3.requests:.2f}", ratio, f"{k2.requests:.2f}"]  # fmt: skip
    if ours is None:
        cells += ["-", f"{k3.read_units:.2f} / {k3.write_units:.2f}", "-"]
    else:
        total, k3_total = ours.read_units + ours.write_units, k3.read_units + k3.write_units
        cells += [
            f"{ours.read_units:.2f} / {ours.write_units:.2f}",
            f"{k3.read_units:.2f} / {k3.write_units:.2f}",
            f"**{total / k3_total:.2f}x**",
        ]
    return "| " + " | ".join(cells) + " |"


def _by_operation(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        if r["units"]:
            per = r["minutes"] * r["held"]
            ops = ", ".join(
                f"{op} {u.requests / per:.2f} req / {u.units / per:.2f} units"
                for op, u in sorted(r["units"].items())
            )
            who = f"{r['held']} leases, {r['workers']} worker(s), {r['assignment']}"
            table = r.get("table_bytes")
            size = f"; the table at the end: {table:,} bytes" if table is not None else ""
            lines.append(f"- {who}, per lease per min: {ops}{size}")
    return lines


def report(results: list[dict[str, Any]], store: str, argv: Sequence[str] | None) -> str:
    timing = LeaseTiming(failover=results[0]["failover"])
    lines = [
        "# Lease-table cost per lease per minute, steady state",
        "",
        f"Run {stamp()} with `python bench/bench_lease_requests.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
        "Kinesis: kinesalite in memory on 127.0.0.1 (records/s as in the table: 0 is an idle "
        "stream, no checkpoints; else checkpoints after every batch that carried records); "
        f"lease store {store}; in-process workers sharing the leases (one: it holds every "
        f"lease); failover_time {timing.failover:g} s: with `skip` each lease's counter moves "
        f"every {timing.renewal_period:.3f} s (renewal rounds every "
        f"{timing.renew_round_interval:.3f} s), with `kcl` every lease is renewed every "
        f"{timing.renew_interval:.3f} s; scans every {timing.take_interval:.3f} s. Units: read / "
        "write capacity units as DynamoDB reported them (ReturnConsumedCapacity); the KCL's "
        "from its model (bench/kcl_model.py, pricing the KCL's own item for the same leases).",
        "",
        "| leases | workers (lease_assignment, renewals) | records/s | counted over | "
        "our port calls (per minute) | "
        "our requests per lease per min | KCL 3.x | ours / KCL 3.x | KCL 2.x | "
        "our units per lease per min (read / write) | KCL 3.x units | ours / KCL 3.x (units) |",
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(r) for r in results),
        "",
        *_by_operation(results),
        "",
        "With `skip` (the default) a lease is renewed when its counter is half a failover time "
        "old (a checkpoint moves it as a renewal does; then a renewal every failover time, "
        "for its figures); with `kcl` every third of it, the KCL's schedule. On top of it each "
        "worker scans every "
        f"{timing.take_interval:.2f} s (the failover time it buys: BENCHMARKS.md; the scan also "
        "brings the leader record and the suspend flag, read on their own only without a "
        "recent scan), reads a lease of another worker once more only when it would expire "
        "unless its counter moved (rare while every worker is alive), and writes its status "
        "when a reader would learn something from it, else every three failover times while it "
        "holds leases (every failover time while it holds none; the leader its record every "
        "1.5). A status record carries the lease events of the last ten minutes: in a run this "
        "short, those of the start (two write units per publish instead of one after ten quiet "
        "minutes).",
        "",
        "By role: " + "; ".join(sorted({f"{k} = {v}" for k, v in ROLES.items()})),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    localstack = os.environ.get("LOCALSTACK_ENDPOINT")
    parser.add_argument(
        "--store", choices=("memory", "sqlite", "dynamodb"),
        default="dynamodb" if localstack else "sqlite",
    )  # fmt: skip
    parser.add_argument("--dynamodb-endpoint", default=localstack or "http://127.0.0.1:4566")
    parser.add_argument("--failover", type=float, default=10.0)
    parser.add_argument("--idle", type=float, default=1.0, help="idle_time_between_reads")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=75.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--results", default="lease_requests.md", help="file in bench/results/")
    parser.add_argument("--rate", type=float, default=0.0, help="records/s per shard")
    parser.add_argument("--renewals", nargs="+", choices=("skip", "kcl"), default=["skip"],
                        help="skip_checkpointed_renewals true / false, each a run")  # fmt: skip
    parser.add_argument("--assignment", nargs="+", choices=("auto", "worker", "leader"),
                        default=["auto"], help="lease_assignment values, each a run")  # fmt: skip
    parser.add_argument(
        "--host",
        help="worker ids in the default form on this host name "
        "(host:pid:hex6, e.g. ip-10-0-12-34.ec2.internal) instead of w0, w1...",
    )
    parser.add_argument(
        "--dump",
        type=Path,
        metavar="DIR",
        help="write each run's table at the end (items and their sizes) here",
    )
    args = parser.parse_args(argv)

    from kinesalite import Kinesalite

    results = []
    dynamodb = args.dynamodb_endpoint if args.store == "dynamodb" else None
    with Kinesalite() as emulator:
        for workers in args.workers:
            for shards in args.shards:
                for assignment, renewals in itertools.product(args.assignment, args.renewals):
                    result = run(
                        emulator.endpoint, shards, args.store, args.warmup, args.window, workers,
                        dynamodb=dynamodb, failover=args.failover, idle=args.idle,
                        assignment=assignment, rate=args.rate, skip=renewals == "skip",
                        host=args.host, dump=args.dump,
                    )  # fmt: skip
                    print(f"{shards} leases, {workers} worker(s), {assignment}, {renewals}: "
                          f"{dict(result['counts'])} in {result['minutes']:.2f} min")  # fmt: skip
                    results.append(result)
    text = report(results, args.store, argv)
    print(text)
    if not args.no_write:
        print(f"written to {write_results(args.results, text)}")


if __name__ == "__main__":
    main(sys.argv[1:])
