"""Lease-table calls a lease's consumer makes (releasing, parking, finishing, handing over,
reading its parents' and its own lease back, creating its children's leases), on threads of
their own.

They ran on the event loop's default executor, which also runs every processor call: with that
pool's threads all in processor calls that block (a Spark sink applying backpressure on many
leases), a release, a park or a hand-over waited for one of them to return. Here they never wait
behind a processor; at most ``LEASE_CALL_THREADS`` run at once (each with its store's deadline).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

from checkpoint.base.threads import RetiringThreadPool

T = TypeVar("T")

LEASE_CALL_THREADS = 16
_POOL = RetiringThreadPool(LEASE_CALL_THREADS, "kclpy-spark-lease-calls")


async def run_on(executor: Executor, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on ``executor``'s threads, with this task's logging context."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(executor, call)


async def lease_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on the lease-call threads, with this task's logging context."""
    return await run_on(_POOL, fn, *args, **kwargs)
