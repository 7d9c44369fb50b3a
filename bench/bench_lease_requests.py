"""Steady-state lease-table requests per lease per minute: ``python bench/bench_lease_requests.py``.

In-process workers (``run_worker``; ``--workers``, one by default, which then holds every lease)
share the leases of an N-shard stream on kinesalite (in memory, idle: no records, so no
checkpoints). Each one's lease store (SQLite by default, shared; memory for one worker) is wrapped
in a counter of every port call. After the leases settled and a warm-up, the calls of every worker
in a steady-state window are counted by method and turned into requests per lease per minute,
against the KCL's model for the same failover time and number of workers.

How calls map to DynamoDB requests (what a lease table costs): every port call is one request
(GetItem, PutItem, UpdateItem, DeleteItem), except ``list_leases``, a Scan: counted here as one
request per 1 MB page, which is one page for any N here (a lease item is ~0.3 KB), and shown also
as N item reads. The KCL's model, per worker: a renewal (UpdateItem) per held lease every
failover/3 - epsilon, and a Scan of the whole table every take interval, (failover + epsilon) * 2.
Writes ``bench/results/lease_requests.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
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

from checkpoint.leasing.timing import LeaseTiming
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker

# What each port method is for, to group the counts.
ROLES = {
    "renew_lease": "renewal",
    "list_leases": "scan (taker, leader maintenance)",
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


def run(
    endpoint: str, shards: int, store: str, warmup: float, window: float, workers: int = 1
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
            lease_store="memory" if store == "memory" else f"sqlite:{Path(tmp) / 'leases.db'}",
        )
        if store == "memory" and workers > 1:
            raise SystemExit("several workers need a shared store: --store sqlite")
        wrapped: list[CountingStore] = []
        started: list[Worker] = []
        span: dict[str, float] = {}

        def wrap(inner: Any) -> Any:
            counting = CountingStore(inner)
            wrapped.append(counting)
            return counting

        async def scenario(worker: Worker) -> None:
            started.append(worker)
            if len(started) > 1:
                return  # the first worker's scenario times the window for all
            try:
                await _settle(started, workers, shards)
                await asyncio.sleep(warmup)
                span["start"] = time.monotonic()
                await asyncio.sleep(window)
                span["end"] = time.monotonic()
                span["held"] = sum(len(w.holder.held()) for w in started)
            finally:
                for w in started:
                    w.request_shutdown()

        async def fleet() -> None:
            await asyncio.gather(*(
                run_worker(base.with_overrides(worker_id=f"w{i}"), Idle, on_started=scenario,
                           install_signal_handlers=False, wrap_store=wrap)
                for i in range(workers)
            ))  # fmt: skip

        asyncio.run(fleet())
    counts = collections.Counter(
        name for store_calls in wrapped for t, name in store_calls.calls
        if span["start"] <= t < span["end"]
    )  # fmt: skip
    return {
        "counts": counts,
        "minutes": (span["end"] - span["start"]) / 60,
        "held": span["held"],
        "workers": workers,
        "failover": base.failover_time,
    }


async def _settle(started: list[Worker], workers: int, shards: int) -> None:
    """Until every worker runs and the leases are spread (each worker holds its fair share)."""
    deadline = time.monotonic() + 120
    share = shards // workers
    while True:
        held = [len(w.holder.held()) for w in started]
        if len(started) == workers and sum(held) == shards and min(held) >= share:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the leases did not settle: {held}")
        await asyncio.sleep(0.2)


def report(results: list[dict[str, Any]], store: str, argv: Sequence[str] | None) -> str:
    timing = LeaseTiming(failover=results[0]["failover"])
    kcl_take = (timing.failover + timing.epsilon) * 2
    renew_per_min = 60 / timing.renew_interval
    lines = [
        "# Lease-table requests per lease per minute, steady state",
        "",
        f"Run {stamp()} with `python bench/bench_lease_requests.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
        f"Endpoint: kinesalite in memory on 127.0.0.1 (idle stream: no records, no checkpoints); "
        f"lease store {store} wrapped in a call counter; in-process workers sharing the "
        "leases (one: it holds every lease); "
        f"failover_time {timing.failover:g} s: renew every {timing.renew_interval:.3f} s, "
        f"scan every {timing.take_interval:.3f} s (the KCL: {kcl_take:.2f} s).",
        "",
        "| leases | workers | counted over | our calls by method (per minute) | ours per lease per "
        "min (Scan = 1 request/page) | KCL model per lease per min | ours / KCL | ours, Scan = N "
        "reads | KCL, Scan = N reads |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        n = r["held"]
        minutes = r["minutes"]
        per_min = {name: c / minutes for name, c in sorted(r["counts"].items())}
        ours = sum(per_min.values()) / n
        scans = per_min.get("list_leases", 0.0)
        ours_reads = (sum(per_min.values()) - scans + scans * n) / n
        k = r["workers"]
        kcl = (n * renew_per_min + k * 60 / kcl_take) / n
        kcl_reads = (n * renew_per_min + k * 60 / kcl_take * n) / n
        methods = ", ".join(f"{name} {v:.1f}" for name, v in per_min.items())
        lines.append(
            f"| {n} | {k} | {minutes * 60:.0f} s | {methods} | {ours:.2f} | {kcl:.2f} | "
            f"{ours / kcl:.2f}x | {ours_reads:.2f} | {kcl_reads:.2f} |"
        )
    lines += [
        "",
        f"KCL model: {renew_per_min:.2f} renewals per lease per minute (one UpdateItem every "
        f"{timing.renew_interval:.3f} s) + {60 / kcl_take:.2f} Scans per worker per minute (one "
        f"every {kcl_take:.2f} s), divided by the leases. Ours renews on the same schedule; on "
        f"top of it each worker scans every {timing.take_interval:.2f} s (for faster failover), "
        "reads a lease of another worker once more only when it would expire unless renewed "
        "(get_lease; none while every worker is alive), runs a leader round every renewal "
        "interval (read + conditional write of the leader record) and a control round once per "
        "lease duration (the suspend flag, its published status): requests per worker, "
        "whatever the number of leases.",
        "",
        "By role: " + "; ".join(sorted({f"{k} = {v}" for k, v in ROLES.items()})),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument("--store", choices=("memory", "sqlite"), default="sqlite")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=75.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from kinesalite import Kinesalite

    results = []
    with Kinesalite() as emulator:
        for workers in args.workers:
            for shards in args.shards:
                result = run(
                    emulator.endpoint, shards, args.store, args.warmup, args.window, workers
                )
                print(f"{shards} leases, {workers} worker(s): {dict(result['counts'])} in "
                      f"{result['minutes']:.2f} min")  # fmt: skip
                results.append(result)
    text = report(results, args.store, argv)
    print(text)
    if not args.no_write:
        print(f"written to {write_results('lease_requests.md', text)}")


if __name__ == "__main__":
    main(sys.argv[1:])
