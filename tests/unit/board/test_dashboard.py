"""The Grafana dashboard (kclpy_spark/board/grafana-dashboard.json) against the metrics the code
exports: no panel or variable queries a metric, or groups by a label, that does not exist."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from checkpoint.counters import CoordinationCounters
from checkpoint.stores.capacity import CapacityMeter
from kclpy_spark.runtime.metrics import WorkerMetrics, _CapacityCollector
from kclpy_spark.spark.jvm_heap import HeapFigures
from kclpy_spark.spark.updates import BatcherStats, BatcherStatsCollector

METRIC = re.compile(r"\b(?:kclpy_spark|process)_[a-z0-9_]+\b")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def dashboard() -> dict[str, Any]:
    text = resources.files("kclpy_spark.board").joinpath("grafana-dashboard.json").read_text()
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def exported() -> dict[str, set[str]]:
    """Every sample name a worker with a Spark sink exports, with its label names."""
    m = WorkerMetrics(CoordinationCounters(), application="app", worker="w1", stream="s")
    stats = BatcherStats()
    stats.sink("sink")  # each configured sink's figures, made by the batcher at its start
    m.registry.register(
        BatcherStatsCollector(stats, heap=lambda: HeapFigures(1, 1, 1), gc_runs=lambda: 0)
    )
    m.watch_resources(lambda: 1)
    m.watch_readiness(lambda: (True, "ready"))
    meter = CapacityMeter()
    meter.add("Scan", 1.0)
    m.registry.register(_CapacityCollector(meter))
    shard = m.shard("shardId-0")
    for metric in (m.records, m.bytes, m.processing_failures, m.kpl_out_of_range,
                   m.read_throttled):  # fmt: skip
        metric.labels(*shard).inc()
    m.behind.labels(*shard).set(1)
    m.checkpoint_seconds.observe(0.01)
    for counter in (m.renewals, m.renewal_failures, m.leases_lost, m.takes, m.steals,
                    m.handoffs_asked):  # fmt: skip
        counter.inc()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(m.exposition().decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def queries() -> list[tuple[str, str]]:
    board = dashboard()
    found = [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']}", variable["query"]["query"]))
    return found


def test_the_dashboard_is_a_dashboard_grafana_imports() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["targets"]
        assert panel["datasource"]["uid"] == "${datasource}"  # chosen at import, no fixed uid
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "application", "worker"} <= set(variables)
    # the worker list shows the chosen applications' workers only
    assert 'application=~"$application"' in variables["worker"]["query"]["query"]


def test_the_panels_an_on_call_person_opens_first_are_there() -> None:
    text = " ".join(expr for _, expr in queries())
    for metric in ("behind_latest_seconds", "records_processed_total", "leases_held",
                   "lease_steals_total", "leases_lost_total", "checkpoint_seconds_bucket",
                   "processing_failures_total", "sink_failed_attempts_total",
                   "read_throttled_total", "bytes_processed_total", "ready",
                   "lease_table_requests_total"):  # fmt: skip
        assert f"kclpy_spark_{metric}" in text


@pytest.mark.parametrize(("where", "expr"), queries(), ids=[w for w, _ in queries()])
def test_every_query_names_exported_metrics_and_labels(where: str, expr: str) -> None:
    names = exported()
    metrics = METRIC.findall(expr)
    assert metrics, f"{where}: no kclpy-spark metric in {expr!r}"
    for metric in metrics:
        assert metric in names, f"{where}: {metric} is not exported"
    labels = set().union(*(names[m] for m in metrics)) | {"le"}
    for group in GROUPING.findall(expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            assert label in labels, f"{where}: grouped by {label!r}, which {metrics} lack"
    for matcher in MATCHERS.findall(expr):
        for label in re.findall(r"([a-z_]+)\s*=~?", matcher):
            assert label in labels, f"{where}: matches on {label!r}, which {metrics} lack"
    for metric, label in re.findall(r"label_values\((\w+),\s*(\w+)\)", expr):
        assert label in names[metric], f"{where}: {metric} has no label {label!r}"


def test_the_check_itself_would_catch_a_wrong_name() -> None:
    with pytest.raises(AssertionError, match="not exported"):
        test_every_query_names_exported_metrics_and_labels("x", "rate(kclpy_spark_nope_total[5m])")
    with pytest.raises(AssertionError, match="grouped by"):
        test_every_query_names_exported_metrics_and_labels(
            "x", "sum by (pod) (kclpy_spark_leases_held)"
        )
