"""A worker's status record stays bounded however many leases it holds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from checkpoint.base.clock import ManualClock
from kclpy_spark.runtime.publish import bounded
from kclpy_spark.runtime.run_state import RunState


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
    """The load rule reads ``cpu_percent`` and ``cpu_settled`` from here
    (coordination.cpu_figures)."""
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
        consumed_streams=lambda: None,
        run_state=RunState("w", ManualClock().monotonic),
        leader=SimpleNamespace(is_leader=True, assigning=True),
        events=SimpleNamespace(recent=lambda n: []), cpu=meter,
        metrics=SimpleNamespace(registry=CollectorRegistry(), totals=lambda: dict.fromkeys(
            ("bytes", "failures", "throttled"), 0)),
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


def _quiet_worker(
    ready: tuple[bool, str] = (True, "ready"),
    *,
    leader: bool = False,
    streams: tuple[str, ...] | None = None,
) -> object:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.cpu import CpuMeter

    meter = CpuMeter(lambda: 0.0, lambda: 0.0, limit=2.0, wall=lambda: 1000.0)
    return SimpleNamespace(
        cfg=WorkerConfig(stream_name="s"),
        holder=SimpleNamespace(held=list), processor_factory=None, readiness=lambda: ready,
        consumed_streams=lambda: None if streams is None else list(streams),
        run_state=RunState("w", ManualClock().monotonic),
        leader=SimpleNamespace(is_leader=leader, assigning=False),
        events=SimpleNamespace(recent=lambda n: []), cpu=meter,
        metrics=SimpleNamespace(registry=CollectorRegistry(), totals=lambda: dict.fromkeys(
            ("bytes", "failures", "throttled"), 0)),
    )  # fmt: skip


def test_a_quiet_workers_status_writes_no_default_and_no_second_copy_of_its_id() -> None:
    """Every Scan of the lease table reads every status record: a field at its default (not
    leader, no leases, no events, "ready") is left out, and the worker id is only the record's
    key. Readers take what is missing as the default: the status page shows the same row."""
    from checkpoint import coordination
    from checkpoint.stores.memory import MemoryLeaseTable
    from kclpy_spark.board.model import Board
    from kclpy_spark.runtime.publish import status_payload

    worker_id = "ip-10-0-12-34.ec2.internal:4242:a1b2c3"
    payload = status_payload(_quiet_worker(), 1010.0)  # type: ignore[arg-type]
    assert set(payload) == {"ready", "cpu_percent", "cpu_settled", "cpu_since", "cpu_limit"}
    store = MemoryLeaseTable()
    coordination.publish_worker_status(
        store, worker_id, payload, 1010.0, instance="0123456789abcdef"
    )
    record = store.get_record(coordination.worker_key(worker_id))
    assert record is not None and record.owner is None and worker_id not in record.data
    board = Board("app", "s", worker_ttl=30.0)
    board.observe([], {worker_id: json.loads(record.data)}, 1011.0)
    [row] = board.snapshot()["workers"]
    assert row["worker_id"] == worker_id and row["live"] and row["ready"] is True
    assert (row["readiness"], row["leader"], row["assigns"], row["leases"]) == ("", False, False, 0)
    assert coordination.live_workers([record], 1011.0, 30.0) == {worker_id: 1010.0}


def test_the_readiness_reason_is_written_unless_it_is_plain_ready() -> None:
    from kclpy_spark.runtime.publish import status_payload

    not_ready = status_payload(_quiet_worker((False, "no shard read yet")), 0.0)  # type: ignore[arg-type]
    assert (not_ready["ready"], not_ready["readiness"]) == (False, "no shard read yet")
    suspended = status_payload(_quiet_worker((True, "suspended")), 0.0)  # type: ignore[arg-type]
    assert (suspended["ready"], suspended["readiness"]) == (True, "suspended")
    leader = status_payload(_quiet_worker(leader=True), 0.0)  # type: ignore[arg-type]
    assert leader["leader"] is True and "assigns" not in leader
    # An exception's text in a reason is redacted, as events are (the status page shows it).
    why = "shard sync failed: Could not connect to https://user:hunter2@proxy.example/"
    leaky = status_payload(_quiet_worker((False, why)), 0.0)  # type: ignore[arg-type]
    assert "hunter2" not in leaky["readiness"] and "[redacted]" in leaky["readiness"]


def test_a_multi_stream_worker_names_the_streams_it_consumes_for_whoever_gives_it_leases() -> None:
    """Without it a leader gave a worker leases of a stream it does not consume (a deploy adding
    a stream, workers still on the old config): it did not take them, and each waited out its
    expiry unread. One stream per table, or too many to name: none named (every stream)."""
    from checkpoint import coordination
    from checkpoint.stores.memory import MemoryLeaseTable
    from kclpy_spark.runtime.publish import STREAMS_PUBLISHED_BYTES, status_payload

    orders, clicks = "111122223333:orders:1700000000", "111122223333:clicks:1700000001"
    store = MemoryLeaseTable()
    # "none open": its only stream does not exist yet; given a lease, it would not take it.
    cases = (("multi", (orders, clicks)), ("single", None), ("none open", ()))
    for worker_id, streams in cases:
        payload = status_payload(_quiet_worker(streams=streams), 1010.0)  # type: ignore[arg-type]
        coordination.publish_worker_status(store, worker_id, payload, 1010.0, instance="i")
    records = store.scan_table(coordination.WORKER_PREFIX).records
    assert coordination.consumed_streams(records) == {
        "multi": frozenset({orders, clicks}),
        "none open": frozenset(),
    }
    many = tuple(f"111122223333:s{i:06d}:1700000000" for i in range(STREAMS_PUBLISHED_BYTES // 30))
    assert "streams" not in status_payload(_quiet_worker(streams=many), 1010.0)  # type: ignore[arg-type]


# A worker holding leases writes its status only when a reader would learn something, or every
# quiet interval (StatusCadence); the record says how long it holds for (live_for).

QUIET = {"ready": True, "cpu_percent": 12.0, "cpu_settled": True, "cpu_since": 990.0,
         "cpu_limit": 2.0, "live_for": 41.0}  # fmt: skip


def _cadence() -> object:
    from kclpy_spark.runtime.publish import StatusCadence

    return StatusCadence(30.0, 10.0)  # the CPU band: half of CPU_NOISE, 0.5 points


def test_a_first_status_and_a_lease_less_workers_status_are_always_written() -> None:
    cadence = _cadence()
    assert cadence.due(QUIET, 0.0)  # type: ignore[attr-defined]
    no_lease = {k: v for k, v in QUIET.items() if k != "live_for"}
    cadence.wrote(no_lease, 0.0)  # type: ignore[attr-defined]
    assert cadence.due(no_lease, 10.0)  # type: ignore[attr-defined]  # its record is all that shows it runs


@pytest.mark.parametrize(
    ("change", "after", "due"),
    [
        ({}, 10.0, False),  # nothing new: quiet
        ({}, 20.0, False),
        ({}, 25.0, True),  # the quiet interval, less half a round (rounds come a little early)
        ({}, 30.0, True),
        ({"cpu_since": 1000.0}, 10.0, False),  # the window's start moves at every round
        ({"cpu_percent": 12.4}, 10.0, False),  # within the band
        ({"cpu_percent": 11.6}, 10.0, False),
        ({"cpu_percent": 12.5}, 10.0, True),  # at the band: the load rule may see it
        ({"cpu_percent": 11.5}, 10.0, True),
        ({"cpu_percent": None}, 10.0, True),
        ({"cpu_settled": False}, 10.0, True),  # a lease came or went
        ({"events": [[1005.0, "took", "shardId-1", "it had no owner"]]}, 10.0, True),
        ({"readiness": "no shard read yet", "ready": False}, 10.0, True),
        ({"leader": True}, 10.0, True),
        ({"sink": {"batches": 3}}, 10.0, True),  # records flowing through a Spark sink
        ({"leases": {"shardId-1": {"sink_in_flight": 1}}}, 10.0, True),
        # the status page's totals ride along on other writes: records flowing cost no write
        ({"bytes": 5_000, "failures": 1, "throttled": 2}, 10.0, False),
        ({"bytes": 5_000}, 25.0, True),
    ],
)
def test_a_holders_status_is_written_when_a_reader_would_learn_something(
    change: dict[str, object], after: float, due: bool
) -> None:
    cadence = _cadence()
    cadence.wrote(QUIET, 100.0)  # type: ignore[attr-defined]
    assert cadence.due({**QUIET, **change}, 100.0 + after) is due  # type: ignore[attr-defined]


def test_a_cpu_figure_drifting_slowly_is_written_once_it_moved_by_the_band() -> None:
    """Compared with what was written, not with the last round: a drift adds up."""
    cadence = _cadence()
    cadence.wrote(QUIET, 0.0)  # type: ignore[attr-defined]
    percents = [12.2, 12.4, 12.6]
    dues = [cadence.due({**QUIET, "cpu_percent": p}, 10.0 * (i + 1))  # type: ignore[attr-defined]
            for i, p in enumerate(percents)]  # fmt: skip
    assert dues == [False, False, True]


def test_a_write_that_failed_is_tried_again_at_the_next_round() -> None:
    cadence = _cadence()
    cadence.wrote(QUIET, 0.0)  # type: ignore[attr-defined]
    changed = {**QUIET, "cpu_settled": False}
    assert cadence.due(changed, 10.0)  # type: ignore[attr-defined]  # the write fails: not noted
    assert cadence.due(changed, 20.0)  # type: ignore[attr-defined]
    cadence.wrote(changed, 20.0)  # type: ignore[attr-defined]
    assert cadence.due(changed, 30.0)  # type: ignore[attr-defined]  # once more after a change
    cadence.wrote(changed, 30.0)  # type: ignore[attr-defined]
    assert not cadence.due(changed, 40.0)  # type: ignore[attr-defined]


def test_a_change_is_followed_by_one_more_write_then_quiet() -> None:
    """A reader may have seen a lease move after the changed figure's window began: the next
    round's figure, whose window began after the change, goes out too."""
    cadence = _cadence()
    rounds = [QUIET, {**QUIET, "cpu_settled": False}, QUIET, QUIET, QUIET, QUIET, QUIET, QUIET]
    reasons = []
    for i, payload in enumerate(rounds):
        reasons.append(cadence.reason(payload, 10.0 * i))  # type: ignore[attr-defined]
        if cadence.due(payload, 10.0 * i):  # type: ignore[attr-defined]
            cadence.wrote(payload, 10.0 * i)  # type: ignore[attr-defined]
    assert reasons == ["first", "changed", "changed", "after a change", None, None,
                       "quiet interval", None]  # fmt: skip


