"""Helpers for the MultiLang tests: a held lease with a real Checkpointer, records, output files,
and daemon processes (``python -m kclpy_spark.multilang.command``) against LocalStack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint.base.clock import SystemClock
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.processor import Record

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROTOCOL_SCRIPT = HERE / "sample_protocol_processor.py"
KCLPY_APP = HERE / "amazon_kclpy_app.py"
SHARD = "shardId-000000000000"
SEQ_BASE = 49590338271490256608559692538361571095921575989136588800


def seq(n: int) -> str:
    return str(SEQ_BASE + n)


def records(start: int, count: int) -> list[Record]:
    return [
        Record(f"r{n}".encode(), f"pk-{n}", seq(n), 0, 1_700_000_000_000 + n)
        for n in range(start, start + count)
    ]


@dataclass
class HeldShard:
    """One lease held by worker w1 in a memory table, with the checkpointer the consumer makes."""

    table: MemoryLeaseTable
    holder: LeaseHolder
    checkpointer: Checkpointer
    shard_id: str = SHARD

    def deliver(self, batch: list[Record]) -> None:
        """What the consumer does before process_records: raise the largest permitted position."""
        last = batch[-1]
        self.checkpointer.set_largest_permitted(
            ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)
        )

    def stored(self) -> ExtendedSequenceNumber:
        lease = self.table.get_lease(self.shard_id)
        assert lease is not None
        return lease.checkpoint


def held_shard(
    shard_id: str = SHARD, checkpoint: ExtendedSequenceNumber = TRIM_HORIZON
) -> HeldShard:
    table = MemoryLeaseTable()
    table.create_lease_if_absent(Lease(shard_id, checkpoint))
    lease = table.get_lease(shard_id)
    assert lease is not None
    taken = table.take_lease(lease, "w1")
    assert taken is not None
    holder = LeaseHolder(table, "w1", SystemClock(), 60.0)
    held = holder.add_taken(taken)
    checkpointer = Checkpointer(holder, shard_id, held.token, held.lease.checkpoint)
    return HeldShard(table, holder, checkpointer, shard_id)


# --- output of the sample processors -------------------------------------------------------------


def read_records(output: Path) -> list[dict[str, Any]]:
    """Every record line the sample processors wrote (``<shard>.jsonl``)."""
    lines: list[dict[str, Any]] = []
    for path in sorted(output.glob("shardId-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(json.loads(line))
    return lines


def read_events(output: Path) -> list[dict[str, Any]]:
    """Every event line (``events-<pid>.jsonl``), in time order."""
    events: list[dict[str, Any]] = []
    for path in output.glob("events-*.jsonl"):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["t"])


def events_named(output: Path, name: str) -> list[dict[str, Any]]:
    """The events called ``name`` so far (none while the child has not made ``output``)."""
    return [e for e in read_events(output) if e["event"] == name] if output.exists() else []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by a dead parent) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def wait_for(what: str, predicate: Callable[[], bool], timeout: float, step: float = 0.3) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(step)
    return time.monotonic() - start


# --- daemons against LocalStack ------------------------------------------------------------------


def properties_text(
    *,
    name: str,
    endpoint: str,
    executable: str,
    extra: dict[str, str] | None = None,
) -> str:
    """A .properties file for LocalStack with short timings."""
    props = {
        "executableName": executable,
        "streamName": name,
        "applicationName": name,
        "AwsCredentialsProvider": "DefaultCredentialsProvider",
        "regionName": "us-east-1",
        "kinesisEndpoint": endpoint,
        "dynamoDBEndpoint": endpoint,
        "initialPositionInStream": "TRIM_HORIZON",
        "retrievalMode": "POLLING",
        "failoverTimeMillis": "3000",
        "idleTimeBetweenReadsInMillis": "200",
        "parentShardPollIntervalMillis": "500",
        "shardSyncIntervalMillis": "2000",
        "shutdownGraceMillis": "15000",
        **(extra or {}),
    }
    return "".join(f"{k} = {v}\n" for k, v in props.items())


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the daemon did not stop within {timeout}s") from None


@contextmanager
def daemon(
    workdir: Path,
    properties: str,
    output: Path,
    *args: str,
    env: dict[str, str] | None = None,
    worker_id: str = "w1",
) -> Iterator[Daemon]:
    """``kclpy-spark multilang`` in its own process, with its log in ``workdir``."""
    path = workdir / "app.properties"
    path.write_text(properties)
    log = workdir / f"daemon-{worker_id}.log"
    full_env = {**os.environ, "KCLPY_SPARK_SAMPLE_OUTPUT": str(output), **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), full_env.get("PYTHONPATH", "")])
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.multilang.command", "--log-level", "INFO",
             "--properties", str(path), "--worker-id", worker_id, *args],
            stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=workdir,
        )  # fmt: skip
    running = Daemon(proc, log)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def _shard_limit_explained() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        if "LimitExceededException" not in repr(exc):
            raise
        raise AssertionError(
            "LocalStack refused: its account-wide shard limit is reached, most likely by streams "
            f"other test runs left behind on the shared LocalStack: {exc}"
        ) from exc


def create_stream(kinesis: Any, name: str, shards: int) -> None:
    with _shard_limit_explained():
        kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_active(kinesis, name)


def wait_active(kinesis: Any, name: str) -> None:
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def produce(kinesis: Any, stream: str, numbers: range) -> dict[str, list[str]]:
    """Put records whose data is ``n<number>``; returns shard id -> sequence numbers in order."""
    where: dict[str, list[str]] = {}
    items = list(numbers)
    for i in range(0, len(items), 100):
        pending = [
            {"Data": f"n{n}".encode(), "PartitionKey": f"pk-{n}"} for n in items[i : i + 100]
        ]
        while pending:
            resp = kinesis.put_records(StreamName=stream, Records=pending)
            retry = []
            for entry, result in zip(pending, resp["Records"], strict=True):
                if "ShardId" in result:
                    where.setdefault(result["ShardId"], []).append(result["SequenceNumber"])
                else:
                    retry.append(entry)
            pending = retry
    return where


def split_first_shard(kinesis: Any, stream: str) -> str:
    """Split the stream's first open shard in the middle of its range; returns its id."""
    shards = kinesis.list_shards(StreamName=stream)["Shards"]
    parent = next(s for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"])
    rng = parent["HashKeyRange"]
    middle = (int(rng["StartingHashKey"]) + int(rng["EndingHashKey"])) // 2
    with _shard_limit_explained():
        kinesis.split_shard(
            StreamName=stream, ShardToSplit=parent["ShardId"], NewStartingHashKey=str(middle)
        )
    wait_active(kinesis, stream)
    return str(parent["ShardId"])
