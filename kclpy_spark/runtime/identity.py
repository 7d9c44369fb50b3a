"""One process per worker id: two processes with the same id would both think every lease of that
owner is theirs, and both claim shard-sync leadership. Each process marks the status record it
publishes with an instance id; ``unique_worker_id`` refuses to start beside a live one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from kclpy_spark.ops import control

if TYPE_CHECKING:
    from kclpy_spark.runtime.worker import Worker

log = logging.getLogger(__name__)

Io = Callable[..., Awaitable[Any]]


def duplicate_message(worker_id: str) -> str:
    return (
        f"another process runs with worker_id {worker_id!r} (it keeps publishing its status); "
        "every worker needs a distinct worker_id"
    )


def note_duplicate(worker: Worker, other: str | None) -> None:
    """Tell health whether a status publish found another process under our id (logged once)."""
    health = worker.health
    if other is None:
        health.duplicate_worker = None
        return
    message = duplicate_message(worker.cfg.worker_id)
    if health.duplicate_worker is None:
        log.error("worker %s: %s", worker.cfg.worker_id, message)
    health.duplicate_worker = message


async def unique_worker_id(worker: Worker, io: Io) -> None:
    """Raise DuplicateWorkerError if another live process publishes under ``worker``'s id. A
    record written lately by another instance may be a previous run that crashed: wait one status
    interval and look again; only a record that moved meanwhile is a live duplicate."""
    cfg, clock, interval = worker.cfg, worker.clock, worker.timing.lease_duration
    status = await io(control.worker_status, worker.store, cfg.worker_id)
    if not control.published_by_another(status, worker.instance, clock.wall(), 3 * interval):
        return
    log.info(
        "worker %s: a process with this worker id published its status %.0fs ago; waiting "
        "%.0fs to see whether it still runs",
        cfg.worker_id,
        clock.wall() - float(status.get("updated_at", 0.0)),
        interval + 1,
    )
    await worker.sleep(interval + 1)
    again = await io(control.worker_status, worker.store, cfg.worker_id)
    if again.get("updated_at") != status.get("updated_at"):
        raise control.DuplicateWorkerError(duplicate_message(cfg.worker_id))
