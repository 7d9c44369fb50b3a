"""A stored checkpoint older than anything the stream still holds (aged out of retention): each
policy on a real worker against LocalStack."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, wait_active

from checkpoint.lease import Lease
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker

SHARD = "shardId-000000000000"


@pytest.mark.parametrize("policy", ["fail", "earliest", "latest"])
def test_aged_checkpoint_policy(
    policy: str, kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    old = set(produce(kinesis_client, name, range(10)))
    iterator = kinesis_client.get_shard_iterator(
        StreamName=name, ShardId=SHARD, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    first = kinesis_client.get_records(ShardIterator=iterator, Limit=1)["Records"][0]
    # A checkpoint just before the oldest record still held: what a consumer that stopped before
    # the retention window moved past would find.
    aged = str(int(first["SequenceNumber"]) - 1)
    db = tmp_path / "leases.db"
    store = SQLiteLeaseTable(db, namespace=name)
    store.ensure_table()
    store.create_lease_if_absent(Lease(SHARD, ExtendedSequenceNumber(aged)))
    got: list[str] = []

    class Collect(RecordProcessor):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            got.extend(r.binary_data.decode() for r in process_records_input.records)
            process_records_input.checkpointer.checkpoint()

    cfg = WorkerConfig(
        application_name=name, stream_name=name, endpoint_url=localstack_endpoint,
        initial_position=InitialPosition.trim_horizon(), lease_store=f"sqlite:{db}",
        failover_time=3.0, idle_time_between_reads=0.2, aged_checkpoint_policy=policy,
        worker_id="w",
    )  # fmt: skip
    new: set[str] = set()

    async def scenario(worker: Worker) -> None:
        deadline = time.monotonic() + 60
        try:
            if policy == "fail":
                while (lease := worker.store.get_lease(SHARD)) is None or not lease.closed_count:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            elif policy == "earliest":
                while not old <= set(got):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            else:
                # Reset to LATEST: when exactly the LATEST iterator is in place is the worker's
                # business, so records go on being put, one at a time, until a few of them came
                # through; what was put before the iterator may be skipped (LATEST), nothing after.
                n = 10
                while len(got) < 3:
                    assert time.monotonic() < deadline
                    new.update(
                        await asyncio.to_thread(produce, kinesis_client, name, range(n, n + 1))
                    )
                    n += 1
                    await asyncio.sleep(0.2)
                new.update(await asyncio.to_thread(produce, kinesis_client, name, range(n, n + 5)))
                while str(n + 4) not in got:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
        finally:
            worker.request_shutdown()

    asyncio.run(run_worker(cfg, Collect, on_started=scenario, install_signal_handlers=False))
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "older than the stream's retention" in messages
    if policy == "fail":
        assert got == []
        lease = store.get_lease(SHARD)
        assert lease is not None and lease.closed_until is not None
        assert lease.checkpoint.sequence_number == aged  # untouched
    elif policy == "earliest":
        assert sorted(got, key=int) == sorted(old, key=int)
        assert "what aged out before the oldest record is gone" in messages
    else:
        assert not old & set(got)  # the aged records were skipped: the policy says so
        # From the first record read on, every one put after it, in order: no gap.
        first = int(got[0])
        assert [int(g) for g in got] == list(range(first, max(int(k) for k in new) + 1))
        lease = store.get_lease(SHARD)
        assert lease is not None and lease.checkpoint.sequence_number.isdigit()  # past the start
        assert "are lost" in messages
