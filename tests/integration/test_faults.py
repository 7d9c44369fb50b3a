"""Fault injection on a real worker against LocalStack: Kinesis throttling, expired iterators and
500s; lease-table throttling and storms of lost conditional writes; the endpoint unreachable for
30 s (refused, then silent). The worker recovers and loses nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from faults import FaultyKinesis, FaultyStore, Proxy, client_error, throttled
from worker_procs import produce, wait_active

from checkpoint.base.errors import DependencyError
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.processor import InitializeInput, ProcessRecordsInput, RecordProcessor
from kclpy_spark.runtime.daemon import run_worker
from kclpy_spark.runtime.lease_store import open_lease_store
from kclpy_spark.runtime.worker import Worker


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()

    def factory(self) -> RecordProcessor:
        collector = self

        class Collect(RecordProcessor):
            def initialize(self, initialize_input: InitializeInput) -> None:
                self.shard = initialize_input.shard_id

            def process_records(self, process_records_input: ProcessRecordsInput) -> None:
                with collector.lock:
                    collector.seen.update(
                        r.binary_data.decode() for r in process_records_input.records
                    )
                process_records_input.checkpointer.checkpoint()

        return Collect()

    def has(self, wanted: set[str]) -> bool:
        with self.lock:
            return wanted <= set(self.seen)


def _cfg(name: str, endpoint: str, tmp_path: Path, **extra: Any) -> WorkerConfig:
    base: dict[str, Any] = dict(
        application_name=name, stream_name=name, endpoint_url=endpoint,
        initial_position=InitialPosition.trim_horizon(), lease_store=f"sqlite:{tmp_path / 'l.db'}",
        failover_time=3.0, idle_time_between_reads=0.2, max_records=7, worker_id="w",
    )  # fmt: skip
    base.update(extra)
    return WorkerConfig(**base)


def _run(cfg: WorkerConfig, collector: Collector, scenario: Any, **wrap: Any) -> None:
    async def wrapped(worker: Worker) -> None:
        try:
            await scenario(worker)
        finally:
            worker.request_shutdown()

    asyncio.run(
        run_worker(
            cfg, collector.factory, on_started=wrapped, install_signal_handlers=False, **wrap
        )
    )


async def _until(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


def test_kinesis_throttling_expired_iterators_and_500s(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produced = set(produce(kinesis_client, unique_name, range(80)))

    def fault(operation: str, n: int) -> BaseException | None:
        if operation == "get_records" and n % 3 == 0:
            return client_error("ProvisionedThroughputExceededException", "GetRecords")
        if operation == "get_records" and n % 7 == 0:
            return client_error("ExpiredIteratorException", "GetRecords")
        if operation == "get_shard_iterator" and n % 4 == 1:
            return client_error("InternalFailure", "GetShardIterator", status=500)
        return None

    kinesis: dict[str, FaultyKinesis] = {}

    def wrap(client: Any) -> FaultyKinesis:
        kinesis["c"] = FaultyKinesis(client, fault)
        return kinesis["c"]

    collector = Collector()

    async def scenario(worker: Worker) -> None:
        await _until("every record", lambda: collector.has(produced), 120)

    _run(_cfg(unique_name, localstack_endpoint, tmp_path), collector, scenario, wrap_kinesis=wrap)
    injected = kinesis["c"].injected
    assert injected.get("get_records", 0) >= 5 and injected.get("get_shard_iterator", 0) >= 1
    assert set(collector.seen) == produced
    # Expired iterators resume after the last record delivered: nothing is delivered twice.
    assert max(collector.seen.values()) == 1


def test_lease_table_throttling_and_lost_write_storms(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    first = set(produce(kinesis_client, unique_name, range(40)))
    storm = {"on": False}

    def fault(method: str, n: int) -> object:
        if storm["on"] and method in {"renew_lease", "take_lease", "update_checkpoint"}:
            return "lose" if n % 2 else throttled()
        if method == "scan_table" and n % 5 == 0:
            return DependencyError("injected: scan failed")
        if method == "update_checkpoint" and n % 4 == 0:
            return throttled()
        return None

    stores: dict[str, FaultyStore] = {}

    def wrap(store: Any) -> FaultyStore:
        stores["s"] = FaultyStore(store, fault)
        return stores["s"]

    collector = Collector()
    second: set[str] = set()

    async def scenario(worker: Worker) -> None:
        await _until("the first records", lambda: collector.has(first), 60)
        storm["on"] = True  # every renewal, take and checkpoint now loses or is throttled
        second.update(await asyncio.to_thread(produce, kinesis_client, unique_name, range(40, 80)))
        await asyncio.sleep(8.0)  # well past the 3 s failover: every lease is lost meanwhile
        assert not worker.holder.held(), "leases survived a storm of lost renewals"
        storm["on"] = False
        await _until("every record after the storm", lambda: collector.has(first | second), 90)

    _run(_cfg(unique_name, localstack_endpoint, tmp_path), collector, scenario, wrap_store=wrap)
    assert set(collector.seen) == first | second
    injected = stores["s"].injected
    storm_hits = sum(injected.get(m, 0) for m in ("renew_lease", "take_lease", "update_checkpoint"))
    assert storm_hits >= 3 and injected.get("scan_table", 0) >= 1


def test_endpoint_unreachable_for_30_seconds(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    first = set(produce(kinesis_client, unique_name, range(30)))
    url = urlparse(localstack_endpoint)
    # The lease table made first, straight and with seconds a call: through the proxy the
    # worker's CreateTable has 0.5 s a try (3 s failover), which DynamoDB Local under the
    # suite's start-up load (Spark JVMs starting) overran (CI, twice). The outage is the test.
    direct = _cfg(unique_name, localstack_endpoint, tmp_path, lease_store="dynamodb",
                  failover_time=30.0)  # fmt: skip
    open_lease_store(direct)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4566)
    collector = Collector()
    during: set[str] = set()
    try:
        cfg = _cfg(unique_name, f"http://127.0.0.1:{proxy.port}", tmp_path,
                   lease_store="dynamodb")  # fmt: skip

        async def scenario(worker: Worker) -> None:
            await _until("the first records", lambda: collector.has(first), 60)
            proxy.set("refuse")
            during.update(await asyncio.to_thread(produce, kinesis_client, unique_name,
                                                  range(30, 60)))  # fmt: skip
            await asyncio.sleep(15.0)
            proxy.set("silent")
            await asyncio.sleep(15.0)
            proxy.set("up")
            await _until("every record after the outage", lambda: collector.has(first | during),
                         150)  # fmt: skip

        _run(cfg, collector, scenario)
    finally:
        proxy.close()
    assert set(collector.seen) == first | during


def test_a_start_waits_for_a_lease_table_endpoint_a_few_seconds_from_up(
    localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """At start no lease is at stake: the daemon's start tries its lease table again for about a
    minute (as it waits for its stream). It gave up after half a failover time (1.5 s here), as
    an unpatient open still does."""
    url = urlparse(localstack_endpoint)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4566)
    up = threading.Timer(4.0, proxy.set, args=("up",))
    try:
        cfg = _cfg(unique_name, f"http://127.0.0.1:{proxy.port}", tmp_path,
                   lease_store="dynamodb")  # fmt: skip
        proxy.set("refuse")
        with pytest.raises(DependencyError):
            open_lease_store(cfg)  # an operator command: one budget, then the error
        up.start()
        started = time.monotonic()
        store = open_lease_store(cfg, patient=True)
        assert time.monotonic() - started >= 3.5
        assert store.list_leases() == []
    finally:
        up.cancel()
        proxy.close()


def test_an_operator_command_rides_out_a_lease_table_endpoint_down_for_two_seconds(
    localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """An operator command had a daemon's call budget, half a lease (1.5 s here), though it
    protects no lease: `reset` right after `suspend` failed in CI on one slow read. It now has
    seconds a call and a few tries."""
    from kclpy_spark.ops.commands import open_store

    url = urlparse(localstack_endpoint)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4566)
    up = threading.Timer(2.0, proxy.set, args=("up",))
    try:
        cfg = _cfg(unique_name, f"http://127.0.0.1:{proxy.port}", tmp_path,
                   lease_store="dynamodb")  # fmt: skip
        open_lease_store(cfg)  # the application's table, made while the endpoint is up
        proxy.set("refuse")
        with pytest.raises(DependencyError):
            open_lease_store(cfg)  # a daemon's budget: gone within half a lease
        up.start()
        store = open_store(cfg)
        assert store.list_leases() == []
    finally:
        up.cancel()
        proxy.close()


def test_fake_200_answers_to_get_records_never_end_an_open_shard(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """For 8 s every Kinesis call is answered 200 with ``{}`` or an HTML page (a broken proxy):
    no next iterator, no child shards. The shard is open, so none of it is a shard end: the
    worker asks again, and the records put meanwhile and after are delivered."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    first = set(produce(kinesis_client, unique_name, range(20)))
    url = urlparse(localstack_endpoint)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4566)
    collector = Collector()
    later: set[str] = set()
    checkpoints: list[str] = []
    try:
        cfg = _cfg(unique_name, f"http://127.0.0.1:{proxy.port}", tmp_path)

        async def scenario(worker: Worker) -> None:
            await _until("the first records", lambda: collector.has(first), 60)
            proxy.set("fake200")
            later.update(await asyncio.to_thread(produce, kinesis_client, unique_name,
                                                  range(20, 40)))  # fmt: skip
            await _until("fake answers", lambda: proxy.fake_answers >= 6, 30)
            await asyncio.sleep(8.0)
            proxy.set("up")
            later.update(await asyncio.to_thread(produce, kinesis_client, unique_name,
                                                  range(40, 60)))  # fmt: skip
            await _until("every record after the fake answers",
                         lambda: collector.has(first | later), 60)  # fmt: skip
            checkpoints.extend(str(x.checkpoint) for x in worker.store.list_leases())

        _run(cfg, collector, scenario)
    finally:
        proxy.close()
    assert proxy.fake_answers >= 6
    assert set(collector.seen) == first | later
    assert checkpoints and "SHARD_END" not in checkpoints


def test_a_fake_200_answer_to_list_shards_at_start_up_is_asked_again(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """#49 item 10: ListShards answering ``{}`` at start-up was a stream without shards: the
    worker was ready with no lease until the next shard sync. Now the answer is malformed and
    asked again. The next sync is ten minutes away here, so only the first one can lease."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produced = set(produce(kinesis_client, unique_name, range(10)))
    url = urlparse(localstack_endpoint)
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 4566)
    proxy.set("fake200")
    collector = Collector()
    timer = threading.Timer(4.0, proxy.set, args=("up",))
    timer.start()
    try:
        cfg = _cfg(unique_name, f"http://127.0.0.1:{proxy.port}", tmp_path,
                   shard_sync_interval=600.0)  # fmt: skip

        async def scenario(worker: Worker) -> None:
            await _until("every record", lambda: collector.has(produced), 60)

        _run(cfg, collector, scenario)
    finally:
        timer.cancel()
        proxy.close()
    assert proxy.fake_answers >= 2
    assert set(collector.seen) == produced
