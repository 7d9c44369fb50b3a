"""The driver heap figures: read in the writer threads at most every few seconds, kept for the
metrics (which never call into the JVM), and exported with the sink's counters."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from checkpoint.base.clock import ManualClock
from kclpy_spark.spark.jvm_heap import (
    HeapFigures,
    HeapSampler,
    PoolReading,
    live_after_collections,
)
from kclpy_spark.spark.updates import BatcherStats, BatcherStatsCollector

EDEN, SURVIVOR = (False,) * 2
OLD = True


@pytest.mark.parametrize(
    ("pools", "live"),
    [
        # G1 on Spark's driver after young collections only: the old generation holds 49 MB
        # promoted but reads 0 after collection: not known yet
        ([PoolReading(30, 0, EDEN), PoolReading(49, 0, OLD), PoolReading(5, 5, SURVIVOR)], None),
        # after the first mixed or full collection: survivor + old
        ([PoolReading(30, 0, EDEN), PoolReading(60, 57, OLD), PoolReading(5, 4, SURVIVOR)], 61),
        # an empty old generation is not "unknown"
        ([PoolReading(30, 0, EDEN), PoolReading(0, 0, OLD), PoolReading(5, 5, SURVIVOR)], 5),
        # a pool no collector manages counts nothing
        ([PoolReading(10, None, OLD), PoolReading(5, 5, SURVIVOR)], 5),
        ([], 0),
    ],
)
def test_the_live_set_is_known_once_the_old_generation_was_collected(
    pools: list[PoolReading], live: int | None
) -> None:
    assert live_after_collections(pools) == live


def test_the_heap_is_read_at_most_every_period_and_kept_between_reads() -> None:
    clock = ManualClock()
    reads: list[float] = []

    def read() -> HeapFigures:
        reads.append(clock.monotonic())
        return HeapFigures(used=len(reads), live=1, limit=10)

    sampler = HeapSampler(read, every=5.0, clock=clock)
    assert sampler.figures is None
    for _ in range(12):  # a frame every second
        sampler.maybe_read()
        clock.advance(1.0)
    assert [r - reads[0] for r in reads] == [0.0, 5.0, 10.0]
    assert sampler.figures == HeapFigures(used=3, live=1, limit=10)


def test_a_failed_read_keeps_the_last_figures_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    answers: list[HeapFigures | Exception] = [
        HeapFigures(5, 2, 10),
        RuntimeError("py4j gone"),
        RuntimeError("py4j gone"),
    ]

    def read() -> HeapFigures:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sampler = HeapSampler(read, every=1.0, clock=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            sampler.maybe_read()
            clock.advance(1.0)
    assert sampler.figures == HeapFigures(5, 2, 10)
    assert sum("heap figures" in r.getMessage() for r in caplog.records) == 1


def _exposition(collector: BatcherStatsCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_the_sink_metrics_carry_the_heap_and_the_collections_when_there_is_a_jvm() -> None:
    figures: list[HeapFigures | None] = [None]
    runs = [0]
    collector = BatcherStatsCollector(
        BatcherStats(), heap=lambda: figures[0], gc_runs=lambda: runs[0]
    )
    before = _exposition(collector)
    assert before["kclpy_spark_sink_python_gc_runs_total"] == 0
    assert not any(name.startswith("kclpy_spark_sink_jvm_heap") for name in before)  # not read
    figures[0], runs[0] = HeapFigures(used=300, live=120, limit=1024), 4
    after = _exposition(collector)
    assert after["kclpy_spark_sink_jvm_heap_used_bytes"] == 300
    assert after["kclpy_spark_sink_jvm_heap_live_bytes"] == 120
    assert after["kclpy_spark_sink_jvm_heap_limit_bytes"] == 1024
    assert after["kclpy_spark_sink_python_gc_runs_total"] == 4
    figures[0] = HeapFigures(used=300, live=None, limit=1024)  # old generation not collected yet
    unknown = _exposition(collector)
    assert "kclpy_spark_sink_jvm_heap_live_bytes" not in unknown
    assert unknown["kclpy_spark_sink_jvm_heap_used_bytes"] == 300


def test_without_a_local_jvm_there_are_no_heap_metrics() -> None:
    names = _exposition(BatcherStatsCollector(BatcherStats()))
    assert not any("jvm_heap" in n or "python_gc" in n for n in names)


def test_the_sink_metrics_count_executor_read_jobs_and_the_reads_still_stored() -> None:
    figures = [(0, 0)]
    collector = BatcherStatsCollector(BatcherStats(), executor_reads=lambda: figures[0])
    figures[0] = (12, 3)
    got = _exposition(collector)
    assert got["kclpy_spark_sink_executor_read_jobs_total"] == 12
    assert got["kclpy_spark_sink_executor_reads_stored"] == 3
    names = _exposition(BatcherStatsCollector(BatcherStats()))  # read on the driver: none
    assert not any("executor_read" in name for name in names)
