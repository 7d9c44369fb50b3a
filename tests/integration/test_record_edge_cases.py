"""Records at the edges of what Kinesis allows reach the processor intact: a record of ~1 MB,
binary (non-UTF-8) data, an empty-looking payload, and a record with a maximal partition key."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from pathlib import Path
from typing import Any

from worker_procs import wait_active

from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.worker import Worker


def test_big_binary_and_odd_records_arrive_intact(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    big = bytes(range(256)) * (1_000_000 // 256)  # ~1 MB, every byte value
    payloads = {
        "big": big,
        "binary": b"\xff\xfe\x00\x80 not utf-8 \xc3\x28",
        "one-byte": b"\x00",
        "k" * 256: b"maximal partition key",
    }
    for key, data in payloads.items():
        kinesis_client.put_record(StreamName=unique_name, Data=data, PartitionKey=key)
    got: dict[str, str] = {}
    lock = threading.Lock()

    class Digest(RecordProcessor):
        def process_records(self, process_records_input: ProcessRecordsInput) -> None:
            with lock:
                for r in process_records_input.records:
                    got[r.partition_key] = hashlib.sha256(r.binary_data).hexdigest()
                    assert r.data  # base64 text, as amazon-kclpy gives it
            process_records_input.checkpointer.checkpoint()

    cfg = WorkerConfig(
        application_name=unique_name, stream_name=unique_name, endpoint_url=localstack_endpoint,
        initial_position=InitialPosition.trim_horizon(), lease_store=f"sqlite:{tmp_path / 'l.db'}",
        failover_time=3.0, idle_time_between_reads=0.2, worker_id="w",
    )  # fmt: skip

    async def scenario(worker: Worker) -> None:
        deadline = time.monotonic() + 60
        try:
            while len(got) < len(payloads):
                assert time.monotonic() < deadline, f"only {sorted(got)} arrived"
                await asyncio.sleep(0.2)
        finally:
            worker.request_shutdown()

    asyncio.run(run_worker(cfg, Digest, on_started=scenario, install_signal_handlers=False))
    assert got == {k: hashlib.sha256(v).hexdigest() for k, v in payloads.items()}
