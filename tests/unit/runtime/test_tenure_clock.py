"""A tenure runs on the worker's clock: its checkpointer times each write with it (the
``kclpy_spark_checkpoint_seconds`` figure), and a parked lease reopens by its wall time."""

from __future__ import annotations

import asyncio

from checkpoint.base.clock import ManualClock
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.runtime.tenure import Tenure
from tests.unit.leasing.test_holder import DURATION, KEY, stored, take


class SlowCheckpoints(MemoryLeaseTable):
    """Each checkpoint write takes 0.25 s of the manual clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        self.clock.advance(0.25)
        return super().update_checkpoint(lease, checkpoint, pending)


def test_the_checkpointer_times_its_writes_on_the_tenures_clock() -> None:
    clock = ManualClock()
    table = SlowCheckpoints(clock)
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = holder.add_taken(take(table, "worker-a"))
    seconds: list[float] = []
    tenure = Tenure(
        held, holder, table, sleep=clock.sleep, clock=clock, on_checkpoint=seconds.append
    )
    tenure.checkpointer.set_largest_permitted(ExtendedSequenceNumber("7"))
    tenure.checkpointer.checkpoint()
    assert seconds == [0.25]  # the manual clock's time, not the machine's
    assert stored(table).checkpoint == ExtendedSequenceNumber("7")


def test_a_parked_lease_reopens_by_the_tenures_wall_clock() -> None:
    clock = ManualClock(wall_start=5_000.0)
    table = MemoryLeaseTable()
    holder = LeaseHolder(table, "worker-a", clock, DURATION)
    held = holder.add_taken(take(table, "worker-a"))
    tenure = Tenure(held, holder, table, sleep=clock.sleep, clock=clock)
    asyncio.run(tenure.park("test", 60.0))
    assert stored(table, KEY).closed_until == 5_060.0
