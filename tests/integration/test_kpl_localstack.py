"""KPL aggregated records through a real in-process worker on LocalStack: every in-range sub-record
once with its sub-sequence number, misrouted sub-records skipped, a corrupt aggregate delivered
whole; a checkpoint at a sub-record survives a restart and reading resumes right after it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import InitializeInput, ProcessRecordsInput, RecordProcessor
from kclpy_spark.retrieval.kpl import partition_key_hash
from kclpy_spark.retrieval.kpl_aggregate import UserRecord, put_entry
from kclpy_spark.runtime.daemon import run_worker

HALF = 2**127
SHARD0 = "shardId-000000000000"
SHARD1 = "shardId-000000000001"

# (shard, sequence number, sub-sequence number, data)
Seen = tuple[str, str, int, bytes]


def keys(lower: bool, n: int) -> list[str]:
    """Partition keys whose MD5 hash lies in the lower (shard 0) or upper (shard 1) half."""
    found = (k for k in (f"pk-{i}" for i in range(500)) if (partition_key_hash(k) < HALF) == lower)
    return [next(found) for _ in range(n)]


class Recorder:
    """Records every delivered record; checkpoints everything, except on ``hold_shard`` where it
    checkpoints exactly ``hold_at`` once that record is delivered."""

    def __init__(
        self, hold_shard: str | None = None, hold_at: ExtendedSequenceNumber | None = None
    ):
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.hold_shard = hold_shard
        self.hold_at = hold_at

    def factory(self) -> RecordProcessor:
        recorder = self

        class Proc(RecordProcessor):
            def initialize(self, initialize_input: InitializeInput) -> None:
                self.shard = initialize_input.shard_id

            def process_records(self, process_records_input: ProcessRecordsInput) -> None:
                records = process_records_input.records
                with recorder.lock:
                    recorder.seen.extend(
                        (self.shard, r.sequence_number, r.sub_sequence_number, r.binary_data)
                        for r in records
                    )
                hold = recorder.hold_at
                if self.shard != recorder.hold_shard or hold is None:
                    process_records_input.checkpointer.checkpoint()
                elif any(
                    (r.sequence_number, r.sub_sequence_number)
                    == (hold.sequence_number, hold.sub_sequence_number)
                    for r in records
                ):
                    process_records_input.checkpointer.checkpoint(
                        hold.sequence_number, hold.sub_sequence_number
                    )

        return Proc()

    def snapshot(self) -> list[Seen]:
        with self.lock:
            return list(self.seen)


def run_until(
    cfg: WorkerConfig, recorder: Recorder, done: Callable[[], bool], out_of_range: list[float]
) -> bool:
    """Run one worker until ``done()`` (or 60 s); True if done. ``out_of_range`` gets what its
    metric of KPL sub-records outside their shard's range counted."""
    finished: dict[str, bool] = {}

    async def scenario(worker: Any) -> None:
        try:
            deadline = time.monotonic() + 60
            while not done() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # room for an unwanted redelivery to show up
            finished["done"] = done()
            samples = worker.metrics.kpl_out_of_range.collect()[0].samples
            out_of_range.append(sum(x.value for x in samples if x.name.endswith("_total")))
        except Exception:  # the scenario runs in a task nobody awaits: log the reason
            logging.getLogger(__name__).exception("scenario failed")
        finally:
            worker.request_shutdown()

    async def main() -> None:
        await asyncio.wait_for(
            run_worker(cfg, recorder.factory, on_started=scenario, install_signal_handlers=False),
            timeout=120,
        )

    asyncio.run(main())
    return finished.get("done", False)


