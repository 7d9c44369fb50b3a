"""The resource gauges a long-running daemon is watched by, and the Spark sink's counters."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import threading
from typing import Any

from checkpoint.base.threads import RetiringThreadPool, pool_limits
from checkpoint.counters import CoordinationCounters
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.resources import thread_pools
from kclpy_spark.spark.updates import BatcherStats, BatcherStatsCollector


def _value(text: str, name: str) -> float:
    [line] = [x for x in text.splitlines() if x.startswith((name + " ", name + "{"))]
    return float(line.rsplit(" ", 1)[1])


_COUNT_ONE_SOCKET = """
import json, socket
from kclpy_spark.runtime.resources import process_resources
before = process_resources()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    during = process_resources()
after = process_resources()
print(json.dumps([before, during, after]))
"""


def test_resources_count_what_is_open_now() -> None:
    # In a fresh interpreter: in the test process, sockets an earlier test left to the
    # garbage collector or to a background thread may close between two counts.
    done = subprocess.run([sys.executable, "-c", _COUNT_ONE_SOCKET], capture_output=True,
                          text=True, check=True, timeout=60)  # fmt: skip
    before, during, after = json.loads(done.stdout)
    assert during["open_sockets"] == before["open_sockets"] + 1
    assert during["open_fds"] == before["open_fds"] + 1
    assert after["open_sockets"] == before["open_sockets"]
    assert before["threads"] >= 1 and before["rss_bytes"] > 0


def test_the_worker_exports_resources_and_store_connections() -> None:
    metrics = WorkerMetrics(CoordinationCounters())
    metrics.watch_resources(lambda: 3)

    async def scrape() -> str:  # on a loop, as the status server scrapes
        return metrics.exposition().decode()

    text = asyncio.run(scrape())
    assert _value(text, "kclpy_spark_lease_store_connections") == 3
    assert _value(text, "kclpy_spark_asyncio_tasks") >= 1
    for name in ("kclpy_spark_open_sockets", "kclpy_spark_threads", "process_open_fds",
                 "process_resident_memory_bytes"):  # fmt: skip
        assert _value(text, name) > 0


def test_the_sink_counters_follow_the_batcher_stats() -> None:
    stats = BatcherStats(batches=7, rows=700, failed_attempts=2, commits=7)
    metrics = WorkerMetrics(CoordinationCounters())
    hung = [0]
    metrics.registry.register(BatcherStatsCollector(stats, lambda: hung[0]))
    text = metrics.exposition().decode()
    assert _value(text, "kclpy_spark_sink_batches_total") == 7
    assert _value(text, "kclpy_spark_sink_hung_writes") == 0
    hung[0] = 2
    assert _value(metrics.exposition().decode(), "kclpy_spark_sink_hung_writes") == 2
    assert _value(text, "kclpy_spark_sink_rows_total") == 700
    stats.batches += 1
    assert _value(metrics.exposition().decode(), "kclpy_spark_sink_batches_total") == 8


def test_a_worker_publishes_each_leases_sink_lane_and_nothing_for_record_processors() -> None:
    from kclpy_spark.runtime.publish import sink_lanes
    from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory

    class Factory(SparkSinkProcessorFactory):
        def __init__(self, broken: bool = False) -> None:
            self.broken = broken

        def status(self) -> dict[str, Any]:
            if self.broken:
                raise RuntimeError("sink status failed")
            lane = {"in_flight_batches": 2, "buffered_rows": 40, "state": "active"}
            return {"lanes": {"shardId-0": lane}, "stats": {}}

    class NotASink:
        def status(self, verbose: bool) -> None:  # another factory's method of the same name
            raise AssertionError("not called")

    assert sink_lanes(Factory())["shardId-0"]["in_flight_batches"] == 2
    assert sink_lanes(Factory(broken=True)) == {}  # the rest of the status is still published
    assert sink_lanes(NotASink()) == {} and sink_lanes(object()) == {}


def test_a_worker_publishes_its_sink_totals_and_none_without_a_sink() -> None:
    from kclpy_spark.runtime.publish import sink_figures

    metrics = WorkerMetrics(CoordinationCounters())
    assert sink_figures(metrics.registry) is None
    stats = BatcherStats(batches=3, rows=30, failed_attempts=1, dead_lettered_batches=1)
    metrics.registry.register(BatcherStatsCollector(stats))
    assert sink_figures(metrics.registry) == {
        "batches": 3.0, "rows": 30.0, "failed_attempts": 1.0, "dead_lettered_batches": 1.0,
        "parked_batches": 0.0,
    }  # fmt: skip


def test_threads_are_counted_by_pool_and_exported() -> None:
    release = threading.Event()
    pool = RetiringThreadPool(4, "kclpy-spark-counted")
    try:
        futures = [pool.submit(release.wait) for _ in range(3)]
        assert thread_pools()["kclpy-spark-counted"] == 3
        metrics = WorkerMetrics(CoordinationCounters())
        metrics.watch_resources()
        text = metrics.exposition().decode()
        [found] = [x for x in text.splitlines() if x.startswith("kclpy_spark_threads_by_pool{")
                   and 'pool="kclpy-spark-counted"' in x]  # fmt: skip
        assert float(found.rsplit(" ", 1)[1]) == 3
        [limit] = [x for x in text.splitlines() if x.startswith("kclpy_spark_thread_pool_limit{")
                   and 'pool="kclpy-spark-counted"' in x]  # fmt: skip
        assert float(limit.rsplit(" ", 1)[1]) == 4
        assert thread_pools()["MainThread"] == 1
    finally:
        release.set()
        for future in futures:
            future.result()
        pool.shutdown()
    assert "kclpy-spark-counted" not in pool_limits()  # shut down: no longer a limit


def test_pool_limits_sum_the_pools_of_one_prefix() -> None:
    pools = [RetiringThreadPool(n, "kclpy-spark-limited") for n in (2, 3)]
    assert pool_limits()["kclpy-spark-limited"] == 5
    pools.pop().shutdown()
    assert pool_limits()["kclpy-spark-limited"] == 2
    del pools[:]
    gc.collect()
    assert "kclpy-spark-limited" not in pool_limits()  # collected: gone


def test_a_pool_limit_is_named_as_its_threads_are_counted() -> None:
    release = threading.Event()
    pool = RetiringThreadPool(3, "kclpy-spark-numbered-2")
    try:
        future = pool.submit(release.wait)
        metrics = WorkerMetrics(CoordinationCounters())
        metrics.watch_resources()
        text = metrics.exposition().decode()
        name = 'pool="kclpy-spark-numbered"'
        [count] = [x for x in text.splitlines() if x.startswith("kclpy_spark_threads_by_pool{")
                   and name in x]  # fmt: skip
        [limit] = [x for x in text.splitlines() if x.startswith("kclpy_spark_thread_pool_limit{")
                   and name in x]  # fmt: skip
        assert (float(count.rsplit(" ", 1)[1]), float(limit.rsplit(" ", 1)[1])) == (1, 3)
    finally:
        release.set()
        future.result()
        pool.shutdown()
