"""Drive a MicroBatcher the way the worker does, without Kinesis: real Checkpointers over a
MemoryLeaseTable, records delivered in order per lease. Not a test module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.base.retry import RetryPolicy
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.processor import Record
from kclpy_spark.spark.lane import Lane
from kclpy_spark.spark.micro_batcher import MicroBatcher
from kclpy_spark.spark.pieces import records_to_chunk

NO_RETRY = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=1)


def make_records(first: int, count: int, size: int = 20) -> list[Record]:
    """Records numbered first..first+count-1; sequence number = 1000 * number."""
    return [
        Record(f"{i:0{size}d}".encode(), f"key-{i}", str(i * 1000), 0, 1_700_000_000_000 + i)
        for i in range(first, first + count)
    ]


class LeaseEnv:
    def __init__(self, shards: Sequence[str], clock: Clock | None = None) -> None:
        self.table = MemoryLeaseTable()
        self.clock = clock or SystemClock()
        for shard in shards:
            self.table.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
        self.new_worker("worker-a")
        self.cps: dict[str, Checkpointer] = {}
        self.lanes: dict[str, Lane] = {}

    def new_worker(self, name: str) -> None:
        """A new holder, as a restarted worker or another worker after a crash."""
        self.holder = LeaseHolder(self.table, name, self.clock, 1e9)

    def take(self, batcher: MicroBatcher, shard: str) -> Lane:
        lease = self.table.get_lease(shard)
        assert lease is not None
        taken = self.table.take_lease(lease, self.holder.worker_id)
        assert taken is not None
        held = self.holder.add_taken(taken)
        cp = Checkpointer(self.holder, shard, held.token, taken.checkpoint, retry_policy=NO_RETRY)
        self.cps[shard] = cp
        self.lanes[shard] = batcher.open_lane(shard, shard, cp, taken.checkpoint)
        return self.lanes[shard]

    def deliver(self, batcher: MicroBatcher, shard: str, records: list[Record]) -> None:
        last = records[-1]
        self.cps[shard].set_largest_permitted(
            ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)
        )
        batcher.add(self.lanes[shard], records_to_chunk(records, "stream", shard))

    def checkpoint(self, shard: str) -> ExtendedSequenceNumber:
        lease = self.table.get_lease(shard)
        assert lease is not None
        return lease.checkpoint

    def checkpoint_number(self, shard: str) -> int:
        """The checkpoint as a record number (0 before the first record)."""
        cp = self.checkpoint(shard)
        return 0 if cp.is_sentinel else int(cp.sequence_number) // 1000


def written_numbers(path: Any, shard: str | None = None) -> list[int]:
    """Record numbers in a Parquet sink's output (read with pyarrow: no Spark job)."""
    import pyarrow.dataset as ds

    try:
        table = ds.dataset(str(path), format="parquet", partitioning="hive").to_table(
            columns=["shard_id", "sequence_number"]
        )
    except (FileNotFoundError, ValueError):
        return []
    shards = table.column("shard_id").to_pylist()
    seqs = table.column("sequence_number").to_pylist()
    return [int(q) // 1000 for s, q in zip(shards, seqs, strict=True) if shard in (None, s)]
