"""Put-to-process latency at the polling defaults: ``python bench/bench_latency_polling.py``.

Each repeat: a fresh 2-shard stream, one in-process worker (``run_worker``) with WorkerConfig's
defaults for retrieval (polling, ``idle_time_between_reads`` = 1 s, ``max_records`` 10,000) and a
memory lease store, and a producer thread putting single records at a steady rate, each carrying
its put time (``time.time_ns()`` just before PutRecord). The processor notes ``time.time_ns()``
when ``process_records`` receives a record: latency = received - put, one process, one clock. The
first records of each repeat are a warm-up and not counted. p50 and p99 are medians over
``--repeats``; the baseline is the idle time itself. Writes ``bench/results/latency_polling.md``.

Endpoint: kinesalite by default (started here, in memory: its GetRecords answers in a few ms, so
what is measured is the consumer's pacing), or ``--endpoint URL`` (e.g. LocalStack).
(``bench/bench_latency.py`` compares enhanced fan-out with polling on LocalStack.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median, stamp, write_results

from checkpoint.sequence import InitialPosition
from kclpy_spark.aws import boto3_client
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker

WARMUP = 20


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies_ms: dict[int, float] = {}

    def factory(self) -> RecordProcessor:
        collector = self

        class Timestamps(RecordProcessor):
            def process_records(self, process_records_input: ProcessRecordsInput) -> None:
                now = time.time_ns()
                with collector.lock:
                    for r in process_records_input.records:
                        body = json.loads(r.binary_data)
                        collector.latencies_ms[body["i"]] = (now - body["t"]) / 1e6
                process_records_input.checkpointer.checkpoint()

        return Timestamps()


def produce(kinesis: Any, stream: str, rate: float, count: int) -> None:
    start = time.monotonic()
    for i in range(count):
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        data = json.dumps({"i": i, "t": time.time_ns()}).encode()
        kinesis.put_record(StreamName=stream, Data=data, PartitionKey=uuid.uuid4().hex)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_once(endpoint: str, rate: float, seconds: float) -> dict[str, Any]:
    stream = f"bench-latency-polling-{uuid.uuid4().hex[:6]}"
    count = int(rate * seconds)
    cfg = WorkerConfig(
        application_name=stream,
        stream_name=stream,
        endpoint_url=endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store="memory",
    )
    kinesis = boto3_client("kinesis", cfg)
    kinesis.create_stream(StreamName=stream, ShardCount=2)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60}
    )
    collector = Collector()

    async def scenario(worker: Worker) -> None:
        try:
            deadline = time.monotonic() + 60
            while len([s for s in worker.shard_stats() if s.state == "processing"]) < 2:
                if time.monotonic() > deadline:
                    raise TimeoutError("the worker did not start processing both shards")
                await asyncio.sleep(0.2)
            await asyncio.to_thread(produce, kinesis, stream, rate, count)
            deadline = time.monotonic() + 30
            while len(collector.latencies_ms) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
        finally:
            worker.request_shutdown()

    asyncio.run(
        run_worker(cfg, collector.factory, on_started=scenario, install_signal_handlers=False)
    )
    kinesis.delete_stream(StreamName=stream)
    lat = [v for i, v in sorted(collector.latencies_ms.items()) if i >= WARMUP]
    return {
        "put": count,
        "received": len(collector.latencies_ms),
        "p50": percentile(lat, 50),
        "p90": percentile(lat, 90),
        "p99": percentile(lat, 99),
        "max": max(lat),
        "mean": statistics.fmean(lat),
        "idle": cfg.idle_time_between_reads,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint", help="a Kinesis endpoint; default: start kinesalite")
    parser.add_argument("--rate", type=float, default=20.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=40.0, help="producer time per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    results: list[dict[str, Any]] = []
    if args.endpoint:
        where = f"`{args.endpoint}`"
        results = [run_once(args.endpoint, args.rate, args.seconds) for _ in range(args.repeats)]
    else:
        from kinesalite import VERSION, Kinesalite

        with Kinesalite() as emulator:
            where = f"kinesalite {VERSION} in memory on 127.0.0.1 (started by the benchmark)"
            for _ in range(args.repeats):
                results.append(run_once(emulator.endpoint, args.rate, args.seconds))
    idle = results[0]["idle"]
    lines = [
        "# Put-to-process latency, polling defaults",
        "",
        f"Run {stamp()} with `python bench/bench_latency_polling.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
        f"Endpoint: {where}. 2 shards, one in-process worker with WorkerConfig's retrieval "
        f"defaults (polling, idle_time_between_reads {idle:g} s), memory lease store; "
        f"{args.rate:g} single records/s for {args.seconds:g} s per repeat, first {WARMUP} "
        "not counted.",
        "",
        "| repeat | put | received | p50 ms | p90 ms | p99 ms | max ms | mean ms | "
        "p50 / idle time |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in enumerate(results, 1):
        lines.append(
            f"| {n} | {r['put']} | {r['received']} | {r['p50']:.0f} | {r['p90']:.0f} | "
            f"{r['p99']:.0f} | {r['max']:.0f} | {r['mean']:.0f} | "
            f"{r['p50'] / 1000 / idle:.2f}x |"
        )
    p50 = median([r["p50"] for r in results])
    p99 = median([r["p99"] for r in results])
    lines += [
        f"| **median** | | | **{p50:.0f}** | | **{p99:.0f}** | | | **{p50 / 1000 / idle:.2f}x** |",
        "",
        f"Baseline: the idle time between reads, {idle * 1000:.0f} ms. A shard's fetcher reads, "
        f"hands the batch over, then sleeps {idle:g} s after an empty or caught-up response, so "
        "a record put at a random moment waits on average half a cycle and at most a whole one "
        "(cycle = idle time + GetRecords round trip + hand-over).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        print(f"written to {write_results('latency_polling.md', text)}")


if __name__ == "__main__":
    main(sys.argv[1:])
