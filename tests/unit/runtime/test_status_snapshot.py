"""The status page's view of its own worker (runtime.publish.LatestStatus) is put at start, after
every control round whatever the round came to, and as soon as the worker is suspended, so the
page never shows a state older than the last round even while the lease table fails."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from checkpoint import coordination
from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.worker import Worker


def _worker(store: MemoryLeaseTable, clock: ManualClock) -> Worker:
    cfg = WorkerConfig(stream_name="s", worker_id="w", failover_time=10.0)
    return Worker(cfg, lambda: None, store=store, kinesis_sync=None, kinesis_async=None,
                  clock=clock)  # type: ignore[arg-type,return-value]  # fmt: skip


def test_a_control_round_that_fails_still_puts_the_pages_view() -> None:
    store, clock = MemoryLeaseTable(), ManualClock(wall_start=3_000.0)
    worker = _worker(store, clock)
    assert worker.latest_status.get() is None  # nothing before the worker runs

    def down() -> Any:
        raise DependencyError("the coordination table does not answer")

    worker.suspend_flag.read = down  # type: ignore[method-assign]
    clock.advance(7.0)
    with pytest.raises(DependencyError):
        asyncio.run(worker._control_round())
    snapshot = worker.latest_status.get()
    assert snapshot is not None and snapshot.at == 3_007.0


def test_the_page_sees_a_suspension_while_the_consumers_stop() -> None:
    store, clock = MemoryLeaseTable(), ManualClock()
    worker = _worker(store, clock)
    assert coordination.set_suspended(store, True, by="test", now_wall=clock.wall())
    seen: list[bool] = []

    async def shutdown_all(grace: float) -> None:
        snapshot = worker.latest_status.get()
        seen.append(snapshot is not None and snapshot.payload().get("suspended") is True)

    worker.consumers.shutdown_all = shutdown_all  # type: ignore[method-assign]
    asyncio.run(worker._control_round())
    assert seen == [True]
    snapshot = worker.latest_status.get()
    assert snapshot is not None and snapshot.payload()["suspended"] is True
    # The round's status record is written from the same payload the page was given.
    record = store.get_record(coordination.worker_key("w"))
    assert record is not None
    written = json.loads(record.data)
    assert {k: written[k] for k in snapshot.payload()} == snapshot.payload()
