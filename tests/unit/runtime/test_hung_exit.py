"""A processor call that never returns does not hold the process after a graceful stop: the real
run_worker, signal handlers included, in a child process (as `kclpy-spark run` runs it), against
a memory lease store, a fake stream and scripted records."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

CHILD = """
import asyncio, contextlib, datetime, os, signal, sys, threading, time
sys.path.insert(0, {here!r})
from test_consumer import FakeSources, batch

import kclpy_spark.aws as aws
import kclpy_spark.runtime.lease_store as lease_store
from checkpoint.sequence import InitialPosition
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import RecordProcessor
from kclpy_spark.runtime.daemon import run_worker

STORE = MemoryLeaseTable()


class Stream:
    def describe_stream_summary(self, **kw):
        return {{"StreamDescriptionSummary": {{
            "StreamStatus": "ACTIVE", "StreamName": "s", "OpenShardCount": 1,
            "StreamARN": "arn:aws:kinesis:us-east-1:000000000000:stream/s",
            "StreamCreationTimestamp": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}}}}

    def list_shards(self, **kw):
        return {{"Shards": [{{"ShardId": "shardId-000000000000",
                 "HashKeyRange": {{"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)}},
                 "SequenceNumberRange": {{"StartingSequenceNumber": "1"}}}}]}}


@contextlib.asynccontextmanager
async def no_client(service, cfg, **kw):
    yield object()


aws.boto3_client = lambda service, cfg: Stream()
aws.aio_client = no_client
lease_store.open_lease_store = lambda cfg, **kw: STORE
seen = threading.Event()


class Stuck(RecordProcessor):
    def process_records(self, process_records_input):
        seen.set()
        time.sleep(10**6)  # a call that never returns (a stuck write)


async def on_started(worker):
    while not seen.is_set():
        await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


cfg = WorkerConfig(stream_name="s", lease_store="memory", worker_id="w1", failover_time=2.0,
                   shutdown_grace=2.0, initial_position=InitialPosition.trim_horizon())
script = lambda spec, key: FakeSources(*[[batch(1, 2, 3)] for _ in range(8)])
asyncio.run(run_worker(cfg, Stuck, on_started=on_started, record_sources=script))
print("RETURNED", flush=True)
"""


def test_a_call_that_never_returns_does_not_hold_the_process_after_sigterm() -> None:
    """asyncio.run's close joined the processor threads without a deadline, and interpreter
    exit joined them again: after SIGTERM only SIGKILL ended the process."""
    code = textwrap.dedent(CHILD.format(here=str(HERE)))
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"still running after SIGTERM: {exc.stdout!r}") from None
    assert result.returncode == 0 and "RETURNED" in result.stdout, result.stderr[-3000:]
    assert "still running after the stop: exiting without them" in result.stderr
