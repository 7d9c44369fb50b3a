"""A graceful stop of the real run_worker (signal handlers included) in a child process, as
`kclpy-spark run` runs it, against a memory lease store, a fake stream and scripted records: a
processor call that never returns does not hold the process, and every lease of many is given
back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent

PREAMBLE = """
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
OPEN_STORE = lease_store.open_lease_store
SHARDS = {shards}
SPAN = 2**128 // SHARDS


class Stream:
    def describe_stream_summary(self, **kw):
        return {{"StreamDescriptionSummary": {{
            "StreamStatus": "ACTIVE", "StreamName": "s", "OpenShardCount": SHARDS,
            "StreamARN": "arn:aws:kinesis:us-east-1:000000000000:stream/s",
            "StreamCreationTimestamp": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}}}}

    def list_shards(self, **kw):
        return {{"Shards": [
            {{"ShardId": f"shardId-{{i:012d}}",
              "HashKeyRange": {{"StartingHashKey": str(i * SPAN),
                                "EndingHashKey": str(2**128 - 1 if i == SHARDS - 1
                                                     else (i + 1) * SPAN - 1)}},
              "SequenceNumberRange": {{"StartingSequenceNumber": "1"}}}}
            for i in range(SHARDS)]}}


@contextlib.asynccontextmanager
async def no_client(service, cfg, **kw):
    yield object()


aws.kinesis_control_client = lambda cfg: Stream()
aws.aio_client = no_client
lease_store.open_lease_store = lambda cfg, **kw: STORE


def config(**kw):
    base = dict(stream_name="s", lease_store="memory", worker_id="w1", failover_time=2.0,
                shutdown_grace=2.0, initial_position=InitialPosition.trim_horizon())
    return WorkerConfig(**{{**base, **kw}})
"""

HUNG = """
seen = threading.Event()


class Stuck(RecordProcessor):
    def process_records(self, process_records_input):
        seen.set()
        time.sleep(10**6)  # a call that never returns (a stuck write)


async def on_started(worker):
    while not seen.is_set():
        await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)


script = lambda spec, key: FakeSources(*[[batch(1, 2, 3)] for _ in range(8)])
asyncio.run(run_worker(config(), Stuck, on_started=on_started, record_sources=script))
print("RETURNED", flush=True)
"""

MANY = """
slow = threading.Event()


class Latency:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def evict_lease(self, lease):
        if slow.is_set():
            time.sleep(0.15)  # an ordinary write's latency
        return self._inner.evict_lease(lease)


class Idle(RecordProcessor):
    def process_records(self, process_records_input):
        pass


async def on_started(worker):
    while len(worker.holder.held()) < SHARDS:
        await asyncio.sleep(0.05)
    slow.set()
    worker.request_shutdown()


asyncio.run(run_worker(config(max_leases_to_steal=SHARDS, failover_time=6.0), Idle,
                       on_started=on_started,
                       install_signal_handlers=False, wrap_store=Latency,
                       record_sources=lambda spec, key: FakeSources(*[[] for _ in range(8)])))
print("LEFT OWNED", sum(l.lease_owner == "w1" for l in STORE.list_leases()), flush=True)
"""


ONE_SLOW = """
other_released = threading.Event()
ready = set()


class Watching:
    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def evict_lease(self, lease):
        done = self._inner.evict_lease(lease)
        if lease.lease_key.endswith("1"):
            other_released.set()
        return done


class OneSlow(RecordProcessor):
    def initialize(self, initialize_input):
        self.shard = initialize_input.shard_id
        ready.add(self.shard)

    def process_records(self, process_records_input):
        pass

    def shutdown_requested(self, shutdown_requested_input):
        if self.shard.endswith("0"):  # a slow flush: until the other lease is given back
            seen = other_released.wait(5.0)
            print("OTHER GIVEN BACK", "BEFORE" if seen else "NOT BEFORE", flush=True)


async def on_started(worker):
    while len(worker.holder.held()) < SHARDS or len(ready) < SHARDS:
        await asyncio.sleep(0.05)
    worker.request_shutdown()


asyncio.run(run_worker(config(shutdown_grace=20.0), OneSlow, on_started=on_started,
                       install_signal_handlers=False, wrap_store=Watching,
                       record_sources=lambda spec, key: FakeSources(*[[] for _ in range(8)])))
