"""Steady-state lease-table requests per lease per minute: ``python bench/bench_lease_requests.py``.

One in-process worker (``run_worker``) holds every lease of an N-shard stream on kinesalite (in
memory, idle: no records, so no checkpoints). Its lease store (memory by default, or SQLite) is
wrapped in a counter of every port call. After a warm-up (lease creation, taking), the calls in a
steady-state window are counted by method and turned into requests per lease per minute, against
the KCL's model for the same failover time.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, stamp, write_results

from checkpoint.leasing.timing import LeaseTiming
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime import lease_store
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


def run(endpoint: str, shards: int, store: str, warmup: float, window: float) -> dict[str, Any]:
    from kinesalite import create_stream

    stream = f"bench-lease-requests-{uuid.uuid4().hex[:6]}"
    create_stream(endpoint, stream, shards)
    wrapped: list[CountingStore] = []
    original: Callable[[WorkerConfig], Any] = lease_store.open_lease_store

    def open_counted(cfg: WorkerConfig) -> Any:
        counting = CountingStore(original(cfg))
        wrapped.append(counting)
        return counting

    lease_store.open_lease_store = open_counted  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = WorkerConfig(
            application_name=stream,
            stream_name=stream,
            endpoint_url=endpoint,
            initial_position=InitialPosition.trim_horizon(),
            lease_store="memory" if store == "memory" else f"sqlite:{Path(tmp) / 'leases.db'}",
        )
        span: dict[str, float] = {}

        async def scenario(worker: Worker) -> None:
            try:
                deadline = time.monotonic() + 60
                while len(worker.holder.held()) < shards:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the worker did not take every lease")
                    await asyncio.sleep(0.2)
                await asyncio.sleep(warmup)
                span["start"] = time.monotonic()
                await asyncio.sleep(window)
                span["end"] = time.monotonic()
                span["held"] = len(worker.holder.held())
            finally:
                worker.request_shutdown()

        try:
            asyncio.run(run_worker(cfg, Idle, on_started=scenario, install_signal_handlers=False))
        finally:
            lease_store.open_lease_store = original  # type: ignore[assignment]
    counts = collections.Counter(
        name for t, name in wrapped[0].calls if span["start"] <= t < span["end"]
    )
    return {
        "counts": counts,
        "minutes": (span["end"] - span["start"]) / 60,
        "held": span["held"],
        "failover": cfg.failover_time,
    }


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
        f"lease store {store} wrapped in a call counter; one worker holding every lease; "
        f"failover_time {timing.failover:g} s: renew every {timing.renew_interval:.3f} s, "
        f"scan every {timing.take_interval:.3f} s (the KCL: {kcl_take:.2f} s).",
        "",
        "| leases | counted over | our calls by method (per minute) | ours per lease per min "
        "(Scan = 1 request/page) | KCL model per lease per min | ours / KCL | ours, Scan = N "
        "reads | KCL, Scan = N reads |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        n = r["held"]
        minutes = r["minutes"]
        per_min = {name: c / minutes for name, c in sorted(r["counts"].items())}
        ours = sum(per_min.values()) / n
        scans = per_min.get("list_leases", 0.0)
        ours_reads = (sum(per_min.values()) - scans + scans * n) / n
        kcl = (n * renew_per_min + 60 / kcl_take) / n
        kcl_reads = (n * renew_per_min + 60 / kcl_take * n) / n
        methods = ", ".join(f"{name} {v:.1f}" for name, v in per_min.items())
        lines.append(
            f"| {n} | {minutes * 60:.0f} s | {methods} | {ours:.2f} | {kcl:.2f} | "
            f"{ours / kcl:.2f}x | {ours_reads:.2f} | {kcl_reads:.2f} |"
        )
    lines += [
        "",
        f"KCL model: {renew_per_min:.2f} renewals per lease per minute (one UpdateItem every "
        f"{timing.renew_interval:.3f} s) + {60 / kcl_take:.2f} Scans per worker per minute (one "
        f"every {kcl_take:.2f} s), divided by the leases. Ours renews on the same schedule; on "
        "top of it the worker scans twice as often (every failover time, for faster failover), "
        "and every renewal interval it runs a leader round (read + conditional write of the "
        "leader record) and a control round (read the suspend flag, read + write its own "
        "worker-status record): about 5 coordination requests per worker per renewal interval, "
        "whatever the number of leases.",
        "",
        "By role: " + "; ".join(sorted({f"{k} = {v}" for k, v in ROLES.items()})),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--store", choices=("memory", "sqlite"), default="sqlite")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--window", type=float, default=75.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from kinesalite import Kinesalite

    results = []
    with Kinesalite() as emulator:
        for shards in args.shards:
            result = run(emulator.endpoint, shards, args.store, args.warmup, args.window)
            print(f"{shards} leases: {dict(result['counts'])} in {result['minutes']:.2f} min")
            results.append(result)
    text = report(results, args.store, argv)
    print(text)
    if not args.no_write:
        print(f"written to {write_results('lease_requests.md', text)}")


if __name__ == "__main__":
    main(sys.argv[1:])
