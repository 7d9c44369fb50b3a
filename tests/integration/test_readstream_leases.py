"""#44 item 4: a ``kinesis-kcl`` query with ``leaseStore`` is a KCL worker of its application,
on LocalStack (DynamoDB lease table) with a real local SparkSession.

- Trigger.AvailableNow through a split: every record exactly once, parents first; afterwards the
  lease table holds each completed batch's end as the checkpoint (SHARD_END for the parent, the
  children's last records), under the query's worker.
- Two queries of one application split the shards by lease: each holds some, and records
  written once the split settled (a failover time after the last move) reach exactly one of the
  two sinks, from a shard its query holds.
- A batch Spark replays after a restart leaves out the shards whose leases moved meanwhile:
  query A fails in batch 1 (batch 0 acknowledged), query B of the same application takes the
  expired leases and reads on from A's checkpoints, A restarts: its replay of batch 1 reads
  nothing, and the two sinks together hold every record exactly once. (A replay whose leases
  come back to the same query reads its pins again: ``test_readstream_kill9.py``.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_readstream import (
    _batches_to,
    _parents_first,
    _read_batches,
    _split,
    _two_once_runs_read_two_batches,
    _write,
)
from worker_procs import produce, wait_active, worker_env

from checkpoint.base.errors import ResourceNotFoundError
from checkpoint.stores.dynamodb import DynamoDBLeaseTable
from kclpy_spark.readstream.data_source import KinesisKclDataSource

pytestmark = [pytest.mark.spark]


@pytest.fixture
def leased(spark: Any, localstack_endpoint: str, tmp_path: Path, unique_name: str) -> Any:
    spark.dataSource.register(KinesisKclDataSource)

    def reader(**options: str) -> Any:
        r = (spark.readStream.format("kinesis-kcl").option("streamName", unique_name)
             .option("endpointUrl", localstack_endpoint).option("initialPosition", "TRIM_HORIZON")
             .option("pinLocation", str(tmp_path / "pins")).option("leaseStore", "dynamodb")
             .option("applicationName", unique_name))  # fmt: skip
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    return reader


def _rows(batches: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [r for rows in batches.values() for r in rows]


def test_available_now_checkpoints_each_batch_in_the_lease_table(
    leased: Any,
    kinesis_client: Any,
    dynamodb_client: Any,
    unique_name: str,
    tmp_path: Path,
    localstack_endpoint: str,
) -> None:
    # two shards, one split: the other is read to its bound while the parent's children wait
    # for their leases (AvailableNow must not end before them)
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 60))
    parent = kinesis_client.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    children = _split(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(60, 120))  # into the children and the other
    out = tmp_path / "out"
    query = (leased(maxRecordsPerShard="25").writeStream.foreachBatch(_batches_to(out))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())  # fmt: skip
    assert query.awaitTermination(240), "the AvailableNow run did not end"
    assert query.exception() is None, query.exception()

    batches = _read_batches(out)
    assert sorted(r["n"] for r in _rows(batches)) == list(range(120))
    _parents_first(batches, parent, children)

    table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
    leases = {lease.lease_key: lease for lease in table.list_leases()}
    assert leases[parent].checkpoint.is_shard_end
    assert len(leases) == 4
    for key in set(leases) - {parent}:
        records = kinesis_client.get_records(
            ShardIterator=kinesis_client.get_shard_iterator(
                StreamName=unique_name, ShardId=key, ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
        )["Records"]
        # the last batch is acknowledged when AvailableNow asks for the next and finds none
        assert leases[key].checkpoint.sequence_number == records[-1]["SequenceNumber"], key
    # held by the query's worker until they expire (PySpark kills the source's process at stop)
    owner = str(leases[children[0]].lease_owner)
    assert {lease.lease_owner for lease in leases.values()} - {None} == {owner}
    assert owner.startswith("query:")
    # `kclpy-spark status` shows the query's progress as any worker's
    shown = subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "status", "--json", "--stream-name",
         unique_name, "--application-name", unique_name, "--lease-store", "dynamodb",
         "--endpoint-url", localstack_endpoint],
        capture_output=True, text=True, timeout=60, env=worker_env(), check=True,
    )  # fmt: skip
    report = json.loads(shown.stdout)
    by_key = {row["lease_key"]: row for row in report["leases"]}
    assert by_key[children[0]]["owner"] == owner
    assert by_key[parent]["checkpoint"] == "SHARD_END"
    assert report["live_workers"] == [owner]  # its status records, published as a worker's


def _owners(table: DynamoDBLeaseTable) -> dict[str, str | None]:
    """Each lease's owner; a lease being handed over (its old owner reads until it notices, then
    the new owner goes on from its checkpoint) shows as None."""
    try:
        leases = table.list_leases()
    except ResourceNotFoundError:  # the queries' workers have not made it yet
        return {}
    return {lease.lease_key: None if lease.checkpoint_owner else lease.lease_owner
            for lease in leases}  # fmt: skip


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_two_queries_of_one_application_split_the_shards(
    leased: Any, kinesis_client: Any, dynamodb_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=4)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 100))
    queries, outs = [], []
    for name in ("a", "b"):
        out = tmp_path / f"out-{name}"
        outs.append(out)
        queries.append(
            leased(failoverTime="4").writeStream.foreachBatch(_batches_to(out))
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{name}"))
            .trigger(processingTime="1 second").start()
        )  # fmt: skip
    try:
        table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)

        def split_settled() -> bool:
            owners = _owners(table)
            counts: dict[str | None, int] = {}
            for owner in owners.values():
                counts[owner] = counts.get(owner, 0) + 1
            return len(owners) == 4 and None not in counts and sorted(counts.values()) == [2, 2]

        def all_read(upto: int) -> bool:
            seen = {r["n"] for out in outs for r in _rows(_read_batches(out))}
            return seen >= set(range(upto))

        _wait(split_settled, 120, "the two queries to hold two leases each")
        _wait(lambda: all_read(100), 60, "the first records")
        owners = _owners(table)
        # A worker whose lease was taken reads on until its next renewal finds out (the KCL's
        # window, as for any steal): let a failover time pass before the later records.
        time.sleep(5)
        assert _owners(table) == owners, "a lease moved after the split settled"
        marks = [max(_read_batches(out), default=-1) for out in outs]
        produce(kinesis_client, unique_name, range(100, 200))
        _wait(lambda: all_read(200), 60, "the records written after the split")
        assert _owners(table) == owners, "a lease moved after the split settled"
        workers = sorted(set(owners.values()), key=str)
        by_query: list[list[dict[str, Any]]] = []
        for out, mark in zip(outs, marks, strict=True):
            later = {b: rows for b, rows in _read_batches(out).items() if b > mark}
            by_query.append([r for r in _rows(later) if r["n"] >= 100])
        late = sorted(r["n"] for rows in by_query for r in rows)
        assert late == list(range(100, 200)), "a record after the split was read twice or never"
        shards = [{r["shard"] for r in rows} for rows in by_query]
        assert not shards[0] & shards[1], f"both queries read shards {shards[0] & shards[1]}"
        assert all(len(s) == 2 for s in shards), shards
        for held in shards:  # each query read the shards of one worker
            assert len({owners[s] for s in held}) == 1
        assert len(workers) == 2
    finally:
        for query in queries:
            query.stop()
    print(json.dumps({"owners": _owners(table)}))


def test_a_replay_leaves_out_the_shards_whose_leases_moved(
    leased: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 60))
    seen = tmp_path / "seen-a"
    seen.mkdir()

    def fail_batch_1_once(df: Any, batch_id: int) -> None:
        rows = sorted(int(r.data) for r in df.select("data").collect())
        attempt = len(list(seen.glob(f"{batch_id:06d}-*.json")))
        _write(seen / f"{batch_id:06d}-{attempt}.json", rows)
        if batch_id == 1 and attempt == 0:
            raise RuntimeError("the sink failed (on purpose)")

    def run_a() -> Any:
        return (leased(maxRecordsPerShard="10", failoverTime="3").writeStream
                .foreachBatch(fail_batch_1_once)
                .option("checkpointLocation", str(tmp_path / "checkpoint-a"))
                .trigger(availableNow=True).start())  # fmt: skip

    with pytest.raises(Exception, match="on purpose"):  # batch 1 planned, never committed
        run_a().awaitTermination(240)
    first_try = json.loads((seen / "000001-0.json").read_text())
    assert first_try, "batch 1 read records before it failed"

    out_b = tmp_path / "out-b"  # another query of the application, while A is down
    query = (leased(failoverTime="3").writeStream.foreachBatch(_batches_to(out_b))
             .option("checkpointLocation", str(tmp_path / "checkpoint-b"))
             .trigger(availableNow=True).start())  # fmt: skip
    assert query.awaitTermination(240), "B did not end"
    assert query.exception() is None, query.exception()

    query = run_a()  # A again: Spark replays batch 1 first
    assert query.awaitTermination(240), "A's second run did not end"
    assert query.exception() is None, query.exception()
    replayed = json.loads((seen / "000001-1.json").read_text())
    by_a = [n for p in seen.glob("*.json") if p.name != "000001-0.json"
            for n in json.loads(p.read_text())]  # fmt: skip
    by_b = [r["n"] for r in _rows(_read_batches(out_b))]
    assert sorted(by_a + by_b) == list(range(60)), (sorted(by_a), sorted(by_b))
    assert replayed == [], "the replay read shards whose leases had moved"
    assert not set(first_try) - set(by_b), "B read what A's failed batch had read"


def test_trigger_once_runs_read_and_checkpoint_through_their_leases(
    leased: Any, kinesis_client: Any, dynamodb_client: Any, unique_name: str, tmp_path: Path
) -> None:
    """Each Trigger.Once run starts a new worker: its first plan found no lease taken yet and
    the run ended without a batch; and a run's acknowledgment of the batch the one before it
    committed named that run's tenure, refused, so the lease table never moved."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 50))
    _two_once_runs_read_two_batches(leased(maxRecordsPerShard="20", failoverTime="3"), tmp_path)
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
    [lease] = table.list_leases()
    shard = lease.lease_key
    records = kinesis_client.get_records(
        ShardIterator=kinesis_client.get_shard_iterator(
            StreamName=unique_name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
    )["Records"]
    # the first run's batch, acknowledged by the second run (its own waits for the next)
    assert lease.checkpoint.sequence_number == records[19]["SequenceNumber"]
