"""One process per worker id: two processes with the same id would both think every lease of that
owner is theirs, and both claim shard-sync leadership. Each process marks the status record it
publishes with an instance id; ``unique_worker_id`` refuses to start beside a live one."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from checkpoint import coordination

if TYPE_CHECKING:
    from checkpoint.base.clock import AsyncSleep, Clock
    from checkpoint.leasing.timing import LeaseTiming
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.health import Health
    from kclpy_spark.runtime.lease_store import LeaseStore

log = logging.getLogger(__name__)

Io = Callable[..., Awaitable[Any]]


def duplicate_message(worker_id: str) -> str:
    return (
        f"another process runs with worker_id {worker_id!r} (it keeps publishing its status); "
        "every worker needs a distinct worker_id"
    )


def note_duplicate(health: Health, worker_id: str, other: str | None) -> None:
    """Tell health whether a status publish found another process under our id (logged once)."""
    if other is None:
        health.duplicate_worker = None
        return
    message = duplicate_message(worker_id)
    if health.duplicate_worker is None:
        log.error("worker %s: %s", worker_id, message)
    health.duplicate_worker = message


class StartingWorker(Protocol):
    """What the duplicate-id check reads of the starting worker (the worker is one)."""

    @property
    def cfg(self) -> WorkerConfig: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def timing(self) -> LeaseTiming: ...
    @property
    def store(self) -> LeaseStore: ...
    @property
    def instance(self) -> str: ...
    @property
    def sleep(self) -> AsyncSleep: ...
    @property
    def status_writer(self) -> coordination.StatusWriter: ...


async def unique_worker_id(worker: StartingWorker, io: Io) -> None:
    """Raise DuplicateWorkerError if another live process publishes under ``worker``'s id. A
    record written lately by another instance may be a previous run that crashed: wait until
    that process would have written again, and look again; only a record that moved meanwhile
    is a live duplicate."""
    cfg, clock, interval = worker.cfg, worker.clock, worker.timing.lease_duration
    status = await io(coordination.worker_status, worker.store, cfg.worker_id)
    if not coordination.published_by_another(status, worker.instance, clock.wall(), 3 * interval):
        return
    age = clock.wall() - float(status.get("updated_at", 0.0))
    wait = rewrite_wait(age, coordination.live_for(status, 0.0), interval)
    log.info("worker %s: a process with this worker id published its status %.0fs ago; waiting "
             "%.0fs to see whether it still runs", cfg.worker_id, age, wait)  # fmt: skip
    await worker.sleep(wait)
    again = await io(coordination.worker_status, worker.store, cfg.worker_id)
    if again.get("updated_at") != status.get("updated_at"):
        raise coordination.DuplicateWorkerError(duplicate_message(cfg.worker_id))
    worker.status_writer.ignore(str(status.get("instance")))  # a crashed run: no twin


def rewrite_wait(age: float, declared: float, interval: float) -> float:
    """How long to wait for a running process to write its status record again, its record
    ``age`` seconds old: one control round and a second; a record that says it holds for
    ``declared`` seconds (a worker holding leases writes a quiet status every ``declared -
    interval - skew``) may be rewritten only that long after it was written."""
    wait = interval + 1
    if declared > 0:
        wait = max(wait, min(declared - interval - age + 1, declared))
    return wait
