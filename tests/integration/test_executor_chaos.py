"""Chaos with ``read_on = "executors"``: two ``kclpy-spark run`` daemons (each with its own local
Spark, whose tasks read the leased ranges) share a 3-shard LocalStack stream and a SQLite lease
table, and write every batch to two ``[[sinks]]``: Parquet, and a function keyed by ``batch_id``
(each batch replaces its own file). A producer writes numbered records throughout; the stream is
split and merged, and each worker is killed with -9 (Python and its JVM) once and restarted.

At the end every record is in Parquet exactly once and in exactly one of the function's batch
files; a batch given to the function again (after a kill) held exactly the records it held the
first time (its pieces pinned to the ends their first read found); children were written after
their parents; the parents' checkpoints are SHARD_END and nothing is left pending.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from spark_e2e import OUT_ENV, STALL_ENV
from worker_procs import free_port, produce, wait_active, wait_for, worker_env

from checkpoint.stores.sqlite import SQLiteLeaseTable

HERE = Path(__file__).resolve().parent
SHARDS = 3


class Daemon:
    """One ``kclpy-spark run`` in its own process group (kill -9 takes its JVM too)."""

    def __init__(self, worker_id: str, config: Path, out: Path, work: Path) -> None:
        self.worker_id, self.config, self.out, self.work = worker_id, config, out, work
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.port = 0

    def start(self, stall: Path | None = None) -> None:
        # A port of its own each start: the last one, free since the kill -9, may have become
        # another connection's (an ephemeral port to LocalStack), and the restart failed on it.
        self.port = free_port()
        env = worker_env()
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
        env[OUT_ENV] = str(self.out)
        if stall is not None:
            env[STALL_ENV] = str(stall)  # the function's third call stalls after its write
        self.starts += 1
        with open(self.work / f"{self.worker_id}-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kclpy_spark.cli", "--log-level", "INFO", "run",
                 "--config", str(self.config), "--worker-id", self.worker_id,
                 "--metrics-port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work,
                start_new_session=True,
            )  # fmt: skip

    def ready(self) -> bool:
        """Its /readyz answers 200: started (a SIGTERM before that ends it at once, 143)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, f"{self.worker_id} died"
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return None

    def logs(self) -> str:
        return "".join(
            p.read_text(errors="replace")[-3000:]
            for p in sorted(self.work.glob(f"{self.worker_id}-*.log"))
        )


def _config(work: Path, stream: str, endpoint: str, out: Path) -> Path:
    config = work / "worker.toml"
    config.write_text(f"""
application_name = "{stream}"
stream_name = "{stream}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{work / "leases.db"}"
failover_time = 3.0
idle_time_between_reads = 0.2
shard_sync_interval = 1.0
parent_shard_poll_interval = 0.5
[sink]
spark_target = "local[1]"
read_on = "executors"
max_records = 60
max_wait = 0.5
max_attempts = 3
retry_base_delay = 0.1
[sink.spark_conf]
"spark.sql.shuffle.partitions" = "1"
"spark.driver.memory" = "512m"
[[sinks]]
sink = "parquet:{out / "parquet"}"
[[sinks]]
sink = "spark_e2e:keep_by_batch_id"
""")
    return config


def _parquet_numbers(out: Path) -> list[int]:
    import pyarrow.dataset as ds

    path = out / "parquet"
    if not path.exists():
        return []
    try:
        table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
            columns=["data"]
        )
    except (FileNotFoundError, ValueError):  # no file yet
        return []
    return [int(bytes(x).decode()) for x in table.column("data").to_pylist()]


