"""Tells of an event loop that was blocked: renewal rounds are scheduled on it, and an ``async
def`` processor method that sleeps, does blocking I/O or calls ``checkpoint()`` instead of
``acheckpoint()`` holds every lease's renewal back (about half the failover time loses them)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from checkpoint.base.clock import Clock

log = logging.getLogger(__name__)

INTERVAL = 0.5  # seconds between two looks at whether the loop keeps time


async def watch_the_loop(
    clock: Clock,
    sleep: Callable[[float], Awaitable[None]],
    *,
    lease_duration: float,
    on_stall: Callable[[], None],
    worker_id: str,
) -> None:
    """Sleep ``INTERVAL`` again and again; a wake-up a quarter of ``lease_duration`` late (the
    loop ran nothing else meanwhile) is a WARNING and an ``on_stall()``."""
    limit = lease_duration / 4
    while True:
        began = clock.monotonic()
        await sleep(INTERVAL)
        late = clock.monotonic() - began - INTERVAL
        if late >= limit:
            on_stall()
            log.warning(
                "worker %s: the event loop was blocked for %.1f s (an async processor method "
                "that blocks? use a plain method or await asyncio.to_thread); renewals wait for "
                "it, and leases are lost at about half the failover time (%.0f s)",
                worker_id, late, lease_duration,
            )  # fmt: skip
