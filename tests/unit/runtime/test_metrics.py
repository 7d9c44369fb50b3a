"""The worker's Prometheus series: the labels a dashboard needs (application, worker, stream,
shard), and per-shard series that go when the shard does (bounded cardinality)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from checkpoint.counters import CoordinationCounters
from kclpy_spark.runtime.metrics import WorkerMetrics


def series(metrics: WorkerMetrics) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def metrics() -> WorkerMetrics:
    return WorkerMetrics(CoordinationCounters(), application="app", worker="w1", stream="orders")


def test_every_series_names_the_application_and_the_worker() -> None:
    m = metrics()
    m.leases_held.set(2)
    exported = series(m)
    assert exported["kclpy_spark_leases_held"] == [{"application": "app", "worker": "w1"}]
    assert all(
        labels.get("application") == "app" and labels.get("worker") == "w1"
        for samples in exported.values()
        for labels in samples
    )


def test_shard_series_name_the_stream_and_the_shard_id() -> None:
    m = metrics()
    m.records.labels(*m.shard("shardId-000000000001")).inc(5)
    m.records.labels(*m.shard("111122223333:payments:1700000000:shardId-000000000001")).inc(2)
    labels = series(m)["kclpy_spark_records_processed_total"]
    assert {"application": "app", "worker": "w1", "stream": "orders",
            "shard": "shardId-000000000001"} in labels  # fmt: skip
    assert {"application": "app", "worker": "w1", "stream": "payments",
            "shard": "shardId-000000000001"} in labels  # fmt: skip


def test_a_tenure_that_ends_takes_every_series_of_its_shard() -> None:
    m = metrics()
    for key in ("shardId-0", "shardId-1"):
        m.records.labels(*m.shard(key)).inc()
        m.behind.labels(*m.shard(key)).set(100)
    m.forget("shardId-0")
    exported = series(m)
    assert [x["shard"] for x in exported["kclpy_spark_millis_behind_latest"]] == ["shardId-1"]
    assert [x["shard"] for x in exported["kclpy_spark_records_processed_total"]] == ["shardId-1"]
    m.forget("shardId-1")
    assert "kclpy_spark_records_processed_total" not in series(m)
