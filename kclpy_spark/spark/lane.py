"""One lease's lane in the micro-batcher: the one owner of its state and of every transition.

A lane buffers the lease's records (``Chunk``s, in order) and hands out *cuts*: the next records to
write, up to ``depth`` at a time (pipelined batches). A cut is prepared (the lease's pending
checkpoint written, listing every cut out: ``pending_state``), written, then committed; the next
cut is handed out only once the previous one is prepared, so pending checkpoints list the cuts in
order. The checkpoint moves only over the contiguous prefix of written cuts, whatever order their
writes finish in (``claim_commit``). A cut that failed is put back at the head of the buffer with
every cut after it, each to be re-formed exactly (replays.py).

States: ACTIVE (buffering and cutting), PARKED (the sink gave up on a cut, or a read again at the
shard's end failed: the lease must be parked by its consumer, or re-armed at shard end), CLOSED
(lease lost or handed over: the buffer is dropped, nothing is committed any more). A lane opened
on a lease whose pending checkpoint is set *replays*: its first cuts end exactly where the pieces
in flight ended, whatever the size limits, so they have the same keys, ids and content as the
cuts that were being written before.

Pure bookkeeping: no I/O, no locking (the batcher holds its lock around every call). The
MicroBatcher only ever changes a lane through these methods.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import PreparedCheckpoint
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.pieces import Chunk, InFlight, PendingState, Piece, PieceKey, take_chunks
from kclpy_spark.spark.replays import Replay, Replays


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


@runtime_checkable
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

    def checkpoint_keeping_pending(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None: ...

    def set_largest_permitted(self, position: ExtendedSequenceNumber) -> None: ...

    @property
    def largest_permitted(self) -> ExtendedSequenceNumber: ...

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
    group: tuple[PieceKey, ...] | None = None  # its batch, once its pending write started
    # A re-formed cut: the batch its stored pending checkpoint names, until its own is written.
    stored_group: tuple[PieceKey, ...] | None = None
    prepared: bool = False  # a pending checkpoint listing it is written
    written: bool = False  # every sink acknowledged it

    @property
    def key(self) -> PieceKey:
        return self.piece.key

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


ReplayTarget = tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any]  # target, group, token


class Lane:
    def __init__(
        self,
        lease_key: str,
        shard_id: str,
        checkpointer: TwoPhaseCheckpointer,
        *,
        replays: Sequence[ReplayTarget] = (),
        now: float = 0.0,
        depth: int = 1,
    ) -> None:
        self.lease_key = lease_key
        self.shard_id = shard_id
        self.checkpointer = checkpointer
        self.depth = depth  # the most cuts out at once
        # Held around each pending-checkpoint write of this lease (``LaneUpdates.write_pending``;
        # never by the lane): the last write to land then lists every cut whose write started.
        self.pending_lock = threading.Lock()
        self._state = LaneState.ACTIVE
        self.park_reason = ""
        self._chunks: deque[Chunk] = deque()
        self._replays = Replays(lease_key, (Replay(*r, since=now) for r in replays))
        self.rows = 0
        self.nbytes = 0
        self.oldest: float | None = None  # monotonic time the oldest buffered record arrived
        self.read_to: ExtendedSequenceNumber | None = None  # the last record it was given
        # The last record it was given before records were put back to be read again: until
        # it is given that far again, it is not done (a drain at the shard's end would have
        # checkpointed SHARD_END past the records it dropped).
        self.owed_to: ExtendedSequenceNumber | None = None
        self.reads_epoch = 0  # counts put_back_unread: reads planned before one are refused
        self.rereads = 0  # put_back_unread since the lane's checkpoint last moved
        self.forced = False  # flush without waiting (shard end, shutdown)
        self._outs: deque[Cut] = deque()  # cut and not yet committed, in lease order
        self._claimed: Cut | None = None  # the cut a commit under way moves the checkpoint to
        self.commit_due_at: float | None = None  # set while a failed commit waits for its retry

    @property
    def state(self) -> LaneState:
        return self._state

    # --- questions -------------------------------------------------------------------------------

    @property
    def outs(self) -> tuple[Cut, ...]:
        return tuple(self._outs)

    @property
    def idle(self) -> bool:
        """Nothing buffered, nothing out, no piece waiting to be re-formed and nothing dropped
        to read again (``owed_to``): a drain at the shard's end waits for what was lost with an
        executor, else the SHARD_END checkpoint would skip those records."""
        return self.rows == 0 and not self._outs and not self._replays and self.owed_to is None

    @property
    def replaying(self) -> bool:
        return bool(self._replays)

    @property
    def gathering(self) -> bool:
        """Replaying, and records of a piece to re-form have yet to arrive."""
        return bool(self._replays) and not self._replays.all_ready

    def reforms(self, group: tuple[PieceKey, ...]) -> bool:
        """Whether it re-forms a piece of the batch ``group`` (its piece will come back)."""
        return self._replays.reforms(group)

    @property
    def replay_ready(self) -> bool:
        """Replaying, and every record of the next cut to re-form has arrived."""
        first = self._replays.first
        return first is not None and first.ready

    @property
    def replay_group(self) -> tuple[PieceKey, ...]:
        first = self._replays.first
        return () if first is None else first.group

    @property
    def replay_since(self) -> float | None:
        first = self._replays.first
        return None if first is None else first.since

    def replay_key(self) -> PieceKey | None:
        """The key of the next cut to re-form, once all its records are here."""
        first = self._replays.first
        return None if first is None else first.key(self.lease_key)

    def unfilled(self) -> tuple[ExtendedSequenceNumber, ExtendedSequenceNumber | None] | None:
        return self._replays.next_unfilled(self.lease_key)

    def can_cut(self) -> bool:
        """May a cut of this lane join a new batch now? (Room for one more out, the last one's
        pending checkpoint written, and records to cut. Ranges to re-form go only once every
        one of them is whole: each pending write lists them all, up to the last one's end.)"""
        return (
            self._state is LaneState.ACTIVE
            and len(self._outs) < self.depth
            and all(c.prepared for c in self._outs)
            and (self._replays.all_ready if self._replays else bool(self._chunks))
        )

    def drained(self, final: bool) -> DrainResult | None:
        """What a drain of this lane has come to, or None while it must go on."""
        if self._state is LaneState.CLOSED:
            return DrainResult.CLOSED
        if self._state is LaneState.PARKED:
            return DrainResult.PARKED
        waiting_for_records = self.gathering or self.owed_to is not None
        if self.idle or (not final and not self._outs and waiting_for_records):
            return DrainResult.DONE
        return None

    # --- buffering -------------------------------------------------------------------------------

    @property
    def reads_from(self) -> object | None:
        """The read its first records waiting to be cut came from (a round's read on the
        executors), or None."""
        return getattr(self._chunks[0], "read", None) if self._chunks else None

    def add(self, chunk: Chunk, now: float) -> None:
        """Buffer ``chunk`` (the next records of the lease, in order). Counts are kept as the
        records come (no pass over the buffer: this runs for every delivery)."""
        self.read_to = chunk.last
        if self.owed_to is not None and not chunk.last < self.owed_to:
            self.owed_to = None
        rest, kept = self._replays.add(chunk) if self._replays else (chunk, 0)
        if rest is not None:
            self._chunks.append(rest)
            kept += rest.nbytes
        self.rows += chunk.rows  # a split keeps every record, here or in a replay
        self.nbytes += kept
        if self.oldest is None:
            self.oldest = now

    def read_to_end(self) -> ExtendedSequenceNumber | None:
        """The shard's end was read after the records it gave: what the lane still owed is no
        longer in the shard (aged out of retention), so nothing is owed. Returns what was."""
        owed, self.owed_to = self.owed_to, None
        return owed

    def force(self, *, final: bool) -> None:
        """Flush without waiting. ``final``: no more records will come (shard end), so the
        replays are cut at what arrived; but not while records put back to be read again (their
        rows lost on the executors) wait: cut so, they would be dropped. The reads go on for a
        lease at its shard's end until its consumer's shard-end step is done, pinned to them."""
        self.forced = True
        if final and not self._replays.unread_waiting:
            self._replays.reach_all()
            self._recount()

    # --- cutting and writing ---------------------------------------------------------------------

    def cut(self, max_rows: int, max_bytes: int) -> Cut:
        """Cut the next records (exactly the next replayed range if replaying, else at most
        ``max_rows``/``max_bytes`` but at least one record) and hand them out."""
        assert self.can_cut()
        rep = self._replays.pop_first() if self._replays else None
        taken = rep.chunks if rep is not None else take_chunks(self._chunks, max_rows, max_bytes)
        self._recount()
        rows = sum(c.rows for c in taken)
        piece = Piece(PieceKey(self.lease_key, taken[0].first, taken[-1].last), self.shard_id, rows)
        kept = rep if rep is not None and rep.stored else None  # its token is stored
        cut = Cut(piece, taken, replayed=kept is not None, token=kept and kept.token,
                  stored_group=kept.group if kept is not None else None)  # fmt: skip
        self._outs.append(cut)
        return cut

    def tokened(self, cut: Cut, token: Any) -> None:
        """The sink gave the cut its token (before its pending checkpoint is written)."""
        if cut in self._outs:
            cut.token = token

    def pending_state(
        self, cut: Cut, group: tuple[PieceKey, ...]
    ) -> tuple[ExtendedSequenceNumber, PendingState] | None:
        """The pending checkpoint to write for ``cut`` (in the batch ``group``): every cut out
        whose pending write started or that re-forms a stored piece, then every range waiting
        to be re-formed whose pending checkpoint was stored (its records may be in a sink
        already), in order; the position is the last one's end. None if the cut is no longer
        out (put back or closed)."""
        if cut not in self._outs:
            return None
        cut.group = group
        # A re-formed cut whose own pending write has not started is listed as stored: left
        # out, a rewrite of an earlier cut's pending dropped its piece (read again after a
        # crash, cut elsewhere: written twice).
        listed = [
            (c.key, group_of, c.token)
            for c in self._outs
            if (group_of := c.group if c.group is not None else c.stored_group) is not None
        ]
        # A range still to re-form is named by its batch's piece (records lost with an executor
        # wait for a pinned read while earlier cuts are out, and their pending is rewritten).
        listed += [
            (
                r.piece(self.lease_key) or PieceKey(self.lease_key, r.target, r.target),
                r.group,
                r.token,
            )
            for r in self._replays
            if r.stored
        ]
        state = PendingState(
            tuple(InFlight(g if k in g else (k,), token) for k, g, token in listed)
        )
        return listed[-1][0].last, state

    def prepared(self, cut: Cut) -> None:
        """A pending checkpoint listing the cut is written."""
        cut.prepared = True

    def acknowledged(self, cut: Cut) -> None:
        """Every sink acknowledged the cut's batch."""
        if cut in self._outs:
            cut.written = True

    def commit_ready(self, now: float) -> bool:
        head = self._outs[0] if self._outs else None
        due = self.commit_due_at is None or self.commit_due_at <= now
        return head is not None and head.written and self._claimed is None and due

    def claim_commit(self, now: float) -> Cut | None:
        """The last cut of the written prefix, to commit now (claimed: no other commit of this
        lane starts until ``committed`` or ``commit_later``). None when the head is not written
        yet, a commit is under way, or a failed one waits for its retry."""
        if not self.commit_ready(now):
            return None
        last = self._outs[0]
        for c in self._outs:
            if not c.written:
                break
            last = c
        self._claimed = last
        self.commit_due_at = None
        return last

    def committed(self, cut: Cut) -> None:
        """The checkpoint moved to the cut's end: it and the cuts before it are done."""
        self._claimed = None
        self.rereads = 0
        if cut in self._outs:
            while self._outs and self._outs.popleft() is not cut:
                pass

    def commit_later(self, cut: Cut, at: float) -> None:
        """Written, but the commit failed in a way a retry may fix: retry at ``at``. The lane
        goes on cutting (each pending checkpoint lists every cut out)."""
        self._claimed = None
        if cut in self._outs:
            self.commit_due_at = at

    def release_claim(self, cut: Cut, at: float) -> None:
        """The commit claimed for ``cut`` ended without saying how (it raised something
        unexpected, or was never tried): retried at ``at``, as a failed one. Nothing if the claim
        was already settled (another commit of the lane may be under way by now)."""
        if self._claimed is cut:
            self.commit_later(cut, at)

    def put_back(self, cut: Cut, group: tuple[PieceKey, ...], now: float) -> bool:
        """The cut was not written (or not committed): put it back at the head of the buffer
        with every cut after it, each to be re-formed exactly as it was (their pending
        checkpoint may be stored already). ``group``: the cut's batch. False (nothing done)
        when the cut is no longer out: a late answer about a cut already put back."""
        if self._state is LaneState.CLOSED or cut not in self._outs:
            return False
        moved: list[Cut] = []
        while self._outs and self._outs[-1] is not cut:
            moved.append(self._outs.pop())
        moved.append(self._outs.pop())
        moved.reverse()
        self._replays.push_front(
            [
                Replay(
                    c.key.last,
                    group if c is cut else (c.group or c.stored_group or (c.key,)),
                    c.token,
                    now,
                    # A pending write that started may still land, naming its token.
                    stored=c.prepared or c.replayed or c.group is not None,
                    chunks=list(c.chunks),
                    ready=True,
                )
                for c in moved
            ]
        )
        self._recount()
        self.oldest = now if self.oldest is None else self.oldest
        if not self._outs:
            self._claimed = None
            self.commit_due_at = None
        return True

    def put_back_unread(self, cut: Cut, group: tuple[PieceKey, ...], now: float) -> bool:
        """``put_back``, but the records are gone (a read's rows stored on a lost executor):
        the cut, every cut after it and every range waiting to be re-formed wait for a read
        pinned to their ends, and the records buffered after them are dropped, to be read again
        after the last of them. The lane is not parked."""
        if not self.put_back(cut, group, now):
            return False
        self._replays.unread()
        self._chunks.clear()
        given = self.read_to if self.owed_to is None else self.owed_to
        self.read_to = self._replays.last_target
        if given is not None and (self.read_to is None or self.read_to < given):
            self.owed_to = given
        self.reads_epoch += 1
        self.rereads += 1
        self._recount()
        return True

    def put_back_all(self, now: float) -> bool:
        """Every cut out goes back (a commit that can never succeed), each in its batch."""
        if not self._outs:
            return False
        head = self._outs[0]
        return self.put_back(head, head.group or (head.key,), now)

    def _recount(self) -> None:
        self.rows = self._replays.rows + sum(c.rows for c in self._chunks)
        self.nbytes = self._replays.nbytes + sum(c.nbytes for c in self._chunks)
        if not self.rows:
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
        """Lease lost or handed over: drop the buffer and forget the cuts out, so the batcher
        starts no commit for them any more. A commit already running may still land while the
        lease is held (it is fenced by the lease); the next owner reads from the checkpoint."""
        self._state = LaneState.CLOSED
        self._chunks.clear()
        self._replays.clear()
        self.rows = self.nbytes = 0
        self.oldest = None
        self._outs.clear()
        self._claimed = None
        self.commit_due_at = None
