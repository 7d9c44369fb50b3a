"""The driver heap figures: read in the writer threads at most every few seconds, kept for the
metrics (which never call into the JVM), and exported with the sink's counters."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from checkpoint.base.clock import ManualClock
from kclpy_spark.spark.jvm_heap import HeapFigures, HeapSampler
from kclpy_spark.spark.updates import BatcherStats, BatcherStatsCollector


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


def test_without_a_local_jvm_there_are_no_heap_metrics() -> None:
    names = _exposition(BatcherStatsCollector(BatcherStats()))
    assert not any("jvm_heap" in n or "python_gc" in n for n in names)
