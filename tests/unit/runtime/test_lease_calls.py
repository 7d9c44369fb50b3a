"""A lease's lease-table calls never wait behind processor calls: those run on the event loop's
default executor, whose threads may all be in calls that block (a Spark sink applying
backpressure on many leases)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from checkpoint.base.clock import ManualClock
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.runtime.tenure import Tenure
from tests.unit.leasing.test_holder import DURATION, KEY, stored, take


def test_a_release_does_not_wait_for_a_processor_thread() -> None:
    clock = ManualClock()
    table = MemoryLeaseTable()
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    tenure = Tenure(holder.add_taken(take(table, "worker-a")), holder, table,
                    sleep=clock.sleep, clock=clock)  # fmt: skip
    gate = threading.Event()

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))
        busy = [loop.run_in_executor(None, gate.wait, 30.0) for _ in range(2)]
        try:
            return await asyncio.wait_for(tenure.release("a test"), 5.0)
        finally:
            gate.set()
            await asyncio.gather(*busy)

    assert asyncio.run(scenario()) is True
    assert stored(table, KEY).lease_owner is None
