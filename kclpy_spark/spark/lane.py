"""One lease's lane in the micro-batcher: the one owner of its state and of every transition.

A lane buffers the lease's records (``Chunk``s, in order) and hands out *cuts*: the next records to
write, at most one at a time (a second cut's pending checkpoint would overwrite the one that makes
the first replayable). A cut is prepared (its pending checkpoint written), written, then committed
(the checkpoint moves to its end); or put back at the head of the buffer to be re-formed exactly.

States: ACTIVE (buffering and cutting), PARKED (the sink gave up on a cut: the lease must be parked
by its consumer, or re-armed at shard end), CLOSED (lease lost or handed over: the buffer is
dropped, nothing is committed any more). A lane opened on a lease whose pending checkpoint is set
*replays*: its first cut ends exactly at that position, whatever the size limits, so it has the
same key, id and content as the cut that was being written before.

Pure bookkeeping: no I/O, no locking (the batcher holds its lock around every call). The
MicroBatcher only ever changes a lane through these methods.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import PreparedCheckpoint
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.pieces import Chunk, Piece, PieceKey

log = logging.getLogger(__name__)


class SinkParkedError(KclpySparkError):
    """The sink gave up on a batch of this lease; raised from ``process_records`` so the consumer
    parks the lease (its records are redelivered from the checkpoint when it reopens)."""


class LaneClosedError(KclpySparkError):
    """The lease's lane was closed (lease lost or handed over)."""


class BatcherClosedError(KclpySparkError):
    """The whole batcher was closed (the worker is stopping): nothing more can be buffered."""


class DrainResult(enum.Enum):
    # Everything buffered was written and checkpointed; or, not final, nothing can be flushed
    # yet (a re-formed piece still waiting for its records is left for the next owner).
    DONE = "done"
    PARKED = "parked"  # the sink gave up on a batch
    CLOSED = "closed"  # the lease was lost
    TIMEOUT = "timeout"


class LaneState(enum.Enum):
    ACTIVE = "active"
    PARKED = "parked"
    CLOSED = "closed"


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

    def worker_holds(self, lease_key: str) -> bool: ...


@dataclass(eq=False)
class Cut:
    """Records cut from a lane for one batch: what the sink sees of them (``piece``), their
    Arrow chunks, and where their write stands."""

    piece: Piece
    chunks: list[Chunk]
    replayed: bool = False  # re-formed from a pending checkpoint: its token is the stored one
    token: Any = None  # the sink's token for this lease in the batch
    prepared: PreparedCheckpoint | None = None  # set once its pending checkpoint is written

    @property
    def key(self) -> PieceKey:
        return self.piece.key

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


@dataclass
class _Replay:
    """The first cut must end exactly at ``target`` (it was being written before)."""

    target: ExtendedSequenceNumber
    group: tuple[PieceKey, ...]  # every piece of the batch it was written in
    token: Any
    since: float  # monotonic time the lane started replaying
    ready_chunks: int | None = None  # chunks forming the cut once ``target`` was reached
    # Its pending checkpoint (and so its token) is stored: the re-formed cut keeps the token.
    # A cut put back before its pending checkpoint was written gets a fresh token instead.
    stored: bool = True