def _real_worker(holding: bool) -> Any:
    from checkpoint.base.clock import ManualClock
    from checkpoint.lease import Lease
    from checkpoint.sequence import TRIM_HORIZON
    from checkpoint.stores.memory import MemoryLeaseTable
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.worker import Worker

    store, clock = MemoryLeaseTable(), ManualClock()
    cfg = WorkerConfig(stream_name="s", worker_id="w", failover_time=10.0)
    worker = Worker(cfg, lambda: None, store=store, kinesis_sync=None, kinesis_async=None,
                    clock=clock)  # type: ignore[arg-type,return-value]  # fmt: skip
    if holding:
        store.create_lease_if_absent(Lease(lease_key="a", checkpoint=TRIM_HORIZON, lease_owner="w"))
        worker.holder.add_taken(store.list_leases()[0])
    return worker


@pytest.mark.parametrize(("holding", "writes"), [(True, 10), (False, 30)])
def test_control_rounds_count_status_writes(holding: bool, writes: int) -> None:
    """30 control rounds (one a lease duration, 300 s): a quiet worker holding a lease writes
    its status at the first round and every third after it, one holding none at every round; each
    holder's record says how long it holds for, the readers' horizon for it. (No CPU figure here:
    the manual clock stands still for the meter.)"""
    import asyncio

    from checkpoint import coordination
    from kclpy_spark.runtime.publish import publish_if_due

    worker = _real_worker(holding)

    async def io(fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def rounds() -> None:
        for _ in range(30):
            await publish_if_due(worker, io, worker.clock.wall())
            worker.clock.advance(10.0)
            if holding:  # its renewals keep the lease (not this test's subject)
                worker.holder.renew_all()

    asyncio.run(rounds())
    record = worker.store.get_record(coordination.worker_key("w"))
    assert record is not None and record.version == writes
    data = json.loads(record.data)
    assert data.get("live_for") == (41.0 if holding else None)
