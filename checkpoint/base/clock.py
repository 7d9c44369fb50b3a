"""Time as an injected dependency, so lease expiry and parking are testable without sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

# How asyncio code waits: ``asyncio.sleep`` in production, a clock's ``sleep`` in tests.
AsyncSleep = Callable[[float], Awaitable[None]]


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch (for values that other machines read, like reopen times)."""
        ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for tests."""

    def __init__(self, start: float = 1_000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._mono = start
        self._wall = wall_start

    def monotonic(self) -> float:
        return self._mono

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._mono += seconds
        self._wall += seconds

    async def sleep(self, seconds: float) -> None:
        """An AsyncSleep that moves this clock instead of waiting (and lets other tasks run)."""
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