class Lane:
    def __init__(
        self,
        lease_key: str,
        shard_id: str,
        checkpointer: TwoPhaseCheckpointer,
        *,
        replay: tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any] | None = None,
        now: float = 0.0,
    ) -> None:
        self.lease_key = lease_key
        self.shard_id = shard_id
        self.checkpointer = checkpointer
        self._state = LaneState.ACTIVE
        self.park_reason = ""
        self._chunks: deque[Chunk] = deque()
        self.rows = 0
        self.nbytes = 0
        self.oldest: float | None = None  # monotonic time the oldest buffered record arrived
        self.forced = False  # flush without waiting (shard end, shutdown)
        self._replay = None if replay is None else _Replay(*replay, since=now)
        self.out: Cut | None = None  # the cut being written, or written and not yet committed
        self.commit_due_at: float | None = None  # set while the out cut's commit must be retried

    @property
    def state(self) -> LaneState:
        return self._state

    # --- questions -------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing buffered and nothing out."""
        return not self._chunks and self.out is None

    @property
    def replaying(self) -> bool:
        return self._replay is not None

    @property
    def replay_ready(self) -> bool:
        """Replaying, and every record of the cut to re-form has arrived."""
        return self._replay is not None and self._replay.ready_chunks is not None

    @property
    def replay_group(self) -> tuple[PieceKey, ...]:
        return () if self._replay is None else self._replay.group

    @property
    def replay_since(self) -> float | None:
        return None if self._replay is None else self._replay.since

    def replay_key(self) -> PieceKey | None:
        """The key of the cut being re-formed, once all its records are here."""
        rep = self._replay
        if rep is None or rep.ready_chunks is None:
            return None
        return PieceKey(
            self.lease_key, self._chunks[0].first, self._chunks[rep.ready_chunks - 1].last
        )

    def can_cut(self) -> bool:
        """May a cut of this lane join a new batch now?"""
        return (
            self._state is LaneState.ACTIVE
            and self.out is None
            and self.rows > 0
            and (self._replay is None or self._replay.ready_chunks is not None)
        )

    def drained(self, final: bool) -> DrainResult | None:
        """What a drain of this lane has come to, or None while it must go on."""
        if self._state is LaneState.CLOSED:
            return DrainResult.CLOSED
        if self._state is LaneState.PARKED:
            return DrainResult.PARKED
        waiting_for_records = self._replay is not None and self._replay.ready_chunks is None
        if self.idle or (not final and self.out is None and waiting_for_records):
            return DrainResult.DONE
        return None

    # --- buffering -------------------------------------------------------------------------------

    def add(self, chunk: Chunk, now: float) -> None:
        """Buffer ``chunk`` (the next records of the lease, in order)."""
        rep = self._replay
        if rep is None or rep.ready_chunks is not None:
            self._append(chunk, now)
            return
        inside = chunk.count_up_to(rep.target)
        if inside == chunk.rows:
            self._append(chunk, now)
            if chunk.last == rep.target:
                self._replay_reached()
            return
        # The chunk goes past the replay target: cut there.
        if inside > 0:
            head, chunk = chunk.split(inside)
            self._append(head, now)
        self._replay_reached()
        self._append(chunk, now)

    def _append(self, chunk: Chunk, now: float) -> None:
        self._chunks.append(chunk)
        self.rows += chunk.rows
        self.nbytes += chunk.nbytes
        if self.oldest is None:
            self.oldest = now

    def _replay_reached(self) -> None:
        rep = self._replay
        assert rep is not None
        rep.ready_chunks = len(self._chunks)
        if rep.ready_chunks == 0:
            log.warning(
                "lease %s: the records up to its pending checkpoint %s are gone (trimmed?); "
                "the range cannot be re-formed and is skipped",
                self.lease_key,
                rep.target,
            )
            self._replay = None
            return
        last = self._chunks[rep.ready_chunks - 1].last
        if last != rep.target:
            log.warning(
                "lease %s: pending checkpoint %s is not a record position delivered again "
                "(last at or before it: %s); the re-formed piece differs from the original",
                self.lease_key,
                rep.target,
                last,
            )

    def force(self, *, final: bool) -> None:
        """Flush without waiting. ``final``: no more records will come (shard end), so a replay
        is cut at what arrived."""
        self.forced = True
        if final and self._replay is not None and self._replay.ready_chunks is None:
            self._replay_reached()

    # --- cutting and writing ---------------------------------------------------------------------

    def cut(self, max_rows: int, max_bytes: int) -> Cut:
        """Cut the next records (exactly the replayed range if replaying, else at most
        ``max_rows``/``max_bytes`` but at least one record) and hand them out."""
        assert self.can_cut()
        rep = self._replay
        if rep is not None:
            assert rep.ready_chunks is not None
            taken = [self._chunks.popleft() for _ in range(rep.ready_chunks)]
            self._replay = None
        else:
            taken = self._take(max_rows, max_bytes)
        self._recount()
        rows = sum(c.rows for c in taken)
        piece = Piece(PieceKey(self.lease_key, taken[0].first, taken[-1].last), self.shard_id, rows)
        kept = rep if rep is not None and rep.stored else None  # its token is stored
        self.out = Cut(piece, taken, replayed=kept is not None, token=kept and kept.token)
        return self.out

    def _take(self, max_rows: int, max_bytes: int) -> list[Chunk]:
        taken: list[Chunk] = []
        rows = nbytes = 0
        while self._chunks and rows < max_rows:
            chunk = self._chunks[0]
            fit = min(max_rows - rows, chunk.rows)
            if nbytes + chunk.nbytes > max_bytes:
                per_row = max(1, chunk.nbytes // chunk.rows)
                fit = min(fit, (max_bytes - nbytes) // per_row)
                if fit <= 0:
                    if rows:
                        break
                    fit = 1  # a single record larger than the limit still goes alone
            if fit < chunk.rows:
                chunk, self._chunks[0] = chunk.split(fit)
            else:
                self._chunks.popleft()
            taken.append(chunk)
            rows += chunk.rows
            nbytes += chunk.nbytes
        return taken

    def tokened(self, cut: Cut, token: Any) -> None:
        """The sink gave the cut its token (before its pending checkpoint is written)."""
        if self.out is cut:
            cut.token = token

    def prepared(self, cut: Cut, checkpoint: PreparedCheckpoint) -> None:
        """The cut's pending checkpoint is written."""
        cut.prepared = checkpoint

    def committed(self, cut: Cut) -> None:
        """The cut's checkpoint moved: the lane may cut again."""
        if self.out is cut:
            self.out = None
            self.commit_due_at = None

    def commit_later(self, cut: Cut, at: float) -> None:
        """Written, but the commit failed in a way a retry may fix: retry at ``at``. The lane
        cuts nothing meanwhile (the next pending checkpoint would hide this one)."""
        if self.out is cut:
            self.commit_due_at = at

    def claim_commit(self, now: float) -> Cut | None:
        """The out cut whose commit retry is due now (claimed: not due again until rescheduled)."""
        if self.out is None or self.commit_due_at is None or self.commit_due_at > now:
            return None
        self.commit_due_at = float("inf")
        return self.out

    def put_back(self, cut: Cut, group: tuple[PieceKey, ...], now: float) -> None:
        """The cut was not written (or not committed): put it back at the head, to be re-formed
        exactly as it was (its pending checkpoint may be stored already)."""
        if self._state is LaneState.CLOSED:
            return
        for chunk in reversed(cut.chunks):
            self._chunks.appendleft(chunk)
        self._recount()
        self.oldest = now if self.oldest is None else self.oldest
        self._replay = _Replay(
            cut.key.last,
            group,
            cut.token,
            now,
            ready_chunks=len(cut.chunks),
            stored=cut.prepared is not None or cut.replayed,
        )
        if self.out is cut:
            self.out = None
            self.commit_due_at = None

    def _recount(self) -> None:
        self.rows = sum(c.rows for c in self._chunks)
        self.nbytes = sum(c.nbytes for c in self._chunks)
        if not self._chunks:
            self.oldest = None

    # --- parking and closing ---------------------------------------------------------------------

    def park(self, reason: str) -> None:
        """The sink gave up: nothing more is cut until the lease is parked or re-armed."""
        if self._state is LaneState.CLOSED:
            return
        self._state = LaneState.PARKED
        self.park_reason = reason

    def rearm(self) -> None:
        """Shard end: try the failed cut again (each shard_ended call that gives up counts toward
        the consumer's failure budget, which parks the lease when it is spent)."""
        if self._state is LaneState.PARKED:
            self._state = LaneState.ACTIVE

    def close(self) -> None:
        """Lease lost or handed over: drop the buffer and forget the out cut, so the batcher
        starts no commit for it any more. A commit already running may still land while the
        lease is held (it is fenced by the lease); the next owner reads from the checkpoint."""
        self._state = LaneState.CLOSED
        self._chunks.clear()
        self.rows = self.nbytes = 0
        self.oldest = None
        self._replay = None
        self.out = None
        self.commit_due_at = None
