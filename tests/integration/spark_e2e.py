"""The end-to-end sink scenario: a real worker on LocalStack feeding the Spark sink. Not a test
module: the tests run it in-process (local[2], the session fixture) or as a subprocess on a
standalone cluster or a Spark Connect server (one classic SparkContext per process, and a Connect
session poisons classic ones). The kill -9 test runs ``kclpy-spark run`` with a ``[sink]`` table
and uses this module's sinks and readers.

    python spark_e2e.py scenario --endpoint URL --target TARGET --work DIR   # prints JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import boto3

from checkpoint.sequence import InitialPosition
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker
from kclpy_spark.spark.pieces import Piece
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sink_config import sink_config
from kclpy_spark.spark.sink_setup import processor_factory_from_sink_config
from kclpy_spark.spark.sinks import DeltaSink, ParquetSink

HERE = Path(__file__).resolve().parent
OUT_ENV = "KCLPY_E2E_OUT"  # the sink's output folder (parquet/, delta/, violations.jsonl)
LEASES_ENV = "KCLPY_E2E_LEASES"  # "<sqlite path>|<application name>": checked at each write
STALL_ENV = "KCLPY_E2E_STALL"  # a marker file: the first write stalls after Parquet, before Delta


def _mark(marker: str, content: object) -> None:
    """Write the stall marker whole (a temporary file, then a rename): the test kills this
    process as soon as the marker exists, which could otherwise be between its creation and its
    content."""
    tmp = Path(f"{marker}.tmp")
    tmp.write_text(json.dumps(content))
    tmp.replace(marker)


def written(out: Path) -> dict[str, list[str]]:
    """Sequence numbers per shard in the Parquet output (pyarrow: no Spark job)."""
    import pyarrow.dataset as ds

    path = out / "parquet"
    if not path.exists():
        return {}
    try:
        table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
            columns=["shard_id", "sequence_number"]
        )
    except (FileNotFoundError, ValueError):  # ArrowInvalid is a ValueError: no file yet
        return {}
    result: dict[str, list[str]] = {}
    for shard, seq in zip(
        table.column("shard_id").to_pylist(),
        table.column("sequence_number").to_pylist(),
        strict=True,
    ):
        result.setdefault(shard, []).append(seq)
    return result


class FlakyParquetSink:
    """ParquetSink that fails the first attempt of every other batch (half of them after the
    write), and checks before each write that no checkpoint passed an unwritten record."""

    def __init__(self) -> None:
        self.out = Path(os.environ[OUT_ENV])
        self.parquet = ParquetSink(self.out / "parquet")
        self.attempts: dict[int, int] = {}
        self.order: dict[int, int] = {}  # batch id -> 0, 1, 2... in order of first attempt
        self.lock = threading.Lock()

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def check_checkpoints(self) -> None:
        spec = os.environ.get(LEASES_ENV)
        if not spec:
            return
        path, app = spec.split("|")
        # Checkpoints first, then the output: a record is on disk before its checkpoint moves,
        # so whatever was checkpointed when the leases were read is in the listing made after.
        # (The other order saw a second writer publish and commit in between: a false alarm.)
        leases = SQLiteLeaseTable(Path(path), namespace=app).list_leases()
        have = written(self.out)
        for lease in leases:
            cp = lease.checkpoint
            if cp.is_sentinel:
                continue
            seqs = [int(s) for s in have.get(lease.shard_id, [])]
            if not seqs or int(cp.sequence_number) > max(seqs):
                with open(self.out / "violations.jsonl", "a") as fh:
                    fh.write(json.dumps({"lease": lease.lease_key, "checkpoint": str(cp)}) + "\n")

    def write(self, batch: SinkBatch) -> None:
        self.check_checkpoints()
        with self.lock:
            n = self.attempts[batch.batch_id] = self.attempts.get(batch.batch_id, 0) + 1
            ordinal = self.order.setdefault(batch.batch_id, len(self.order))
        flaky = ordinal % 2 == 0 and n == 1
        if flaky and ordinal % 4 == 0:
            raise RuntimeError("injected failure before the write")
        self.parquet.write(batch)
        if flaky:
            raise RuntimeError("injected failure after the write")


class StallingSink:
    """Parquet + Delta (both idempotent). With STALL_ENV set, the first write stalls between the
    two (the test kills the process there)."""

    def __init__(self) -> None:
        out = Path(os.environ[OUT_ENV])
        self.parquet = ParquetSink(out / "parquet")
        self.delta = DeltaSink(str(out / "delta"))

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return self.delta.prepare(pieces)

    def write(self, batch: SinkBatch) -> None:
        self.parquet.write(batch)
        marker = os.environ.get(STALL_ENV)
        if marker and not Path(marker).exists():
            _mark(marker, [p.piece_id for p in batch.pieces])
            while True:
                time.sleep(60)  # killed here
        self.delta.write(batch)


STALL_FROM_ENV = "KCLPY_E2E_STALL_FROM"  # OvertakingSink: the sequence number whose batch stalls


class OvertakingSink:
    """Parquet. With STALL_ENV set, the batch that starts at STALL_FROM_ENV (the lease's first
    record: its first batch, whichever writer gets to the sink first) stalls before writing
    anything; once it stalls and a later batch is written (before or after: pipelined batches),
    the marker file names both (the test kills the process then). One lease only."""

    def __init__(self) -> None:
        self.parquet = ParquetSink(Path(os.environ[OUT_ENV]) / "parquet")
        self.stalled: list[str] = []  # piece ids of the stalled batch
        self.written: list[str] = []  # piece ids of the batches written
        self.lock = threading.Lock()

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def write(self, batch: SinkBatch) -> None:
        marker = os.environ.get(STALL_ENV)
        first = batch.pieces[0].key.first.sequence_number
        stall = bool(marker) and first == os.environ.get(STALL_FROM_ENV)
        if not stall:
            self.parquet.write(batch)
        with self.lock:
            (self.stalled if stall else self.written).extend(p.piece_id for p in batch.pieces)
            if marker and self.stalled and self.written:
                seen = {"stalled": self.stalled, "overtook": self.written}
                _mark(marker, seen)
        while stall:
            time.sleep(60)  # killed here


def stall_then_note(df: Any, batch_id: int) -> None:
    """The second of two sinks (after Parquet): notes each piece it got (id, rows) in
    ``function.jsonl``; with STALL_ENV set, the first call stalls instead (killed there)."""
    from kclpy_spark.spark.sink_batch import current_batch

    batch = current_batch()
    assert batch is not None
    marker = os.environ.get(STALL_ENV)
    if marker and not Path(marker).exists():
        _mark(marker, [p.piece_id for p in batch.pieces])
        while True:
            time.sleep(60)  # killed here
    lines = "".join(json.dumps([p.piece_id, p.rows]) + "\n" for p in batch.pieces)
    with open(Path(os.environ[OUT_ENV]) / "function.jsonl", "a") as fh:
        fh.write(lines)


def keep_by_batch_id(df: Any, batch_id: int) -> None:
    """A function sink keyed by ``batch_id``: the batch's records replace the file
    ``by_batch/<batch_id>.json`` whole (a batch given again overwrites itself), and every call is
    noted with its time in ``by_batch-<pid>.jsonl``, so a test sees whether a batch given again
    held the same records. With STALL_ENV set, the third call stalls after its write (the test
    kills the process there)."""
    out = Path(os.environ[OUT_ENV])
    rows = sorted(
        (r[0], r[1], bytes(r[2]).decode())
        for r in df.select("shard_id", "sequence_number", "data").collect()
    )
    folder = out / "by_batch"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{batch_id}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(rows))
    tmp.replace(folder / f"{batch_id}.json")
    with open(out / f"by_batch-{os.getpid()}.jsonl", "a") as fh:
        fh.write(json.dumps({"id": batch_id, "t": time.time(), "rows": rows}) + "\n")
    _kept.append(batch_id)
    marker = os.environ.get(STALL_ENV)
    if marker and len(_kept) >= 3 and not Path(marker).exists():
        _mark(marker, batch_id)
        while True:
            time.sleep(60)  # written, not acknowledged: killed here


_kept: list[int] = []  # the batch ids keep_by_batch_id was given in this process


def put(kinesis: Any, stream: str, start: int, count: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for at in range(start, start + count, 250):
        n = min(250, start + count - at)
        resp = kinesis.put_records(
            StreamName=stream,
            Records=[
                {"Data": json.dumps({"n": i}).encode(), "PartitionKey": f"k{i}"}
                for i in range(at, at + n)
            ],
        )
        assert resp["FailedRecordCount"] == 0
        for r in resp["Records"]:
            out.setdefault(r["ShardId"], []).append(r["SequenceNumber"])
    return out


def kinesis_client(endpoint: str) -> Any:
    return boto3.client(
        "kinesis",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )


def create_stream(kinesis: Any, stream: str, shards: int) -> None:
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def worker_config(endpoint: str, stream: str, work: Path, worker_id: str) -> WorkerConfig:
    return WorkerConfig(
        application_name=stream,
        stream_name=stream,
        endpoint_url=endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{work / 'leases.db'}",
        failover_time=3.0,
        idle_time_between_reads=0.2,
        parent_shard_poll_interval=0.5,
        shard_sync_interval=1.0,
        worker_id=worker_id,
        shutdown_grace=20.0,
    )


def run_scenario(
    endpoint: str,
    target: str,
    work: Path,
    *,
    session: SparkSessionHolder | None = None,
    per_phase: int = 300,
    timeout: float = 150.0,
    read_on: str = "driver",
) -> dict[str, Any]:
    """Two phases of records around a shard split; returns what the checks need."""
    work.mkdir(parents=True, exist_ok=True)
    stream = f"spark-e2e-{uuid.uuid4().hex[:8]}"
    kinesis = kinesis_client(endpoint)
    create_stream(kinesis, stream, 2)
    produced = put(kinesis, stream, 0, per_phase)
    cfg = worker_config(endpoint, stream, work, "e2e-worker")
    os.environ[OUT_ENV] = str(work)
    os.environ[LEASES_ENV] = f"{work / 'leases.db'}|{stream}"
    sink_cfg = sink_config(
        "spark_e2e:FlakyParquetSink",
        scope="worker",
        spark_target=target,
        max_records=200,
        max_wait=0.5,
        max_attempts=3,
        retry_base_delay=0.1,
        retry_max_delay=0.5,
        write_timeout=120.0,
        read_on=read_on,
    )
    factory = processor_factory_from_sink_config(sink_cfg, cfg, session=session)
    result: dict[str, Any] = {"stream": stream}

    def all_written() -> bool:
        have = written(work)
        return all(set(seqs) <= set(have.get(shard, [])) for shard, seqs in produced.items())

    async def scenario(worker: Worker) -> None:
        try:
            deadline = time.monotonic() + timeout
            while not all_written():
                assert time.monotonic() < deadline, "phase 1 not written in time"
                await asyncio.sleep(0.3)
            parent = sorted(produced)[0]
            desc = kinesis.describe_stream(StreamName=stream)["StreamDescription"]["Shards"]
            rng = next(s for s in desc if s["ShardId"] == parent)["HashKeyRange"]
            mid = (int(rng["StartingHashKey"]) + int(rng["EndingHashKey"])) // 2
            await asyncio.to_thread(
                kinesis.split_shard,
                StreamName=stream,
                ShardToSplit=parent,
                NewStartingHashKey=str(mid),
            )
            await asyncio.to_thread(
                kinesis.get_waiter("stream_exists").wait,
                StreamName=stream,
                WaiterConfig={"Delay": 0.5, "MaxAttempts": 120},
            )
            more = await asyncio.to_thread(put, kinesis, stream, per_phase, per_phase)
            for shard, seqs in more.items():
                produced.setdefault(shard, []).extend(seqs)
            while not all_written():
                assert time.monotonic() < deadline, "phase 2 not written in time"
                await asyncio.sleep(0.3)
            result["parent"] = parent
            result["status"] = factory.status()
        except BaseException as exc:
            result["error"] = repr(exc)
            result["status"] = factory.status()
            raise
        finally:
            worker.request_shutdown()

    try:
        asyncio.run(
            asyncio.wait_for(
                run_worker(cfg, factory, on_started=scenario, install_signal_handlers=False),
                timeout=timeout + 60,
            )
        )
    finally:
        factory.close()
        # The LocalStack is shared and limits open shards per account: leave no stream behind.
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    from pyspark import SparkContext

    result["local_jvm"] = SparkContext._gateway is not None  # none at all over Spark Connect
    leases = SQLiteLeaseTable(work / "leases.db", namespace=stream).list_leases()
    violations = work / "violations.jsonl"
    result.update(
        produced=produced,
        written=written(work),
        checkpoints={x.shard_id: str(x.checkpoint) for x in leases},
        pending={x.shard_id: str(x.pending_checkpoint) for x in leases if x.pending_checkpoint},
        owners={x.shard_id: x.lease_owner for x in leases},
        violations=violations.read_text().splitlines() if violations.exists() else [],
    )
    return result


def check_scenario(result: dict[str, Any]) -> None:
    """Every record written exactly once, checkpoints at the last record (SHARD_END for the
    split parent), nothing pending, no checkpoint ever ahead of the output, leases released."""
    produced: dict[str, list[str]] = result["produced"]
    have: dict[str, list[str]] = result["written"]
    assert "parent" in result, f"the scenario did not complete: {result.get('error')}, " + str(
        result.get("status")
    )
    for shard, seqs in produced.items():
        got = have.get(shard, [])
        assert sorted(got, key=int) == sorted(seqs, key=int), f"{shard}: not exactly once"
    assert set(have) <= set(produced)
    assert result["violations"] == []
    for shard, cp in result["checkpoints"].items():
        if shard == result["parent"]:
            assert cp == "SHARD_END"
        elif shard in produced:
            assert cp == max(produced[shard], key=int), shard
    assert result["pending"] == {}
    assert all(owner is None for owner in result["owners"].values())
    assert result["status"]["stats"]["failed_attempts"] > 0  # failures were injected and survived


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("botocore", "aiobotocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    sc = sub.add_parser("scenario")
    sc.add_argument("--endpoint", required=True)
    sc.add_argument("--target", required=True)
    sc.add_argument("--work", required=True)
    sc.add_argument("--read-on", default="driver", choices=("driver", "executors"))
    args = parser.parse_args(argv)
    result = run_scenario(args.endpoint, args.target, Path(args.work), read_on=args.read_on)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
