"""The status page's feed reads the worker's published snapshot (runtime.publish.LatestStatus),
never its live state: what the page shows of its own worker is what the last control round
published, and no reader's change to a payload reaches another reader."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from checkpoint.base.clock import ManualClock
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.board.feed import WorkerBoard
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.publish import LatestStatus


async def _io(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _board(latest: LatestStatus, clock: ManualClock) -> WorkerBoard:
    cfg = WorkerConfig(stream_name="s", application_name="app", worker_id="me")
    timing = LeaseTiming(failover=10.0)
    return WorkerBoard(cfg, MemoryLeaseTable(), clock, timing, _io, latest.get)  # type: ignore[arg-type]


def _me(board: WorkerBoard) -> dict[str, Any] | None:
    rows = [w for w in asyncio.run(board.snapshot())["workers"] if w["worker_id"] == "me"]
    return rows[0] if rows else None


def test_the_page_shows_the_last_published_snapshot_and_nothing_before_the_first() -> None:
    clock, latest = ManualClock(wall_start=2_000.0), LatestStatus()
    board = _board(latest, clock)
    assert _me(board) is None  # no control round yet: nothing of our own to show
    payload: dict[str, Any] = {"cpu_percent": 12.5, "leader": True, "suspended": True}
    latest.put(payload, 2_000.0)
    payload["cpu_percent"] = 99.0  # the worker's dict changes after publishing: not the page's
    clock.advance(3.0)
    row = _me(board)
    assert row is not None and row["cpu_percent"] == 12.5 and row["leader"] is True
    assert asyncio.run(board.snapshot())["suspended"] is True  # from the snapshot too
    latest.put({"cpu_percent": 40.0}, 2_003.0)
    row = _me(board)
    assert row is not None and row["cpu_percent"] == 40.0 and row["leader"] is False
    assert asyncio.run(board.snapshot())["suspended"] is False


def test_each_reader_gets_its_own_copy_of_a_snapshot() -> None:
    latest = LatestStatus()
    latest.put({"leases": {"shard-0": {"sink_buffered": 3}}}, 1.0)
    snapshot = latest.get()
    assert snapshot is not None
    first = snapshot.payload()
    first["leases"]["shard-0"]["sink_buffered"] = 1_000
    assert snapshot.payload()["leases"]["shard-0"]["sink_buffered"] == 3


def test_the_page_shows_workers_that_hold_no_lease() -> None:
    """Only the leases' owners' records were read: a spare or suspended worker (or every worker
    of a suspended fleet) was missing from the page, which said "1 live worker"."""
    from checkpoint import coordination
    from checkpoint.port import CoordinationRecord

    clock, latest = ManualClock(wall_start=2_000.0), LatestStatus()
    cfg = WorkerConfig(stream_name="s", application_name="app", worker_id="me")
    table = MemoryLeaseTable()
    for worker in ("spare", "suspended"):
        data = json.dumps({"updated_at": 2_000.0, "suspended": worker == "suspended"})
        record = CoordinationRecord(coordination.worker_key(worker), None, 1, 0.0, data=data)
        assert table.put_record(record, None)
    board = WorkerBoard(cfg, table, clock, LeaseTiming(failover=10.0), _io, latest.get)  # type: ignore[arg-type]
    latest.put({}, 2_000.0)
    shown = {w["worker_id"] for w in asyncio.run(board.snapshot())["workers"]}
    assert shown == {"me", "spare", "suspended"}
