"""One real worker, in this process, against LocalStack: every record processed and checkpointed,
parents before children across a split, and a graceful shutdown that releases every lease."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import (
    InitializeInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[str, list[str]] = {}
        self.events: list[tuple[str, str]] = []  # (event, shard) in the order they happened

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

            def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
                with recorder.lock:
                    recorder.events.append(("shutdown_requested", self.shard))
                shutdown_requested_input.checkpointer.checkpoint()

        return Proc()


def put(kinesis: Any, stream: str, start: int, count: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    resp = kinesis.put_records(
        StreamName=stream,
        Records=[
            {"Data": f"r{start + i}".encode(), "PartitionKey": f"k{start + i}"}
            for i in range(count)
        ],
    )
    assert resp["FailedRecordCount"] == 0
    for r in resp["Records"]:
        out.setdefault(r["ShardId"], []).append(r["SequenceNumber"])
    return out


def test_worker_processes_everything_across_a_split_and_shuts_down_cleanly(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Any
) -> None:
    stream = unique_name
    kinesis_client.create_stream(StreamName=stream, ShardCount=2)
    kinesis_client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60}
    )
    produced = put(kinesis_client, stream, 0, 60)
    cfg = WorkerConfig(
        application_name=stream,
        stream_name=stream,
        endpoint_url=localstack_endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{tmp_path / 'leases.db'}",
        failover_time=3.0,
        idle_time_between_reads=0.2,
        parent_shard_poll_interval=0.5,
        shard_sync_interval=2.0,
        worker_id="worker-1",
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
            shard = kinesis_client.describe_stream(StreamName=stream)["StreamDescription"]["Shards"]
            rng = next(s for s in shard if s["ShardId"] == parent)["HashKeyRange"]
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
            for shard_id, seqs in (
                await asyncio.to_thread(put, kinesis_client, stream, 60, 60)
            ).items():
                produced.setdefault(shard_id, []).extend(seqs)
            while not all_processed():
                assert time.monotonic() < deadline, "phase 2 records not processed in time"
                await asyncio.sleep(0.2)
            result["parent"] = parent
            result["leases"] = {x.lease_key: x for x in worker.store.list_leases()}
        finally:
            worker.request_shutdown()

    async def main() -> Worker | None:
        await asyncio.wait_for(
            run_worker(cfg, recorder.processor, on_started=scenario, install_signal_handlers=False),
            timeout=150,
        )
        return None

    asyncio.run(main())
    assert "leases" in result, "the scenario did not complete"
    # Every produced record processed, each exactly once (single worker, checkpoint per batch).
    for shard_id, seqs in produced.items():
        got = recorder.records.get(shard_id, [])
        assert sorted(got, key=int) == sorted(seqs, key=int), shard_id
        assert len(got) == len(set(got)), f"duplicates on {shard_id}"
    parent = result["parent"]
    children = [s for s in produced if s not in ("shardId-000000000000", "shardId-000000000001")]
    assert len(children) >= 1
    events = recorder.events
    parent_end = events.index(("shard_ended", parent))
    for child in children:
        assert events.index(("initialize", child)) > parent_end, (
            "child started before its parent ended"
        )
    leases = result["leases"]
    if parent in leases:
        assert leases[parent].checkpoint.is_shard_end
        assert set(leases[parent].child_shard_ids) >= set(children)
    else:  # the audit deleted it already: allowed only once every child's lease has started
        assert all(child in leases and leases[child].started for child in children), leases
    # Graceful shutdown: processors were asked, leases released.
    from checkpoint.stores.sqlite import SQLiteLeaseTable

    after = SQLiteLeaseTable(tmp_path / "leases.db", namespace=stream).list_leases()
    assert all(x.lease_owner is None for x in after)
    open_shards = [x for x in after if not x.checkpoint.is_shard_end]
    for lease in open_shards:
        if lease.shard_id in produced:
            assert lease.checkpoint.sequence_number == max(produced[lease.shard_id], key=int)
    assert {s for e, s in events if e == "shutdown_requested"} == {x.shard_id for x in open_shards}
