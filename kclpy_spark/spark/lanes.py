"""One lease's place in the micro-batcher: its buffered records and the piece being written.

Pure bookkeeping, no I/O and no locking (the batcher holds its lock around every call).

Replay stability: a piece is always cut at a record boundary the batcher chose and wrote as the
lease's pending checkpoint before the write. A lane opened on a lease whose pending checkpoint is
set starts in *recovery*: its first piece is cut exactly at that position, whatever the size
limits, so it has the same key, id and content as the piece that was being written.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from checkpoint.acks import AckHandle, AckTracker
from checkpoint.checkpointer import PreparedCheckpoint
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.pieces import Chunk, Piece, PieceKey

log = logging.getLogger(__name__)


class TwoPhaseCheckpointer(Protocol):
    """What the sink needs of a lease's checkpointer (``checkpoint.checkpointer.Checkpointer``)."""

    lease_key: str

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None: ...

    def prepare_checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int | None = None,
        application_state: bytes | None = None,
    ) -> PreparedCheckpoint: ...

    @property
    def pending_checkpoint(self) -> tuple[ExtendedSequenceNumber, bytes | None] | None: ...


class LaneState(enum.Enum):
    ACTIVE = "active"
    PARKED = "parked"  # the sink gave up on a batch; the lease is to be parked (or re-armed)
    CLOSED = "closed"  # lease lost or handed over: buffered records are dropped


@dataclass
class Recovery:
    """The first piece must end exactly at ``target`` (it was being written before)."""

    target: ExtendedSequenceNumber
    group: tuple[PieceKey, ...] = ()
    token: Any = None
    ready_chunks: int | None = None  # chunks forming the piece once ``target`` was reached
    since: float = 0.0  # monotonic time the lane entered recovery


@dataclass
class InFlight:
    """The piece of this lane in a batch being written."""

    piece: Piece
    chunks: list[Chunk]
    recovery: Recovery | None  # set if the piece was re-formed from a pending checkpoint
    prepared: PreparedCheckpoint | None = None
    handle: AckHandle | None = None