def _batch_files(out: Path) -> dict[str, list[list[str]]]:
    """The function's output: batch id -> its records (shard, sequence, data)."""
    folder = out / "by_batch"
    if not folder.exists():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def _calls(out: Path) -> list[dict[str, Any]]:
    calls = [
        json.loads(line)
        for path in out.glob("by_batch-*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return sorted(calls, key=lambda c: c["t"])


def test_split_merge_and_kill9_of_each_worker_reading_on_the_executors(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    stream = unique_name
    out = tmp_path / "out"
    out.mkdir()
    kinesis_client.create_stream(StreamName=stream, ShardCount=SHARDS)
    wait_active(kinesis_client, stream)
    config = _config(tmp_path, stream, localstack_endpoint, out)
    workers = [Daemon(w, config, out, tmp_path) for w in ("worker-a", "worker-b")]
    produced: list[int] = []
    stop = threading.Event()
    stall = tmp_path / "stalled.json"

    def producer() -> None:
        n = 0
        while not stop.wait(0.25):
            produce(kinesis_client, stream, range(n, n + 15))
            produced.extend(range(n, n + 15))
            n += 15

    def shards() -> list[dict[str, Any]]:
        return list(kinesis_client.list_shards(StreamName=stream)["Shards"])

    feeding = threading.Thread(target=producer, daemon=True)
    try:
        workers[0].start()
        workers[1].start(stall)
        feeding.start()
        wait_for("the first records written", lambda: len(_parquet_numbers(out)) > 100, 120)
        first = shards()[0]
        rng = first["HashKeyRange"]
        middle = (int(rng["StartingHashKey"]) + int(rng["EndingHashKey"])) // 2
        kinesis_client.split_shard(
            StreamName=stream, ShardToSplit=first["ShardId"], NewStartingHashKey=str(middle)
        )
        wait_active(kinesis_client, stream)
        wait_for("worker-b's function to stall after a write", stall.exists, 120)
        workers[1].kill9()  # a batch written to the function, not acknowledged; others in flight
        time.sleep(4)
        workers[1].start()
        kinesis_client.merge_shards(
            StreamName=stream,
            ShardToMerge="shardId-000000000001",
            AdjacentShardToMerge="shardId-000000000002",
        )
        wait_active(kinesis_client, stream)
        time.sleep(8)
        workers[0].kill9()
        time.sleep(4)
        workers[0].start()
        time.sleep(8)
    finally:
        stop.set()
        feeding.join(30)
    try:
        expected = sorted(produced)
        wait_for(
            "every record in both sinks",
            lambda: (
                sorted(set(_parquet_numbers(out))) == expected
                and sorted({int(r[2]) for rows in _batch_files(out).values() for r in rows})
                == expected
            ),
            180,
        )
        for w in workers:  # a graceful stop of each, not of one still starting
            wait_for(f"{w.worker_id} to be ready", w.ready, 120)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(w.logs() for w in workers)) from None
    finally:
        codes = {w.worker_id: w.stop() for w in workers}
        lineage = {s["ShardId"]: s for s in shards()}
        kinesis_client.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
    assert codes == {"worker-a": 0, "worker-b": 0}, codes

    parquet = Counter(_parquet_numbers(out))
    assert sorted(parquet) == expected and max(parquet.values()) == 1, "Parquet: exactly once"
    in_batches = Counter(int(r[2]) for rows in _batch_files(out).values() for r in rows)
    assert sorted(in_batches) == expected and max(in_batches.values()) == 1, "function: once"

    calls = _calls(out)
    given: dict[str, list[list[list[str]]]] = defaultdict(list)
    for call in calls:
        given[str(call["id"])].append(call["rows"])
    again = {bid: rows for bid, rows in given.items() if len(rows) > 1}
    changed = [bid for bid, rows in again.items() if any(r != rows[0] for r in rows)]
    assert changed == [], f"batches given again with other records: {changed}"
    assert str(json.loads(stall.read_text())) in again  # the stalled batch came back, the same

    first_write: dict[str, float] = {}
    last_write: dict[str, float] = {}
    for call in calls:
        for shard in {r[0] for r in call["rows"]}:
            first_write.setdefault(shard, call["t"])
            last_write[shard] = call["t"]
    early = [
        (child, parent)
        for child, shard in lineage.items()
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId"))
        if parent and child in first_write and first_write[child] < last_write.get(parent, 0)
    ]
    assert early == [], f"children written before their parents ended: {early}"
    table = SQLiteLeaseTable(tmp_path / "leases.db", namespace=stream)
    leases = {x.shard_id: x for x in table.list_leases()}
    parents = {p for s in lineage.values() for p in (s.get("ParentShardId"),
               s.get("AdjacentParentShardId")) if p}  # fmt: skip
    assert len(parents) == 3, parents  # the split's parent and the merge's two
    # A parent's lease is SHARD_END, or gone: cleaned up once its children went past it.
    assert all(str(leases[p].checkpoint) == "SHARD_END" for p in parents if p in leases)
    assert set(lineage) - parents <= set(leases)  # every open shard has its lease
    assert all(x.pending_checkpoint is None for x in leases.values())