@pytest.fixture
def stream(kinesis_client: Any, unique_name: str) -> Iterator[str]:
    """A new 2-shard stream, deleted afterwards (LocalStack limits open shards)."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    kinesis_client.get_waiter("stream_exists").wait(
        StreamName=unique_name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 60}
    )
    yield unique_name
    kinesis_client.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def test_aggregates_deaggregate_filter_and_resume_inside_an_aggregate(
    kinesis_client: Any, localstack_endpoint: str, stream: str, tmp_path: Path
) -> None:
    low, high = keys(True, 8), keys(False, 8)
    a1 = [UserRecord(k, f"a1-{i}".encode()) for i, k in enumerate(low[:5])]
    a2 = [UserRecord(k, f"a2-{i}".encode()) for i, k in enumerate(high[:4])]
    # Routed into shard 0 by its first key, but two sub-records belong to shard 1 (as after a
    # reshard with a stale shard map): explicit key in shard 1, or a partition key hashing there.
    # Skipped whole, as the KCL does (the KPL puts each of its records again, to its own shard).
    misrouted = [
        UserRecord(low[5], b"m-0", "5"),
        UserRecord(low[6], b"m-1", str(HALF + 5)),
        UserRecord(high[5], b"m-2"),
        UserRecord(low[7], b"m-3"),
    ]
    corrupt: dict[str, Any] = put_entry([UserRecord(low[0], b"c-0"), UserRecord(low[1], b"c-1")])
    corrupt_data: bytes = corrupt["Data"]
    corrupt["Data"] = corrupt_data[:-1] + bytes([corrupt_data[-1] ^ 0xFF])  # MD5 no longer matches
    entries = [
        put_entry(a1),
        {"Data": b"plain-0", "PartitionKey": low[0]},
        corrupt,
        put_entry(misrouted),
        put_entry(a2),
        {"Data": b"plain-1", "PartitionKey": high[0]},
    ]
    seqs: list[str] = []
    for entry in entries:  # one by one: the order on each shard is the order of the list
        resp = kinesis_client.put_record(StreamName=stream, **entry)
        seqs.append(resp["SequenceNumber"])
        assert resp["ShardId"] == (SHARD0 if entry in entries[:4] else SHARD1)
    s_a1, s_p0, s_c, _misrouted, s_a2, s_p1 = seqs

    expected: list[Seen] = (
        [(SHARD0, s_a1, i, u.data) for i, u in enumerate(a1)]
        + [(SHARD0, s_p0, 0, b"plain-0"), (SHARD0, s_c, 0, corrupt["Data"])]
        + [(SHARD1, s_a2, i, u.data) for i, u in enumerate(a2)]
        + [(SHARD1, s_p1, 0, b"plain-1")]
    )
    cfg = WorkerConfig(
        application_name=stream,
        stream_name=stream,
        endpoint_url=localstack_endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{tmp_path / 'leases.db'}",
        failover_time=3.0,
        idle_time_between_reads=0.2,
        shard_sync_interval=2.0,
        worker_id="kpl-worker",
    )

    # Phase 1: everything once; shard 0 checkpoints at sub-record 2 of the first aggregate only.
    hold = ExtendedSequenceNumber(s_a1, 2)
    first = Recorder(hold_shard=SHARD0, hold_at=hold)
    counted: list[float] = []
    assert run_until(cfg, first, lambda: len(first.snapshot()) >= len(expected), counted)
    assert counted == [4.0]  # the misrouted aggregate's four, in the metric
    got = first.snapshot()
    assert sorted(got) == sorted(expected), "each sub-record of a well-routed aggregate once"
    for shard in (SHARD0, SHARD1):  # and in order within each shard
        order = [(int(s), sub) for sh, s, sub, _ in got if sh == shard]
        assert order == sorted(order)
    leases = {
        x.shard_id: x
        for x in SQLiteLeaseTable(tmp_path / "leases.db", namespace=stream).list_leases()
    }
    assert leases[SHARD0].checkpoint == hold

    # Phase 2: a new worker resumes shard 0 right after sub-record 2; shard 1 has nothing left.
    second = Recorder()
    rest = [e for e in expected if e[0] == SHARD0 and (int(e[1]), e[2]) > (int(s_a1), 2)]
    assert run_until(cfg, second, lambda: len(second.snapshot()) >= len(rest), [])
    assert second.snapshot() == rest
