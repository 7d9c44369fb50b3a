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


def _quiet_worker(ready: tuple[bool, str] = (True, "ready"), *, leader: bool = False) -> object:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.cpu import CpuMeter

    meter = CpuMeter(lambda: 0.0, lambda: 0.0, limit=2.0, wall=lambda: 1000.0)
    return SimpleNamespace(
        cfg=WorkerConfig(stream_name="s"),
        holder=SimpleNamespace(held=list), processor_factory=None, readiness=lambda: ready,
        suspended=False, leader=SimpleNamespace(is_leader=leader, assigning=False),
        events=SimpleNamespace(recent=lambda n: []), cpu=meter,
        metrics=SimpleNamespace(registry=CollectorRegistry()),
    )  # fmt: skip


def test_a_quiet_workers_status_writes_no_default_and_no_second_copy_of_its_id() -> None:
    """Every Scan of the lease table reads every status record: a field at its default (not
    leader, no leases, no events, "ready") is left out, and the worker id is only the record's
    key. Readers take what is missing as the default: the status page shows the same row."""
    from checkpoint.stores.memory import MemoryLeaseTable
    from kclpy_spark.board.model import Board
    from kclpy_spark.ops import control
    from kclpy_spark.runtime.publish import status_payload

    worker_id = "ip-10-0-12-34.ec2.internal:4242:a1b2c3"
    payload = status_payload(_quiet_worker(), 1010.0)  # type: ignore[arg-type]
    assert set(payload) == {"ready", "cpu_percent", "cpu_settled", "cpu_since", "cpu_limit"}
    store = MemoryLeaseTable()
    control.publish_worker_status(store, worker_id, payload, 1010.0, instance="0123456789abcdef")
    record = store.get_record(control.worker_key(worker_id))
    assert record is not None and record.owner is None and worker_id not in record.data
    board = Board("app", "s", worker_ttl=30.0)
    board.observe([], {worker_id: json.loads(record.data)}, 1011.0)
    [row] = board.snapshot()["workers"]
    assert row["worker_id"] == worker_id and row["live"] and row["ready"] is True
    assert (row["readiness"], row["leader"], row["assigns"], row["leases"]) == ("", False, False, 0)
    assert control.live_workers([record], 1011.0, 30.0) == {worker_id: 1010.0}


def test_the_readiness_reason_is_written_unless_it_is_plain_ready() -> None:
    from kclpy_spark.runtime.publish import status_payload

    not_ready = status_payload(_quiet_worker((False, "no shard read yet")), 0.0)  # type: ignore[arg-type]
    assert (not_ready["ready"], not_ready["readiness"]) == (False, "no shard read yet")
    suspended = status_payload(_quiet_worker((True, "suspended")), 0.0)  # type: ignore[arg-type]
    assert (suspended["ready"], suspended["readiness"]) == (True, "suspended")
    leader = status_payload(_quiet_worker(leader=True), 0.0)  # type: ignore[arg-type]
    assert leader["leader"] is True and "assigns" not in leader
