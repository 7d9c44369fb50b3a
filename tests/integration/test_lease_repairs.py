"""#49 items 2 and 3 with real worker processes on LocalStack: a lease checkpointed at SHARD_END
while its shard is open is reopened, and a held lease whose item is deleted comes back from its
last checkpoint. In both, before these fixes, records written afterwards were never delivered."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from test_bad_input_running import _config
from worker_procs import fleet, produce, read_output, wait_active, wait_for

from checkpoint.sequence import SHARD_END
from kclpy_spark.config import WorkerConfig
from kclpy_spark.ops.commands import open_store


def _delivered(out: Path) -> set[str]:
    return {row["data"] for row in read_output(out)}


def test_a_false_shard_end_is_reopened_and_the_shard_read_again(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=2)
    wait_active(kinesis_client, name)
    first = produce(kinesis_client, name, range(20))
    store_url = f"sqlite:{tmp_path / 'l.db'}"
    config = _config(name, localstack_endpoint, store_url, shard_sync_interval=1.0)
    out = tmp_path / "out"
    with fleet(tmp_path, config, out) as workers:
        workers.start("w1")
        wait_for("the first records", lambda: set(first) <= _delivered(out), timeout=60)
        workers.stop_all()
    # What an older version wrote after a malformed GetRecords answer: SHARD_END on an open shard.
    cfg = WorkerConfig(application_name=name, stream_name=name, endpoint_url=localstack_endpoint,
                       lease_store=store_url)  # fmt: skip
    store = open_store(cfg)
    victim = "shardId-000000000001"
    lease = store.get_lease(victim)
    assert lease is not None and lease.lease_owner is None
    assert store.update_lease(replace(lease.checkpointed(SHARD_END))) is not None
    later = produce(kinesis_client, name, range(20, 60))
    on_victim = {n for n, shard in later.items() if shard == victim}
    assert on_victim
    with fleet(tmp_path, config, out) as workers:
        worker = workers.start("w1")
        wait_for("the records after the false end", lambda: set(later) <= _delivered(out),
                 timeout=90)  # fmt: skip
        log = worker.log_text()
    assert "is checkpointed at SHARD_END but ListShards shows shard" in log
    reopened = store.get_lease(victim)
    assert reopened is not None and not reopened.checkpoint.is_shard_end


def test_a_held_lease_deleted_while_running_resumes_from_its_checkpoint(
    kinesis_client: Any, dynamodb_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """At LATEST, shard sync would re-create the lease at the stream's tip a minute later; the
    records written meanwhile were never delivered."""
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    config = _config(name, localstack_endpoint, "dynamodb", initial_position="LATEST")
    out = tmp_path / "out"
    with fleet(tmp_path, config, out) as workers:
        worker = workers.start("w1")
        wait_for("the worker to read", lambda: "took lease" in worker.log_text().lower()
                 or "initialize" in worker.log_text(), timeout=60)  # fmt: skip
        first: dict[str, str] = {}

        def delivered_first() -> bool:  # at LATEST, records put before the first read are not
            first.update(produce(kinesis_client, name, range(len(first), len(first) + 1)))
            return bool(_delivered(out))

        wait_for("a first record", delivered_first, timeout=60, step=1.0)
        dynamodb_client.delete_item(TableName=name, Key={"leaseKey": {"S": "shardId-000000000000"}})
        gap = produce(kinesis_client, name, range(1000, 1030))
        time.sleep(2.0)
        after = produce(kinesis_client, name, range(2000, 2010))
        wait_for("the records of the gap and after", lambda: set(gap) | set(after)
                 <= _delivered(out), timeout=60)  # fmt: skip
        log = worker.log_text()
    assert "vanished from the lease table while held" in log
