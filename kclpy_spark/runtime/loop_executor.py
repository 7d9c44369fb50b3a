"""The event loop's default executor, in two pools: processor code's threads and the worker's own.

Everything that runs a blocking call "in the default executor" shares it: a processor's plain
methods (``tenure.call_processor``), ``asyncio.to_thread`` in an ``async def`` processor, and the
worker's own work and its libraries' (KPL splits, the stream watcher's describes, aiohttp's DNS
lookups for every Kinesis read, the SDK's TLS set-up). With one pool, processor calls that never
returned (a stuck sink on every lease) took every thread, and the healthy shards' reads then waited
for a DNS lookup that never got one. Here a call made while processor code runs (``processor_code``,
a context variable, so it follows the code into the tasks and threads it starts) goes to the
processor pool, every other call to the worker's own pool: however many processor calls hang, the
worker's threads stay free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TypeVar

from checkpoint.base.threads import RetiringThreadPool

T = TypeVar("T")

# The worker's own blocking calls at a time: DNS lookups, KPL splits (one page at a time per
# lease), describes. Past it they wait their turn; none waits on a processor.
OWN_THREADS = 32

_IN_PROCESSOR: ContextVar[bool] = ContextVar("kclpy_spark_in_processor", default=False)


@contextlib.contextmanager
def processor_code() -> Iterator[None]:
    """Within it (and in the tasks and threads started from it, which copy the context),
    the loop's default executor runs calls on the processor pool."""
    token = _IN_PROCESSOR.set(True)
    try:
        yield
    finally:
        _IN_PROCESSOR.reset(token)


class LoopExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor (what ``set_default_executor`` takes) without threads of its own:
    each call goes to ``processors`` within ``processor_code``, else to ``own``."""

    def __init__(self, processors: RetiringThreadPool, own: RetiringThreadPool) -> None:
        super().__init__(max_workers=1)  # never starts a thread: submit is ours
        self.processors = processors
        self.own = own

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        pool = self.processors if _IN_PROCESSOR.get() else self.own
        return pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.processors.shutdown(wait=wait, cancel_futures=cancel_futures)
        self.own.shutdown(wait=wait, cancel_futures=cancel_futures)
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    def abandon(self, grace: float) -> int:
        """Both pools abandoned after at most ``grace`` seconds in all (``abandon``); how many
        processor calls were left running (the worker's own calls end by their deadlines)."""
        left = self.processors.abandon(grace)
        self.own.abandon(0.0)
        return left


def install(loop: asyncio.AbstractEventLoop, processor_threads: int) -> LoopExecutor:
    """``loop``'s default executor from now on: processor code's calls on a pool of at most
    ``processor_threads``, the worker's own on one of ``OWN_THREADS``."""
    threads = LoopExecutor(
        RetiringThreadPool(processor_threads, "kclpy-spark"),
        RetiringThreadPool(OWN_THREADS, "kclpy-spark-io"),
    )
    loop.set_default_executor(threads)
    return threads