print("LEFT OWNED", sum(l.lease_owner == "w1" for l in STORE.list_leases()), flush=True)
"""


STARTUP = """
lease_store.open_lease_store = OPEN_STORE  # the real SQLite store: the parent reads it after
listing = threading.Event()
listed = Stream.list_shards


def slow_listing(self, **kw):
    listing.set()
    time.sleep(3)  # a first shard sync that takes a while (a big stream, throttling)
    return listed(self, **kw)


Stream.list_shards = slow_listing


def term():
    listing.wait()
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=term, daemon=True).start()
asyncio.run(run_worker(config(lease_store="sqlite:" + sys.argv[1]), RecordProcessor,
                       record_sources=lambda spec, key: FakeSources(*[[] for _ in range(8)])))
"""


HUNG_CONTROL_CALL = """
hang, in_flight = threading.Event(), threading.Event()
described = Stream.describe_stream_summary


def maybe_hang(self, **kw):
    if hang.is_set():
        in_flight.set()
        time.sleep(10**6)  # a Kinesis control call that never answers
    return described(self, **kw)


Stream.describe_stream_summary = maybe_hang


async def on_started(worker):
    hang.set()
    while not in_flight.is_set():
        await asyncio.sleep(0.05)
    worker.request_shutdown()


class Idle(RecordProcessor):
    def process_records(self, process_records_input):
        pass


asyncio.run(run_worker(config(missing_dependency_timeout=2.0), Idle, on_started=on_started,
                       install_signal_handlers=False,
                       record_sources=lambda spec, key: FakeSources(*[[] for _ in range(8)])))
print("RETURNED", flush=True)
"""


def _child(body: str, shards: int = 1, *args: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(PREAMBLE.format(here=str(HERE), shards=shards)) + textwrap.dedent(body)
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"still running: {exc.stdout!r}") from None


def test_a_call_that_never_returns_does_not_hold_the_process_after_sigterm() -> None:
    """asyncio.run's close joined the processor threads without a deadline, and interpreter
    exit joined them again: after SIGTERM only SIGKILL ended the process."""
    result = _child(HUNG)
    assert result.returncode == 0 and "RETURNED" in result.stdout, result.stderr[-3000:]
    assert "still running after the stop: exiting without them" in result.stderr


def test_a_graceful_stop_gives_back_every_lease_of_many() -> None:
    """The renewer was cancelled and the leases released one after another: with many held,
    the last ones passed their expiry first and were left to expire (owned by a stopped worker
    for a failover time). Scaled down: failover 6 s, 60 leases, 150 ms a release (one after
    another, 9 s; a failover of 2 s left 1.3 s for a loop held up under the suite's load)."""
    result = _child(MANY, shards=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LEFT OWNED 0" in result.stdout, result.stdout[-500:]


def test_a_stop_gives_each_lease_back_as_its_own_consumer_stops() -> None:
    """Leases were given back only once every consumer had stopped: one slow shutdown (a big
    flush) held the others renewed and unread up to the grace. The slow one waits (at most
    5 s) for the other lease to be released before it returns."""
    result = _child(ONE_SLOW, shards=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OTHER GIVEN BACK BEFORE" in result.stdout, result.stdout[-500:]
    assert "LEFT OWNED 0" in result.stdout, result.stdout[-500:]


def test_a_signal_during_the_first_shard_sync_leaves_no_leader_behind(tmp_path: Path) -> None:
    """Start-up takes shard-sync leadership before its first sync; a signal then exits at once
    ("no lease is held yet") and left the leader record owned by the dead process: every other
    worker waited out its life (three failover times) before one of them synced."""
    from checkpoint.stores.sqlite import SQLiteLeaseTable
    from shard_sync.leader import LEADER_KEY

    db = tmp_path / "leases.db"
    result = _child(STARTUP, 1, str(db))
    assert result.returncode == 143, result.stderr[-3000:]
    record = SQLiteLeaseTable(db, namespace="kclpy-spark-app").get_record(LEADER_KEY)
    assert record is not None and record.owner is None  # it resigned on its way out


def test_a_control_call_in_flight_does_not_hold_the_process_after_the_stop() -> None:
    """The lease executor was only shut down: the interpreter joined its threads at exit, and a
    Kinesis call that does not answer kept the stopped daemon's process alive for minutes."""
    result = _child(HUNG_CONTROL_CALL)
    assert result.returncode == 0 and "RETURNED" in result.stdout, result.stderr[-3000:]
