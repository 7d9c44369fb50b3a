"""A lease that started at LATEST: its first owner writes a piece and dies before the commit.

The lease keeps where its first read began (5 s before it), so the next owner reads from before
the first owner's first record (runtime/resume.py: "duplicates of records just before the start
are possible"). The re-formed piece must start at its own first record (replays.py
``Replays._from_first``; the executor path pins it: ranges.py ReadRange.window): taking the
earlier records too gave it another piece id and batch id, and an idempotent sink wrote its
records twice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from checkpoint.base.clock import ManualClock
from checkpoint.base.retry import RetryPolicy
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import LATEST, ExtendedSequenceNumber
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.processor import Record
from kclpy_spark.spark.micro_batcher import BatcherSettings, MicroBatcher
from kclpy_spark.spark.pieces import Piece, records_to_chunk
from kclpy_spark.spark.sink_batch import SinkBatch

SHARD = "shardId-000000000000"
NO_RETRY = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=1)


def records(first: int, count: int) -> list[Record]:
    return [Record(f"r{i}".encode(), f"k{i}", str(i * 10)) for i in range(first, first + count)]


class PieceStore:
    """Idempotent per piece, as ParquetSink: a piece id already stored is skipped. ``crash``:
    publish, then fail (the worker is killed between the publish and the commit)."""

    idempotent_per_piece = True

    def __init__(self) -> None:
        self.pieces: dict[str, list[str]] = {}
        self.batch_ids: list[int] = []
        self.crash = False

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def write(self, batch: SinkBatch) -> None:
        self.batch_ids.append(batch.batch_id)
        assert batch.table is not None
        for piece in batch.pieces:
            if piece.piece_id not in self.pieces:
                rows = batch.piece_table(piece).column("sequence_number").to_pylist()
                self.pieces[piece.piece_id] = rows
        if self.crash:
            raise RuntimeError("kill -9 after the publish, before the commit")

    def all_rows(self) -> list[str]:
        return sorted((r for rows in self.pieces.values() for r in rows), key=int)


def owner(table: MemoryLeaseTable, clock: ManualClock, sink: PieceStore, worker: str):
    holder = LeaseHolder(table, worker, clock, 1e9)
    lease = table.get_lease(SHARD)
    assert lease is not None
    taken = table.take_lease(lease, worker)
    assert taken is not None
    held = holder.add_taken(taken)
    cp = Checkpointer(holder, SHARD, held.token, taken.checkpoint, retry_policy=NO_RETRY)
    batcher = MicroBatcher(
        sink,
        BatcherSettings(max_records=100, max_wait=1.0, max_attempts=1),
        clock=clock,
        sleep=lambda s: None,
        threaded=False,
    )
    lane = batcher.open_lane(SHARD, SHARD, cp, taken.checkpoint)
    return cp, batcher, lane


def deliver(cp: Checkpointer, batcher: MicroBatcher, lane: Any, recs: list[Record]) -> None:
    cp.set_largest_permitted(ExtendedSequenceNumber(recs[-1].sequence_number))
    batcher.add(lane, records_to_chunk(recs, "stream", SHARD))


def test_a_piece_of_a_lease_started_at_latest_is_written_once_after_a_crash() -> None:
    table, clock, sink = MemoryLeaseTable(), ManualClock(), PieceStore()
    # What pin_start leaves: the checkpoint LATEST, the first read's start - 5 s stored beside.
    table.create_lease_if_absent(Lease(SHARD, LATEST, start_timestamp=1_700_000_000.0))
    # Worker A: its first read (at LATEST) began at r5; it writes r5..r8 and dies before the commit.
    cp, batcher, lane = owner(table, clock, sink, "worker-a")
    sink.crash = True
    deliver(cp, batcher, lane, records(5, 4))
    clock.advance(1.0)
    batcher.step()
    lease = table.get_lease(SHARD)
    assert lease is not None and lease.checkpoint == LATEST
    assert lease.pending_checkpoint == ExtendedSequenceNumber("80")
    # Worker B takes the lease: AT_TIMESTAMP(first read - 5 s) also returns r3 and r4.
    sink.crash = False
    cp, batcher, lane = owner(table, clock, sink, "worker-b")
    deliver(cp, batcher, lane, records(3, 8))
    clock.advance(1.0)
    batcher.run_until_idle()
    # r5..r8 once, under their first id; r9, r10 after them; r3, r4 (before the lease's LATEST
    # start) left out; the checkpoint over everything written.
    assert sink.all_rows() == [str(i * 10) for i in range(5, 11)], sink.pieces
    assert sink.batch_ids[0] == sink.batch_ids[1]  # the piece re-formed with its id
    lease = table.get_lease(SHARD)
    assert lease is not None and lease.checkpoint == ExtendedSequenceNumber("100")
