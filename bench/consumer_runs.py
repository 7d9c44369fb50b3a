"""One consumer run of ``bench/bench_consumer.py``, in its own process: ``python
bench/consumer_runs.py VARIANT ENDPOINT STREAM RECORDS`` prints one JSON line.

Variants: ``bare`` / ``bare-fast`` (aiobotocore GetRecords on every shard concurrently, botocore's
parse / the fast decode), ``ours-fast`` / ``ours-std`` (the worker through ``run_worker`` with the
fast decode on / ``KCLPY_SPARK_FAST_DECODE=0``), ``ours-fast-gc`` (ours-fast with the garbage
collector tuned: a diagnosis) and ``async-kinesis`` (tuned). The clock starts when the consumer is
started and stops when the target count of records reached the processor; CPU is this process's
(all threads) over the same window. Profile a run exactly as measured with
``py-spy record -- python bench/consumer_runs.py ...``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: F401 - puts the checkout on sys.path

# The worker's idle time between reads: small, so a caught-up shard is read again soon.
IDLE_TIME = 0.1
# A diagnosis of where the worker's CPU goes (see BENCHMARKS.md), not a product default: full
# collections traverse every record in the prefetch queues.
GC_TUNING = "gc.freeze() after imports, gc.set_threshold(10_000, 10, 10)"


class _Counter:
    """Records processed, from processor threads; notes when the target is reached."""

    def __init__(self, target: int, loop: asyncio.AbstractEventLoop) -> None:
        self.target = target
        self.count = 0
        self.done_at: float | None = None
        self.done = asyncio.Event()
        self._loop = loop
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.count += n
            if self.count >= self.target and self.done_at is None:
                self.done_at = time.perf_counter()
                self._loop.call_soon_threadsafe(self.done.set)


_STATUSES: list[Any] = []


def _track_installs() -> None:
    """Keep every FastDecodeStatus made in this process (to report the calls it decoded)."""
    from kclpy_spark.retrieval import fastdecode

    original = fastdecode.install_fast_getrecords

    def install(client: Any) -> Any:
        status = original(client)
        _STATUSES.append(status)
        return status

    fastdecode.install_fast_getrecords = install  # type: ignore[assignment]
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("kclpy_spark") and getattr(module, "install_fast_getrecords", None) is (
            original
        ):
            module.install_fast_getrecords = install


def _wire_fast_decode() -> None:
    """Make the worker use the fast decode if polling.py does not yet: install it on the
    worker's aiobotocore Kinesis client and let ``record_from_api`` pass decoded Records on.
    Once the product wires it (and honours KCLPY_SPARK_FAST_DECODE), this does nothing."""
    from kclpy_spark import aws
    from kclpy_spark.processor import Record
    from kclpy_spark.retrieval import fastdecode, polling

    if hasattr(polling, "install_fast_getrecords"):
        return
    original_client = aws.aio_client

    @contextlib.asynccontextmanager
    async def client(service: str, cfg: Any, **kwargs: Any) -> Any:
        async with original_client(service, cfg, **kwargs) as c:
            if service == "kinesis":
                fastdecode.install_fast_getrecords(c)
            yield c

    original_convert = polling.record_from_api

    def convert(entry: Any) -> Record:
        return entry if isinstance(entry, Record) else original_convert(entry)

    aws.aio_client = client  # type: ignore[assignment]
    polling.record_from_api = convert


def _fast_calls() -> int:
    unique = {id(s): s for s in _STATUSES}  # one status per client, returned to every fetcher
    return sum(s.fast_calls for s in unique.values())


async def _ours(endpoint: str, stream: str, target: int) -> dict[str, Any]:
    from checkpoint.sequence import InitialPosition
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
    from kclpy_spark.runtime.daemon import run_worker
    from kclpy_spark.runtime.worker import Worker

    counter = _Counter(target, asyncio.get_running_loop())

    class NoopCheckpointing(RecordProcessor):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            process_records_input.checkpointer.checkpoint()
            counter.add(len(process_records_input.records))

    cfg = WorkerConfig(
        application_name="bench-consumer",
        stream_name=stream,
        endpoint_url=endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store="memory",
        idle_time_between_reads=IDLE_TIME,
        # The consumer's own ceiling, as the bare drain and async-kinesis read: no pacing by a
        # shard's 2 MiB/s read limit (neither endpoint here enforces it).
        max_read_bytes_per_second=0,
    )
    started: dict[str, float] = {}

    async def on_started(worker: Worker) -> None:
        started["at"] = time.perf_counter()
        await counter.done.wait()
        worker.request_shutdown()

    began, cpu0 = time.perf_counter(), time.process_time()
    runner = asyncio.create_task(
        run_worker(cfg, NoopCheckpointing, on_started=on_started, install_signal_handlers=False)
    )
    await counter.done.wait()
    cpu = time.process_time() - cpu0
    await asyncio.wait_for(runner, 60)
    assert counter.done_at is not None
    return {
        "records": counter.count,
        "seconds": counter.done_at - began,
        "cpu": cpu,
        "startup": started.get("at", began) - began,
        "fast_calls": _fast_calls(),
    }


async def _bare(endpoint: str, stream: str, target: int, fast: bool) -> dict[str, Any]:
    from kclpy_spark.aws import aio_client
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.retrieval import fastdecode
    from kclpy_spark.retrieval.fastdecode import records_from_response

    cfg = WorkerConfig(stream_name=stream, endpoint_url=endpoint, lease_store="memory")
    total = 0
    began, cpu0 = time.perf_counter(), time.process_time()
    async with aio_client("kinesis", cfg) as client:
        status = fastdecode.install_fast_getrecords(client) if fast else None

        async def drain(shard_id: str) -> None:
            nonlocal total
            resp = await client.get_shard_iterator(
                StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
            )
            iterator = resp["ShardIterator"]
            while iterator and total < target:
                resp = await client.get_records(ShardIterator=iterator, Limit=10_000)
                records = records_from_response(resp, status) if fast else resp["Records"]
                total += len(records)
                if not records and not resp.get("MillisBehindLatest"):
                    return  # caught up: every record of this shard was read
                iterator = resp.get("NextShardIterator")

        shards = (await client.list_shards(StreamName=stream))["Shards"]
        await asyncio.gather(*(drain(s["ShardId"]) for s in shards))
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu0
    return {"records": total, "seconds": seconds, "cpu": cpu, "fast_calls": _fast_calls()}


async def _async_kinesis(endpoint: str, stream: str, target: int) -> dict[str, Any]:
    from kinesis import Consumer
    from kinesis.aggregators import SimpleAggregator
    from kinesis.processors import Processor

    class RawProcessor(Processor, SimpleAggregator):  # type: ignore[misc]
        """Hands each record's bytes on as they are: no JSON, no text decoding."""

        def serialize(self, item: bytes) -> bytes:
            return item

        def deserialize(self, data: bytes) -> bytes:
            return data

    count = 0
    began, cpu0 = time.perf_counter(), time.process_time()
    async with Consumer(
        stream,
        endpoint_url=endpoint,
        region_name="us-east-1",
        processor=RawProcessor(),
        iterator_type="TRIM_HORIZON",
        record_limit=10_000,
        # Tuned: the per-shard maximum of 5 GetRecords/s (default 1), a queue deep enough for
        # 10 pages (default 10,000 items: one page), short sleeps, and an idle timeout long
        # enough never to end iteration early (we stop at the target count ourselves).
        shard_fetch_rate=5,
        max_queue_size=100_000,
        sleep_time_no_records=0.1,
        idle_timeout=30.0,
        use_list_shards=True,  # ListShards, as ours (the stand-in has no DescribeStream)
    ) as consumer:
        async for _item in consumer:
            count += 1
            if count >= target:
                break
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu0
    return {"records": count, "seconds": seconds, "cpu": cpu}


