"""The loop's default executor in two pools: processor calls that never return must not take the
threads the worker's own blocking calls need (DNS lookups for every Kinesis read, KPL splits,
describes). Before, the processor pool was the default executor: with every processor thread
hung, a healthy shard's read waited for a DNS lookup that never got a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kclpy_spark.runtime import loop_executor
from kclpy_spark.runtime.tenure import call_processor


@pytest.fixture
def hang() -> Iterator[threading.Event]:
    release = threading.Event()
    yield release
    release.set()


def _thread_name() -> str:
    return threading.current_thread().name


def test_hung_processor_calls_leave_the_workers_own_calls_their_threads(
    hang: threading.Event,
) -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        threads = loop_executor.install(loop, processor_threads=2)
        started: list[str] = []

        def stuck(_: object) -> None:
            started.append(_thread_name())
            hang.wait(30)

        calls = [
            asyncio.ensure_future(call_processor(stuck, None, lambda _: None)) for _ in range(3)
        ]
        while len(started) < 2:  # every processor thread taken, the third call queued
            await asyncio.sleep(0.01)
        assert all(name.startswith("kclpy-spark_") for name in started)
        # The worker's own calls: a KPL split's way (asyncio.to_thread), a DNS lookup.
        own = await asyncio.wait_for(asyncio.to_thread(_thread_name), 5)
        assert own.startswith("kclpy-spark-io_")
        await asyncio.wait_for(loop.getaddrinfo("127.0.0.1", 80), 5)
        assert len(started) == 2  # the queued processor call still waits its turn
        hang.set()
        await asyncio.wait_for(asyncio.gather(*calls), 5)
        assert len(started) == 3
        threads.shutdown(wait=True)

    asyncio.run(go())


def test_what_processor_code_runs_in_threads_stays_on_the_processor_pool() -> None:
    """``asyncio.to_thread`` in an ``async def`` processor, and in a task it starts, is the
    processor's work: it waits behind the processor pool, not in the worker's."""
    seen: dict[str, str] = {}

    async def processor_method(_: object) -> None:
        seen["to_thread"] = await asyncio.to_thread(_thread_name)
        seen["task"] = await asyncio.create_task(asyncio.to_thread(_thread_name))

    def plain_method(_: object) -> None:
        seen["plain"] = _thread_name()

    async def go() -> None:
        threads = loop_executor.install(asyncio.get_running_loop(), processor_threads=2)
        await call_processor(processor_method, None, lambda _: None)
        await call_processor(plain_method, None, lambda _: None)
        seen["after"] = await asyncio.to_thread(_thread_name)  # outside processor code again
        threads.shutdown(wait=True)

    asyncio.run(go())
    assert {k: v.split("_")[0] for k, v in seen.items()} == {
        "to_thread": "kclpy-spark",
        "task": "kclpy-spark",
        "plain": "kclpy-spark",
        "after": "kclpy-spark-io",
    }


def test_abandon_leaves_a_hung_processor_call_and_counts_it(hang: threading.Event) -> None:
    async def go() -> int:
        threads = loop_executor.install(asyncio.get_running_loop(), processor_threads=1)
        running = threading.Event()

        def stuck(_: object) -> None:
            running.set()
            hang.wait(30)

        call = asyncio.ensure_future(call_processor(stuck, None, lambda _: None))
        await asyncio.to_thread(running.wait, 5)
        left = threads.abandon(0.05)
        call.cancel()
        # As the daemon does: asyncio.run's close joins the default executor's threads.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        return left

    assert asyncio.run(go()) == 1
