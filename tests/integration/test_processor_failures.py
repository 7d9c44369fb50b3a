"""Processor failures on a real worker (LocalStack): retried, never skipped; a poison batch parks
its lease (visible, reopened later) while the rest of the worker goes on; async processors work."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, wait_active

from checkpoint.lease import LeaseState
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import InitializeInput, ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker


def _cfg(name: str, endpoint: str, tmp_path: Path, **extra: Any) -> WorkerConfig:
    return WorkerConfig(
        application_name=name,
        stream_name=name,
        endpoint_url=endpoint,
        initial_position=InitialPosition.trim_horizon(),
        lease_store=f"sqlite:{tmp_path / 'leases.db'}",
        failover_time=3.0,
        idle_time_between_reads=0.2,
        worker_id="solo",
        **extra,
    )


def _run(cfg: WorkerConfig, factory: Any, until: Any, timeout: float = 90) -> Worker:
    box: dict[str, Worker] = {}

    async def scenario(worker: Worker) -> None:
        box["w"] = worker
        deadline = time.monotonic() + timeout
        try:
            while not until(worker):
                assert time.monotonic() < deadline, "scenario timed out"
                await asyncio.sleep(0.2)
        finally:
            worker.request_shutdown()

    asyncio.run(run_worker(cfg, factory, on_started=scenario, install_signal_handlers=False))
    return box["w"]


def _stream(kinesis: Any, name: str, shards: int, count: int) -> set[str]:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_active(kinesis, name)
    return set(produce(kinesis, name, range(count)))


def test_failing_batches_are_retried_until_processed(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    produced = _stream(kinesis_client, unique_name, 1, 40)
    attempts: Counter[str] = Counter()
    done: list[str] = []
    last_seq: list[str] = []
    lock = threading.Lock()

    class Flaky(RecordProcessor):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            first = process_records_input.records[0].sequence_number
            with lock:
                attempts[first] += 1
                if attempts[first] <= 2:
                    raise RuntimeError(f"transient failure on {first}")
                done.extend(r.binary_data.decode() for r in process_records_input.records)
                last_seq.append(process_records_input.records[-1].sequence_number)
            process_records_input.checkpointer.checkpoint()

    caplog.set_level(logging.ERROR, logger="kclpy_spark.runtime.consumer")
    cfg = _cfg(unique_name, localstack_endpoint, tmp_path, max_processing_attempts=5)
    worker = _run(cfg, Flaky, lambda w: produced <= set(done))
    assert sorted(done, key=int) == sorted(produced, key=int)  # each once, none skipped
    assert all(n == 3 for n in attempts.values())
    failures = [r for r in caplog.records if "process_records failed" in r.getMessage()]
    assert failures and all("shardId-000000000000" in r.getMessage() for r in failures)
    # The checkpoint is the last record processed (each batch checkpointed once it succeeded).
    lease = worker.store.get_lease("shardId-000000000000")
    assert lease is not None
    assert lease.checkpoint.sequence_number == last_seq[-1]


def test_poison_batch_parks_its_lease_and_the_worker_goes_on(
    kinesis_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _stream(kinesis_client, unique_name, 2, 40)
    seen: dict[str, set[str]] = {}
    lock = threading.Lock()

    class Poisoned(RecordProcessor):
        def initialize(self, initialize_input: InitializeInput) -> None:
            self.shard = initialize_input.shard_id

        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            if self.shard == "shardId-000000000000":
                raise ValueError("poison")
            with lock:
                seen.setdefault(self.shard, set()).update(
                    r.binary_data.decode() for r in process_records_input.records
                )
            process_records_input.checkpointer.checkpoint()

    cfg = _cfg(unique_name, localstack_endpoint, tmp_path, max_processing_attempts=2,
               park_duration=3600.0)  # fmt: skip

    def parked_and_other_done(worker: Worker) -> bool:
        lease = worker.store.get_lease("shardId-000000000000")
        other = produce_map.get("shardId-000000000001", set())
        with lock:
            other_done = other <= seen.get("shardId-000000000001", set())
        return lease is not None and lease.closed_count == 1 and other_done

    produce_map: dict[str, set[str]] = {}
    for number, shard in produce(kinesis_client, unique_name, range(40, 60)).items():
        produce_map.setdefault(shard, set()).add(number)
    worker = _run(cfg, Poisoned, parked_and_other_done)
    lease = worker.store.get_lease("shardId-000000000000")
    assert lease is not None
    assert lease.state(time.time()) is LeaseState.CLOSED
    assert lease.lease_owner is None and lease.closed_until is not None
    assert lease.checkpoint.is_sentinel  # nothing of the poisoned shard was checkpointed
    assert "shardId-000000000000" not in seen
    # What docs/guarantees.md promises an operator: the reason at ERROR, CLOSED in status.
    parked = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
              and "shardId-000000000000: parked" in r.getMessage()]  # fmt: skip
    assert parked and "poison" in parked[0], [r.getMessage() for r in caplog.records][-20:]
    from kclpy_spark.ops.status import lease_rows, render_table

    now = time.time()
    table = render_table(lease_rows(worker.store.list_leases(), {}, now), now)
    [row] = [line for line in table.splitlines() if "shardId-000000000000" in line]
    assert "CLOSED (reopens in" in row


def test_async_processor_methods_are_awaited(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    produced = _stream(kinesis_client, unique_name, 1, 25)
    got: list[str] = []
    loops: set[int] = set()

    class AsyncProc(RecordProcessor):
        async def initialize(self, initialize_input: InitializeInput) -> None:
            loops.add(id(asyncio.get_running_loop()))

        async def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            await asyncio.sleep(0)
            loops.add(id(asyncio.get_running_loop()))
            got.extend(r.binary_data.decode() for r in process_records_input.records)
            process_records_input.checkpointer.checkpoint()

    _run(
        _cfg(unique_name, localstack_endpoint, tmp_path), AsyncProc, lambda w: produced <= set(got)
    )
    assert sorted(got, key=int) == sorted(produced, key=int)
    assert len(loops) == 1  # ran on the worker's own event loop


def test_a_failed_batch_is_not_delivered_for_checkpoint_purposes(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """Shutdown while a failed batch waits for its retry: checkpoint() with no argument in
    shutdown_requested records the last batch that succeeded, never the failed one."""
    _stream(kinesis_client, unique_name, 1, 10)
    ok_batches: list[str] = []
    failures: list[str] = []
    final: list[str] = []

    class SecondBatchFails(RecordProcessor):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            if ok_batches:
                failures.append(process_records_input.records[0].sequence_number)
                raise RuntimeError("the sink is down")
            ok_batches.append(process_records_input.records[-1].sequence_number)
            process_records_input.checkpointer.checkpoint()

        def shutdown_requested(self, shutdown_requested_input: Any) -> None:
            shutdown_requested_input.checkpointer.checkpoint()
            final.append("checkpointed")

    cfg = _cfg(unique_name, localstack_endpoint, tmp_path, max_records=5,
               max_processing_attempts=100)  # fmt: skip
    worker = _run(cfg, SecondBatchFails, lambda w: bool(failures))
    lease = worker.store.get_lease("shardId-000000000000")
    assert lease is not None and final == ["checkpointed"]
    assert lease.checkpoint.sequence_number == ok_batches[-1]
    assert int(failures[0]) > int(ok_batches[-1])