@dataclass(eq=False)
class Lane:
    lease_key: str
    shard_id: str
    checkpointer: TwoPhaseCheckpointer
    tracker: AckTracker
    recovery: Recovery | None = None
    state: LaneState = LaneState.ACTIVE
    chunks: deque[Chunk] = field(default_factory=deque)
    rows: int = 0
    nbytes: int = 0
    oldest: float | None = None  # monotonic time the oldest buffered record arrived
    forced: bool = False  # flush without waiting (shard end, shutdown)
    inflight: InFlight | None = None
    uncommitted: InFlight | None = None  # written, but its checkpoint commit must be retried
    commit_retry_at: float = 0.0
    park_reason: str = ""

    # --- buffering -------------------------------------------------------------------------------

    def add(self, chunk: Chunk, now: float) -> None:
        """Buffer ``chunk`` (the next records of the lease, in order)."""
        rec = self.recovery
        if rec is None or rec.ready_chunks is not None:
            self._append(chunk, now)
            return
        inside = chunk.count_up_to(rec.target)
        if inside == chunk.rows:
            self._append(chunk, now)
            if chunk.last == rec.target:
                self._mark_ready()
            return
        # The chunk goes past the recovery target: cut there.
        if inside > 0:
            head, chunk = chunk.split(inside)
            self._append(head, now)
        self._mark_ready()
        self._append(chunk, now)

    def _append(self, chunk: Chunk, now: float) -> None:
        self.chunks.append(chunk)
        self.rows += chunk.rows
        self.nbytes += chunk.nbytes
        if self.oldest is None:
            self.oldest = now

    def _mark_ready(self) -> None:
        rec = self.recovery
        assert rec is not None
        rec.ready_chunks = len(self.chunks)
        if rec.ready_chunks == 0:
            log.warning(
                "lease %s: the records up to its pending checkpoint %s are gone (trimmed?); "
                "the range cannot be re-formed and is skipped",
                self.lease_key,
                rec.target,
            )
            self.recovery = None
            return
        last = self.chunks[rec.ready_chunks - 1].last
        if last != rec.target:
            log.warning(
                "lease %s: pending checkpoint %s is not a record position delivered again "
                "(last at or before it: %s); the re-formed piece differs from the original",
                self.lease_key,
                rec.target,
                last,
            )

    def force_recovery_cut(self) -> None:
        """No more records will come (shard end): cut the recovery piece at what is buffered."""
        rec = self.recovery
        if rec is not None and rec.ready_chunks is None:
            self._mark_ready()

    # --- pieces ----------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing buffered, nothing being written, nothing left to commit."""
        return not self.chunks and self.inflight is None and self.uncommitted is None

    @property
    def recovery_ready(self) -> bool:
        return self.recovery is not None and self.recovery.ready_chunks is not None

    def can_start(self) -> bool:
        """May a piece of this lane join a new batch now?"""
        return (
            self.state is LaneState.ACTIVE
            and self.inflight is None
            and self.uncommitted is None
            and self.rows > 0
            and (self.recovery is None or self.recovery.ready_chunks is not None)
        )

    def recovery_key(self) -> PieceKey | None:
        rec = self.recovery
        if rec is None or rec.ready_chunks is None:
            return None
        last = self.chunks[rec.ready_chunks - 1].last
        return PieceKey(self.lease_key, self.chunks[0].first, last)

    def take(self, max_rows: int, max_bytes: int) -> InFlight:
        """Cut the next piece (exactly the recovery range if in recovery, else at most
        ``max_rows``/``max_bytes`` but at least one record) and mark it in flight."""
        assert self.can_start()
        rec = self.recovery
        taken: list[Chunk] = []
        rows = nbytes = 0
        if rec is not None:
            assert rec.ready_chunks is not None
            taken = [self.chunks.popleft() for _ in range(rec.ready_chunks)]
            rows = sum(c.rows for c in taken)
            nbytes = sum(c.nbytes for c in taken)
            self.recovery = None
        else:
            while self.chunks and rows < max_rows:
                chunk = self.chunks[0]
                fit = min(max_rows - rows, chunk.rows)
                if nbytes + chunk.nbytes > max_bytes:
                    per_row = max(1, chunk.nbytes // chunk.rows)
                    fit = min(fit, (max_bytes - nbytes) // per_row)
                    if fit <= 0:
                        if rows:
                            break
                        fit = 1  # a single record larger than the limit still goes alone
                if fit < chunk.rows:
                    chunk, self.chunks[0] = chunk.split(fit)
                else:
                    self.chunks.popleft()
                taken.append(chunk)
                rows += chunk.rows
                nbytes += chunk.nbytes
        self._recount()
        key = PieceKey(self.lease_key, taken[0].first, taken[-1].last)
        self.inflight = InFlight(Piece(key, self.shard_id, rows), taken, rec)
        return self.inflight

    def requeue(
        self, flight: InFlight, group: tuple[PieceKey, ...], token: Any, now: float
    ) -> None:
        """Put a piece that was not written back at the head, to be re-formed exactly (its
        pending checkpoint may be stored already)."""
        for chunk in reversed(flight.chunks):
            self.chunks.appendleft(chunk)
        self._recount()
        self.oldest = now if self.oldest is None else self.oldest
        self.recovery = Recovery(
            flight.piece.key.last, group, token, ready_chunks=len(flight.chunks), since=now
        )
        if self.inflight is flight:
            self.inflight = None

    def _recount(self) -> None:
        self.rows = sum(c.rows for c in self.chunks)
        self.nbytes = sum(c.nbytes for c in self.chunks)
        if not self.chunks:
            self.oldest = None

    def drop(self) -> None:
        """Forget buffered records (the next owner reads them again from the checkpoint)."""
        self.chunks.clear()
        self.rows = self.nbytes = 0
        self.oldest = None
        self.recovery = None
