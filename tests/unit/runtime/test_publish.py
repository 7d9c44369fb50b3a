"""A worker's status record stays bounded however many leases it holds."""

from __future__ import annotations

import json

from kclpy_spark.runtime.publish import bounded


def _figures(n: int) -> dict[str, dict[str, object]]:
    return {
        f"shardId-{i:012d}": {
            "sink_in_flight": 2,
            "sink_buffered": i * 10 if i % 3 else None,
            "padding": "x" * 80,
        }
        for i in range(n)
    }


def test_few_leases_are_published_whole() -> None:
    figures = _figures(10)
    assert bounded(figures, 32_768) == (figures, 0)


def test_many_leases_keep_those_with_most_rows_buffered_within_the_budget() -> None:
    figures = _figures(5_000)  # ~600 KB of JSON: over DynamoDB's 400 KB item limit
    assert len(json.dumps(figures)) > 400_000
    kept, omitted = bounded(figures, 32_768)
    assert len(json.dumps(kept)) <= 32_768
    assert omitted == 5_000 - len(kept) and 100 < len(kept) < 5_000
    buffered = [v["sink_buffered"] for v in kept.values()]
    assert None not in buffered  # the ones with rows buffered come first...
    most = sorted(
        (v["sink_buffered"] for v in figures.values() if v["sink_buffered"]), reverse=True
    )
    assert sorted(buffered, reverse=True) == most[: len(kept)]  # ...the fullest of them


def test_the_budget_is_met_exactly_or_under_for_any_size() -> None:
    for n in (1, 2, 50, 300, 301):
        for budget in (10, 200, 5_000):
            kept, omitted = bounded(_figures(n), budget)
            assert len(json.dumps(kept)) <= budget or kept == {}
            assert len(kept) + omitted == n


def test_the_status_publishes_the_cpu_figure_and_whether_it_is_settled() -> None:
    """The load rule reads ``cpu_percent`` and ``cpu_settled`` from here (control.cpu_figures)."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.cpu import CpuMeter
    from kclpy_spark.runtime.publish import status_payload

    clock, used = [0.0], [0.0]
    meter = CpuMeter(lambda: used[0], lambda: clock[0], limit=1.0, wall=lambda: 1000 + clock[0])
    worker = SimpleNamespace(
        cfg=WorkerConfig(stream_name="s"),
        holder=SimpleNamespace(held=list), processor_factory=None, readiness=lambda: (True, "ok"),
        suspended=False, leader=SimpleNamespace(is_leader=True, assigning=True),
        events=SimpleNamespace(recent=lambda n: []), cpu=meter,
        metrics=SimpleNamespace(registry=CollectorRegistry()),
    )  # fmt: skip
    meter.sample(3)
    first = status_payload(worker, 0.0)  # type: ignore[arg-type]
    assert first["leader"] is True and first["assigns"] is True  # shown by the status page
    assert first["cpu_percent"] is None and first["cpu_settled"] is False
    clock[0], used[0] = 10.0, 2.5
    meter.sample(3)
    keys = ("cpu_percent", "cpu_settled", "cpu_since", "cpu_limit")
    assert {k: status_payload(worker, 10.0)[k] for k in keys} == {  # type: ignore[arg-type]
        "cpu_percent": 25.0,
        "cpu_settled": True,
        "cpu_since": 1000.0,  # the window began at the first sample, on the wall clock
        "cpu_limit": 1.0,
    }
    # load_metric = "throughput": no figure others could balance CPU on (a mixed fleet would
    # aim at two different balances).
    worker.cfg = WorkerConfig(stream_name="s", load_metric="throughput")
    assert "cpu_settled" not in status_payload(worker, 10.0)  # type: ignore[arg-type]
