"""#45: every metric a worker can export passes ``promtool check metrics`` (Debian's prometheus
package; scripts/test.sh installs it), is in base units, and the worker says its version and
readiness. The exposition is the real one: the worker's registry with every collector a worker
registers (the process's, the lease table's, the Spark sink's), each with samples."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kclpy_spark
from checkpoint.counters import CoordinationCounters
from checkpoint.stores.capacity import CapacityMeter
from kclpy_spark.runtime.metrics import WorkerMetrics, _CapacityCollector
from kclpy_spark.spark.jvm_heap import HeapFigures
from kclpy_spark.spark.updates import BatcherStats, BatcherStatsCollector


def full_exposition(ready: bool = True) -> str:
    counters = CoordinationCounters()
    m = WorkerMetrics(counters, application="app", worker="w1", stream="orders")
    m.watch_resources(lambda: 2)
    m.watch_readiness(lambda: (ready, "ready" if ready else "lease table unreachable for 40 s"))
    meter = CapacityMeter()
    meter.add("UpdateItem", 1.0)
    m.registry.register(_CapacityCollector(meter))
    heap = HeapFigures(used=100, live=50, limit=1000)
    m.registry.register(BatcherStatsCollector(BatcherStats(batches=2), heap=lambda: heap,
                                              gc_runs=lambda: 1))  # fmt: skip
    shard = m.shard("shardId-000000000001")
    for metric in (m.records, m.bytes, m.processing_failures, m.read_throttled,
                   m.kpl_out_of_range):  # fmt: skip
        metric.labels(*shard).inc()
    m.behind.labels(*shard).set(1.5)
    m.process_seconds.observe(0.02)
    m.checkpoint_seconds.observe(0.01)
    m.cpu_ratio.set(0.25)
    return m.exposition().decode()


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.geteuid() != 0:
            pytest.skip("promtool not found (scripts/test.sh installs Debian's prometheus as root)")
        pytest.fail("promtool not found: scripts/test.sh installs Debian's prometheus package")
    return found


def test_promtool_finds_nothing_to_say() -> None:
    result = subprocess.run([_promtool(), "check", "metrics"], input=full_exposition(),
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_promtool_would_say_it() -> None:
    """The check can fail: a camelCase counter and a millisecond gauge are reported."""
    bad = ("# HELP x_partitionsCreated_total n\n# TYPE x_partitionsCreated_total counter\n"
           "x_partitionsCreated_total 1\n# HELP x_latency_milliseconds n\n"
           "# TYPE x_latency_milliseconds gauge\nx_latency_milliseconds 3\n")  # fmt: skip
    result = subprocess.run([_promtool(), "check", "metrics"], input=bad,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode != 0
    assert "camelCase" in result.stdout + result.stderr


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_base_units_version_readiness_and_the_process_collectors() -> None:
    samples = _samples(full_exposition())
    assert samples["kclpy_spark_behind_latest_seconds"][0][1] == 1.5
    assert samples["kclpy_spark_cpu_utilization_ratio"][0][1] == 0.25
    ((labels, value),) = samples["kclpy_spark_build_info"]
    assert value == 1 and labels["version"] == kclpy_spark.__version__
    assert labels["application"] == "app" and labels["worker"] == "w1"
    assert samples["kclpy_spark_ready"][0][1] == 1
    assert _samples(full_exposition(ready=False))["kclpy_spark_ready"][0][1] == 0
    assert samples["kclpy_spark_process_records_seconds_count"][0][1] == 1
    for standard in ("process_open_fds", "process_resident_memory_bytes",
                     "process_cpu_seconds_total", "python_info"):  # fmt: skip
        assert standard in samples, standard
    names = set(samples)
    assert not {"kclpy_spark_open_fds", "kclpy_spark_rss_bytes"} & names  # not exported twice
    assert "kclpy_spark_coordination_partitions_created_total" in names
    assert not any("millis" in n or "percent" in n for n in names)