def _preimport(variant: str) -> None:
    """Import what the run needs before its clock starts: one-time import CPU is not a cost
    per record (client creation, TLS context and connections stay inside the window)."""
    import aiobotocore.session  # noqa: F401
    import boto3
    import botocore.session

    botocore.session.get_session().get_service_model("kinesis")  # loads the JSON model files
    boto3.session.Session()
    if variant.startswith("ours"):
        import kclpy_spark.runtime.daemon
        import kclpy_spark.runtime.lease_store  # noqa: F401
    if variant == "async-kinesis":
        import kinesis  # noqa: F401


def child(variant: str, endpoint: str, stream: str, target: int) -> dict[str, Any]:
    import logging

    logging.basicConfig(level=logging.WARNING)
    _preimport(variant)
    if variant in {"ours-fast", "ours-std", "ours-fast-gc"}:
        os.environ["KCLPY_SPARK_FAST_DECODE"] = "0" if variant == "ours-std" else "1"
        _track_installs()
        if variant != "ours-std":
            _wire_fast_decode()
        if variant == "ours-fast-gc":
            import gc

            gc.collect()
            gc.freeze()
            gc.set_threshold(10_000, 10, 10)
        result = asyncio.run(_ours(endpoint, stream, target))
    elif variant in {"bare", "bare-fast"}:
        _track_installs()
        result = asyncio.run(_bare(endpoint, stream, target, variant == "bare-fast"))
    elif variant == "async-kinesis":
        result = asyncio.run(_async_kinesis(endpoint, stream, target))
    else:
        raise SystemExit(f"unknown variant {variant!r}")
    return {"variant": variant, **result}


if __name__ == "__main__":
    _, variant, endpoint, stream, target = sys.argv
    print(json.dumps(child(variant, endpoint, stream, int(target))), flush=True)
