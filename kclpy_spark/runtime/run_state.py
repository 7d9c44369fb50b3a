"""Whether a worker runs on: suspended (it follows the application's suspend flag) and stopping
(a shutdown was requested: a signal, a job whose leases are all caught up, a dependency gone too
long). The worker owns it and makes every change; its lease loops read it (``may_take``), and a
job's end asks it to stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)


class RunView(Protocol):
    """The run state as the lease loops and the status see it: read, and a stop asked for."""

    @property
    def suspended(self) -> bool: ...
    @property
    def resumed_at(self) -> float: ...
    @property
    def may_take(self) -> bool: ...
    def stop(self, why: str) -> None: ...


class RunState:
    def __init__(self, worker_id: str, monotonic: Callable[[], float]) -> None:
        self._worker_id = worker_id
        self._monotonic = monotonic
        self._stopping = asyncio.Event()
        self._suspended = False
        self._resumed_at = float("-inf")  # monotonic: when the last suspension ended

    @property
    def suspended(self) -> bool:
        return self._suspended

    @property
    def resumed_at(self) -> float:
        return self._resumed_at

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def may_take(self) -> bool:
        """Whether a lease just taken may get a consumer (not suspended, not stopping)."""
        return not self._suspended and not self._stopping.is_set()

    def suspend(self) -> bool:
        """Suspended from now; True if it was not already."""
        was, self._suspended = self._suspended, True
        return not was

    def resume(self) -> bool:
        """Running again from now (dated by the monotonic clock); True if it was suspended."""
        if not self._suspended:
            return False
        self._suspended, self._resumed_at = False, self._monotonic()
        return True

    def stop(self, why: str) -> None:
        """Ask the worker to stop (once asked, it stays asked)."""
        if not self._stopping.is_set():
            log.info("worker %s: shutdown requested (%s)", self._worker_id, why)
        self._stopping.set()

    async def stopped(self) -> None:
        """Returns once a stop has been asked."""
        await self._stopping.wait()
