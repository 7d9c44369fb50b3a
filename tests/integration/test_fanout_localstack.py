"""Enhanced fan-out through a real in-process worker on LocalStack: every record exactly once
across a split (parent before children), then the stream consumer is deregistered."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint.sequence import InitialPosition
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.aws import aio_client
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import (
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
)
from kclpy_spark.retrieval.stream_consumer import deregister_consumer
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[str, list[str]] = {}
        self.events: list[tuple[str, str]] = []

    def processor(self) -> RecordProcessor:
        recorder = self

        class Proc(RecordProcessor):
            def initialize(self, initialize_input: InitializeInput) -> None:
                self.shard = initialize_input.shard_id
                with recorder.lock:
                    recorder.events.append(("initialize", self.shard))

            def process_records(self, process_records_input: ProcessRecordsInput) -> None:
                with recorder.lock:
                    recorder.records.setdefault(self.shard, []).extend(
                        r.sequence_number for r in process_records_input.records
                    )
                process_records_input.checkpointer.checkpoint()

            def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
                with recorder.lock:
                    recorder.events.append(("shard_ended", self.shard))
                shard_ended_input.checkpointer.checkpoint()

        return Proc()


def put(kinesis: Any, stream: str, start: int, count: int) -> dict[str, list[str]]:
    resp = kinesis.put_records(
        StreamName=stream,
        Records=[
            {"Data": f"r{start + i}".encode(), "PartitionKey": f"k{start + i}"}
            for i in range(count)
        ],
    )
    assert resp["FailedRecordCount"] == 0
    out: dict[str, list[str]] = {}
    for r in resp["Records"]:
        out.setdefault(r["ShardId"], []).append(r["SequenceNumber"])
    return out


@pytest.fixture
def stream(kinesis_client: Any, unique_name: str) -> Iterator[str]:
    """A new 2-shard stream, deleted afterwards (LocalStack limits open shards)."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    kinesis_client.get_waiter("stream_exists").wait(
        StreamName=unique_name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60}
    )
    yield unique_name
    kinesis_client.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def test_fanout_delivers_every_record_across_a_split(
    kinesis_client: Any, localstack_endpoint: str, stream: str, tmp_path: Path
) -> None:
    produced = put(kinesis_client, stream, 0, 40)
    cfg = WorkerConfig(
        application_name=stream,
        stream_name=stream,
        endpoint_url=localstack_endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{tmp_path / 'leases.db'}",
        failover_time=3.0,
        parent_shard_poll_interval=0.5,
        shard_sync_interval=2.0,
        worker_id="fanout-worker",
        retrieval_mode="fanout",
        consumer_name="fanout-test",
    )
    recorder = Recorder()
    result: dict[str, Any] = {}

    def all_processed() -> bool:
        with recorder.lock:
            return all(
                set(seqs) <= set(recorder.records.get(shard, ()))
                for shard, seqs in produced.items()
            )

    async def scenario(worker: Worker) -> None:
        try:
            deadline = time.monotonic() + 90
            while not all_processed():
                assert time.monotonic() < deadline, "phase 1 records not processed in time"
                await asyncio.sleep(0.2)
            parent = sorted(produced)[0]
            shards = kinesis_client.describe_stream(StreamName=stream)["StreamDescription"][
                "Shards"
            ]
            rng = next(s for s in shards if s["ShardId"] == parent)["HashKeyRange"]
            mid = (int(rng["StartingHashKey"]) + int(rng["EndingHashKey"])) // 2
            await asyncio.to_thread(
                kinesis_client.split_shard,
                StreamName=stream,
                ShardToSplit=parent,
                NewStartingHashKey=str(mid),
            )
            await asyncio.to_thread(
                kinesis_client.get_waiter("stream_exists").wait,
                StreamName=stream,
                WaiterConfig={"Delay": 0.5, "MaxAttempts": 60},
            )
            later = await asyncio.to_thread(put, kinesis_client, stream, 40, 40)
            for shard_id, seqs in later.items():
                produced.setdefault(shard_id, []).extend(seqs)
            while not all_processed():
                assert time.monotonic() < deadline, "phase 2 records not processed in time"
                await asyncio.sleep(0.2)
            result["parent"] = parent
            result["leases"] = {x.shard_id: x for x in worker.store.list_leases()}
        except Exception as exc:  # the scenario runs in a task nobody awaits: keep the reason
            result["error"] = repr(exc)
        finally:
            worker.request_shutdown()

    async def main() -> None:
        try:
            await asyncio.wait_for(
                run_worker(
                    cfg, recorder.processor, on_started=scenario, install_signal_handlers=False
                ),
                timeout=150,
            )
        finally:
            async with aio_client("kinesis", cfg) as kinesis:
                result["deregistered"] = await deregister_consumer(
                    kinesis, {"StreamName": stream}, "fanout-test"
                )

    asyncio.run(main())
    assert "leases" in result, f"the scenario did not complete: {result.get('error')}"
    assert result["deregistered"] is True
    for shard_id, seqs in produced.items():
        got = recorder.records.get(shard_id, [])
        assert sorted(got, key=int) == sorted(seqs, key=int), shard_id
        assert len(got) == len(set(got)), f"duplicates on {shard_id}"
    parent = result["parent"]
    leases = result["leases"]
    children = [s for s in produced if s not in ("shardId-000000000000", "shardId-000000000001")]
    assert children, "no record went to a child shard"
    if parent in leases:
        assert leases[parent].checkpoint.is_shard_end
    else:
        # The leader's cleanup deletes a finished parent's lease once its children have started
        # (completed_leases_to_delete); the shard_ended event below shows it ended first.
        assert all(leases[child].checkpoint.sentinel is None for child in children), leases
    parent_end = recorder.events.index(("shard_ended", parent))
    for child in children:
        assert recorder.events.index(("initialize", child)) > parent_end
    after = SQLiteLeaseTable(tmp_path / "leases.db", namespace=stream).list_leases()
    assert all(x.lease_owner is None for x in after)
