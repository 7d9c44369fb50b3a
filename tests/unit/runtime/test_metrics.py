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


def test_a_shard_held_costs_the_six_series_the_docs_count() -> None:
    """Each counter also exported a ``_created`` series: 11 a shard, not 6."""
    m = metrics()
    shard = m.shard("shardId-000000000001")
    for counter in (m.records, m.bytes, m.processing_failures, m.read_throttled,
                    m.kpl_out_of_range):  # fmt: skip
        counter.labels(*shard).inc()
    m.behind.labels(*shard).set(1)
    lines = [line for line in m.exposition().decode().splitlines()
             if not line.startswith("#") and 'shard="shardId-000000000001"' in line]  # fmt: skip
    assert len(lines) == 6, lines


def test_a_tenure_that_ends_takes_every_series_of_its_shard() -> None:
    m = metrics()
    for key in ("shardId-0", "shardId-1"):
        m.records.labels(*m.shard(key)).inc()
        m.behind.labels(*m.shard(key)).set(100)
        m.read_throttled.labels(*m.shard(key)).inc()
    m.forget("shardId-0")
    exported = series(m)
    assert [x["shard"] for x in exported["kclpy_spark_behind_latest_seconds"]] == ["shardId-1"]
    assert [x["shard"] for x in exported["kclpy_spark_records_processed_total"]] == ["shardId-1"]
    assert [x["shard"] for x in exported["kclpy_spark_read_throttled_total"]] == ["shardId-1"]
    m.forget("shardId-1")
    assert "kclpy_spark_records_processed_total" not in series(m)
    assert not [n for n, labels in series(m).items() if any("shard" in x for x in labels)]


def test_a_dynamodb_lease_tables_requests_and_units_are_exported_by_operation() -> None:
    from types import SimpleNamespace

    from checkpoint.stores.capacity import CapacityMeter
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.metrics import worker_metrics

    meter = CapacityMeter()
    meter.add("UpdateItem", 1.0)
    meter.add("UpdateItem", 2.0)
    meter.add("Scan", 1.5)
    store = SimpleNamespace(capacity=meter)  # what the DynamoDB store carries
    cfg = WorkerConfig(stream_name="orders", application_name="app", worker_id="w1")
    m = worker_metrics(cfg, CoordinationCounters(), object(), store, EventLog("w1", lambda: 0.0))

    def values() -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels["operation"]): s.value
            for family in text_string_to_metric_families(m.exposition().decode())
            for s in family.samples
            if s.name.startswith("kclpy_spark_lease_table_")
        }

    assert values() == {
        ("kclpy_spark_lease_table_requests_total", "Scan"): 1.0,
        ("kclpy_spark_lease_table_requests_total", "UpdateItem"): 2.0,
        ("kclpy_spark_lease_table_capacity_units_total", "Scan"): 1.5,
        ("kclpy_spark_lease_table_capacity_units_total", "UpdateItem"): 3.0,
    }
    meter.add("Scan", 1.5)  # read at every scrape, not copied once
    assert values()[("kclpy_spark_lease_table_capacity_units_total", "Scan")] == 3.0


def test_the_workers_totals_keep_what_shards_that_left_counted() -> None:
    """The status page's bytes, failures and refused reads: per worker since it started, though
    each shard's series go when its tenure ends."""
    m = metrics()
    one, two = m.shard("shardId-1"), m.shard("shardId-2")
    m.bytes.labels(*one).inc(100)
    m.bytes.labels(*two).inc(50)
    m.processing_failures.labels(*one).inc()
    m.read_throttled.labels(*two).inc(3)
    assert m.totals() == {"bytes": 150, "failures": 1, "throttled": 3}
    m.forget("shardId-1")
    assert "shardId-1" not in m.exposition().decode()
    assert m.totals() == {"bytes": 150, "failures": 1, "throttled": 3}
    m.bytes.labels(*one).inc(10)  # the shard came back: its series counts from 0 again
    assert m.totals()["bytes"] == 160


def test_two_streams_of_one_name_in_two_accounts_keep_their_own_series() -> None:
    """Their series were one: both lags wrote one gauge, and one tenure's end dropped the other
    lease's series (its lag gone, its throttles no longer exported)."""
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.metrics import shared_stream_names
    from kclpy_spark.stream_spec import StreamSpec

    arns = [f"arn:aws:kinesis:us-east-1:{n * 12}:stream/orders" for n in ("1", "2")]
    specs = (*(StreamSpec(stream_arn=arn) for arn in arns), StreamSpec(stream_name="clicks"))
    shared = shared_stream_names(WorkerConfig(streams=specs, lease_store="memory"))
    assert shared == {"orders"}
    m = WorkerMetrics(CoordinationCounters(), application="app", worker="w1", shared_names=shared)
    a, b = (f"{account * 12}:orders:1700000000:shardId-0" for account in ("1", "2"))
    clicks = "111111111111:clicks:1700000000:shardId-0"
    for key, lag in ((a, 10), (b, 20), (clicks, 30)):
        m.behind.labels(*m.shard(key)).set(lag)
    m.forget(a)
    exported = series(m)["kclpy_spark_behind_latest_seconds"]
    assert sorted(x["stream"] for x in exported) == ["222222222222:orders", "clicks"]
