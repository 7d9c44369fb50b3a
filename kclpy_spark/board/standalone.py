"""``kclpy-spark status --serve [HOST:]PORT``: the status page for a machine that runs no worker.

Every ``every`` seconds it reads the lease table and the records the lease owners publish (one
scan and a read per owner: choose ``every`` with the table's cost in mind) and serves what it saw.
Read-only, like the page in the daemon. It stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

from checkpoint import coordination
from checkpoint.base.errors import ConfigError, KclpySparkError
from checkpoint.lease import Lease
from kclpy_spark.board.model import Board
from kclpy_spark.board.routes import add_routes, host_guard
from kclpy_spark.logs import redact
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.runtime.metrics import IDLE_CONNECTION_SECONDS

log = logging.getLogger(__name__)

FORGET_WORKERS_AFTER = 3600.0  # a worker silent this long leaves the page


def parse_address(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT``; the host defaults to 127.0.0.1 (this machine only)."""
    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ConfigError(f"--serve: expected PORT or HOST:PORT, got {text!r}")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:8080
    return (host if sep and host else "127.0.0.1"), number


class Look:
    """One look at the application: its leases, its workers' records, the suspend flag."""

    def __init__(self, store: LeaseStore) -> None:
        self._store = store

    def __call__(self) -> tuple[list[Lease], dict[str, Any], bool]:
        """Every worker's record, those holding no lease too (spare, suspended), in one read;
        a worker silent for an hour leaves the page."""
        table = self._store.scan_table(coordination.WORKER_PREFIX)
        now = time.time()
        statuses = {
            worker: status
            for worker, status in sorted(coordination.worker_statuses(table.records).items())
            if isinstance(updated := status.get("updated_at"), int | float)
            and now - updated <= FORGET_WORKERS_AFTER
        }
        return list(table.leases), statuses, coordination.is_suspended(self._store)


async def serve(
    board: Board, look: Look, host: str, port: int, every: float, names: tuple[str, ...] = ()
) -> None:
    from aiohttp import web

    from kclpy_spark.runtime.http_site import CappedSite, status_runner

    error: list[str] = []

    async def snapshot() -> dict[str, Any]:
        return {**board.snapshot(), "error": error[0] if error else None}

    app = web.Application(middlewares=[host_guard(names)])
    add_routes(app, snapshot)
    runner = status_runner(app, IDLE_CONNECTION_SECONDS)
    await runner.setup()
    site = CappedSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        why = exc.strerror or exc
        raise ConfigError(f"--serve: cannot listen on {host}:{port}: {why}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bound = site.sockets[0].getsockname()[1] if site.sockets else port
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    print(f"status page on http://{shown}:{bound}/ (read-only; Ctrl-C stops)", flush=True)
    try:
        while not stop.is_set():
            try:
                leases, statuses, suspended = await asyncio.to_thread(look)
                board.observe(leases, statuses, time.time(), suspended=suspended)
                error.clear()
            except KclpySparkError as exc:
                log.warning("status page: cannot read the lease table: %s", exc)
                error[:] = [redact(str(exc))]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
    finally:
        await runner.cleanup()
