"""``kclpy-spark demo``: a live run of the real worker against a local endpoint.

Creates a stream, produces numbered records, runs one worker (embedded SQLite lease store) with a
processor that checkpoints every batch, prints progress (records per shard, lag, leases), splits a
shard mid-run and shows the children taking over after their parent reaches SHARD_END. At the end
it checks that every record produced was processed and exits non-zero if not.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.demo import create_demo_stream
from kclpy_spark.demo.samples import CountingProcessor
from kclpy_spark.processor import ProcessRecordsInput
from kclpy_spark.runtime.worker import Worker

log = logging.getLogger("kclpy_spark.demo.run")

_seen: dict[str, set[str]] = {}
_seen_lock = threading.Lock()


class DemoProcessor(CountingProcessor):
    """Counts like CountingProcessor and remembers which sequence numbers it processed."""

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        with _seen_lock:
            bucket = _seen.setdefault(self.shard_id, set())
            bucket.update(r.sequence_number for r in process_records_input.records)
        super().process_records(process_records_input)


def _produce(kinesis: Any, stream: str, start: int, count: int) -> dict[str, set[str]]:
    produced: dict[str, set[str]] = {}
    for offset in range(0, count, 100):
        n = min(100, count - offset)
        entries = [
            {
                "Data": f"record {start + offset + i}".encode(),
                "PartitionKey": f"key-{start + offset + i}",
            }
            for i in range(n)
        ]
        while entries:
            resp = kinesis.put_records(StreamName=stream, Records=entries)
            retry = []
            for entry, result in zip(entries, resp["Records"], strict=True):
                if "SequenceNumber" in result:
                    produced.setdefault(result["ShardId"], set()).add(result["SequenceNumber"])
                else:
                    retry.append(entry)
            entries = retry
    return produced


def _merge(into: dict[str, set[str]], more: dict[str, set[str]]) -> None:
    for shard, seqs in more.items():
        into.setdefault(shard, set()).update(seqs)


def _missing(produced: dict[str, set[str]]) -> int:
    with _seen_lock:
        return sum(len(seqs - _seen.get(shard, set())) for shard, seqs in produced.items())


def _print_progress(worker: Worker, produced: dict[str, set[str]], phase: str) -> None:
    leases = {x.lease_key: x for x in worker.store.list_leases()}
    print(f"\n[{time.strftime('%H:%M:%S')}] {phase}")
    print(f"  {'shard':<24}{'state':<20}{'records':>8}{'lag ms':>9}  {'owner':<12}checkpoint")
    for key in sorted(leases):
        lease = leases[key]
        stats = next((s for s in worker.shard_stats() if s.shard_id == lease.shard_id), None)
        stats = stats or worker.finished.get(key)
        with _seen_lock:
            count = len(_seen.get(lease.shard_id, ()))
        lag = (
            ""
            if stats is None or stats.millis_behind_latest is None
            else stats.millis_behind_latest
        )
        state = stats.state if stats else "not taken"
        owner = (
            "this worker"
            if lease.lease_owner == worker.cfg.worker_id
            else (lease.lease_owner or "-")
        )
        print(
            f"  {lease.shard_id:<24}{state:<20}{count:>8}{lag!s:>9}  {owner:<12}{lease.checkpoint}"
        )
    total = sum(len(s) for s in produced.values())
    print(
        f"  produced {total}, processed {total - _missing(produced)}, "
        f"leases held {len(worker.holder.held())}, leader: {worker.leader.is_leader}"
    )


async def _wait_processed(
    worker: Worker, produced: dict[str, set[str]], phase: str, deadline: float
) -> bool:
    last_print = 0.0
    while time.monotonic() < deadline:
        done = _missing(produced) == 0
        if done or time.monotonic() - last_print > 3:
            _print_progress(worker, produced, phase)
            last_print = time.monotonic()
        if done:
            return True
        await asyncio.sleep(0.5)
    return False


def _split_first_shard(kinesis: Any, stream: str) -> None:
    first = kinesis.list_shards(StreamName=stream)["Shards"][0]
    lo = int(first["HashKeyRange"]["StartingHashKey"])
    hi = int(first["HashKeyRange"]["EndingHashKey"])
    print(f"\nsplitting {first['ShardId']} in two (a reshard while consuming)")
    kinesis.split_shard(
        StreamName=stream, ShardToSplit=first["ShardId"], NewStartingHashKey=str((lo + hi) // 2)
    )
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )


def run_demo(args: argparse.Namespace) -> int:
    from kclpy_spark.aws import boto3_client
    from kclpy_spark.runtime.daemon import run_worker

    stamp = time.strftime("%Y%m%d-%H%M%S")
    db = Path(".cache") / "demo" / "leases.db"
    cfg = WorkerConfig(
        application_name=f"kclpy-spark-demo-{stamp}",
        stream_name=f"kclpy-spark-demo-{stamp}",
        endpoint_url=args.endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{db}",
        failover_time=6.0,
        idle_time_between_reads=0.5,
        parent_shard_poll_interval=1.0,
        shard_sync_interval=5.0,
        processor="kclpy_spark.demo.run:DemoProcessor",
    )
    stream = str(cfg.stream_name)
    kinesis = boto3_client("kinesis", cfg)
    print(
        f"kclpy-spark demo: endpoint {args.endpoint}, stream {cfg.stream_name} "
        f"({args.shards} shards), lease store {db}"
    )
    create_demo_stream(kinesis, stream, args.shards, args.endpoint)
    produced = _produce(kinesis, stream, 0, args.records)
    print(f"produced {args.records} records over {len(produced)} shards")
    outcome: dict[str, bool] = {}
    deadline = time.monotonic() + args.timeout

    async def scenario(worker: Worker) -> None:
        ok = await _wait_processed(worker, produced, "phase 1: consuming", deadline)
        if ok:
            await asyncio.to_thread(_split_first_shard, kinesis, stream)
            more = await asyncio.to_thread(_produce, kinesis, stream, args.records, args.records)
            _merge(produced, more)
            print(f"produced {args.records} more records after the split")
            ok = await _wait_processed(worker, produced, "phase 2: after the split", deadline)
        outcome["ok"] = ok
        worker.request_shutdown()

    from kclpy_spark.runtime.daemon import load_processor_factory

    asyncio.run(run_worker(cfg, load_processor_factory(str(cfg.processor)), on_started=scenario))
    total = sum(len(s) for s in produced.values())
    missing = _missing(produced)
    if outcome.get("ok"):
        print(
            f"\ndemo finished: all {total} records processed, parents before children; "
            f"checkpoints are in {db}"
        )
        return 0
    print(f"\ndemo FAILED: {missing} of {total} records not processed within {args.timeout:.0f}s")
    return 1
