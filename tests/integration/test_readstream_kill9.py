"""#44 items 4 and 5: exactly once into Spark's file sink across a kill -9 of the driver mid-run
and a restart, through a split and a merge, with the query holding KCL leases. The query runs in a
process of its own (Trigger.AvailableNow, small batches, a DynamoDB lease table); it is killed
(Python and JVM) once two batches committed and while others run; the stream is split and the
children merged; a restart on ``local-cluster`` (executors in processes of their own, reading the
pins the killed run's executor wrote) waits for the killed run's leases, replays its last batch,
and reads on: the parent to its end, then the children, then the merge. Spark's file sink keeps
its own commit log, so the rows as Spark reads the folder are the batches that committed: each
record exactly once; the lease table ends with every shard acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, wait_active, worker_env

from checkpoint.stores.dynamodb import DynamoDBLeaseTable

pytestmark = [pytest.mark.spark]
JOB = Path(__file__).resolve().parents[2] / "bench" / "readstream_app.py"  # a user's job


def _start(
    endpoint: str, stream: str, tmp_path: Path, target: str = "local[2]"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(JOB), endpoint, stream, str(tmp_path / "out"), target,
         "maxRecordsPerShard=40", f"pinLocation={tmp_path / 'pins'}", "leaseStore=dynamodb",
         f"applicationName={stream}", "failoverTime=3"],
        cwd=tmp_path, env=worker_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def _committed(tmp_path: Path) -> int:
    commits = tmp_path / "out-checkpoint" / "commits"
    return len([p for p in commits.glob("*") if p.name.isdigit()]) if commits.is_dir() else 0


def _planned(tmp_path: Path) -> int:
    offsets = tmp_path / "out-checkpoint" / "offsets"
    return len([p for p in offsets.glob("*") if p.name.isdigit()]) if offsets.is_dir() else 0


def _run_to_end(endpoint: str, stream: str, tmp_path: Path, target: str) -> None:
    job = _start(endpoint, stream, tmp_path, target)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-3000:]


def test_kill9_of_the_driver_mid_run_loses_and_doubles_nothing(
    spark: Any,
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 240))  # 6 batches of 40

    job = _start(localstack_endpoint, unique_name, tmp_path)
    deadline = time.monotonic() + 180
    # Killed while a batch is planned (its offsets written) and not committed: the restart must
    # replay it from its pins, the path this test is for.
    while (
        (_committed(tmp_path) < 2 or _planned(tmp_path) <= _committed(tmp_path))
        and job.poll() is None and time.monotonic() < deadline
    ):  # fmt: skip
        time.sleep(0.02)
    assert job.poll() is None, "the run ended before it could be killed"
    os.killpg(job.pid, signal.SIGKILL)  # the driver's Python and its JVM
    job.wait(timeout=30)
    assert 2 <= _committed(tmp_path) < 6, "killed mid-run"
    assert _planned(tmp_path) > _committed(tmp_path), "killed with a batch planned, not committed"

    shard = kinesis_client.list_shards(StreamName=unique_name)["Shards"][0]
    kinesis_client.split_shard(StreamName=unique_name, ShardToSplit=shard["ShardId"],
                               NewStartingHashKey=str(2**127))  # fmt: skip
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(240, 320))  # into the children
    children = [s["ShardId"] for s in kinesis_client.list_shards(StreamName=unique_name)["Shards"]
                if s.get("ParentShardId") == shard["ShardId"]]  # fmt: skip
    kinesis_client.merge_shards(StreamName=unique_name, ShardToMerge=children[0],
                                AdjacentShardToMerge=children[1])  # fmt: skip
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(320, 360))  # into the merged child
    # restart from the checkpoint, with executors in processes of their own
    _run_to_end(localstack_endpoint, unique_name, tmp_path, "local-cluster[2,1,1024]")

    out = spark.read.parquet(str(tmp_path / "out"))
    rows = out.select("data", "shard_id", "sequence_number").collect()
    numbers = sorted(int(r.data) for r in rows)
    assert numbers == list(range(360)), (len(numbers), len(set(numbers)))
    assert len({r.shard_id for r in rows}) == 4  # the parent, two children, the merge
    leases = {lease.lease_key: lease for lease in
              DynamoDBLeaseTable(dynamodb_client, unique_name).list_leases()}  # fmt: skip
    for parent in (shard["ShardId"], *children):
        assert leases[parent].checkpoint.is_shard_end, leases[parent]
    (merged,) = set(leases) - {shard["ShardId"], *children}
    last = max((r for r in rows if r.shard_id == merged), key=lambda r: int(r.sequence_number))
    # the last batch is acknowledged when AvailableNow asks for another and finds none
    assert leases[merged].checkpoint.sequence_number == last.sequence_number
