"""A lane's ranges to re-form exactly: pieces that were in flight (written, or being written)
when the lease last changed hands or their batch failed.

Each must come back with the same records, so the same key, id and content: its records are
gathered up to its ``target`` whatever the batch size limits, then it is cut alone. They are in
lease order and fill one after the other; records past the last target go to the lane's buffer.
Pure bookkeeping, used only by ``Lane``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.pieces import Chunk, PendingState, PieceKey

log = logging.getLogger(__name__)


@dataclass
class Replay:
    """A range to re-form: it ends exactly at ``target`` (its last record)."""

    target: ExtendedSequenceNumber
    group: tuple[PieceKey, ...]  # every piece of the batch it was written in
    token: Any
    since: float  # monotonic time it started waiting to be re-formed
    # Its pending checkpoint (and so its token) is stored: the re-formed cut keeps the token.
    # A cut put back before its pending checkpoint was written gets a fresh token instead.
    stored: bool = True
    chunks: list[Chunk] = field(default_factory=list)
    ready: bool = False  # every record up to ``target`` has arrived
    unread: bool = False  # its records were had, then lost: only a pinned read re-forms it

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def key(self, lease_key: str) -> PieceKey | None:
        """The re-formed piece's key, once ready."""
        if not self.ready or not self.chunks:
            return None
        return PieceKey(lease_key, self.chunks[0].first, self.chunks[-1].last)

    def piece(self, lease_key: str) -> PieceKey | None:
        """The piece it re-forms: its key once ready, before that the lease's piece its batch
        names (None when the batch does not name it: a pending state of the first format)."""
        return self.key(lease_key) or next(
            (k for k in self.group if k.lease_key == lease_key), None
        )


class Replays:
    """The lane's replays in lease order."""

    def __init__(self, lease_key: str, replays: Iterable[Replay] = ()) -> None:
        self._lease_key = lease_key
        self._queue: deque[Replay] = deque(replays)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Replay]:
        return iter(self._queue)

    @property
    def first(self) -> Replay | None:
        return self._queue[0] if self._queue else None

    def reforms(self, group: tuple[PieceKey, ...]) -> bool:
        """Whether one of them re-forms a piece of the batch ``group``."""
        return any(r.group == group for r in self._queue)

    @property
    def all_ready(self) -> bool:
        return all(r.ready for r in self._queue)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self._queue)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._queue)

    def add(self, chunk: Chunk) -> tuple[Chunk | None, int]:
        """Give ``chunk`` (the lease's next records) to the replays still gathering; returns
        what goes past every target (for the buffer), or None, and the bytes kept here."""
        rest: Chunk | None = chunk
        kept = 0
        for rep in self._queue:
            if rep.ready or rest is None:
                continue
            if not rep.chunks:
                rest = self._from_first(rep, rest)
                if rest is None:
                    continue
            inside = rest.count_up_to(rep.target)
            if inside == rest.rows:
                rep.chunks.append(rest)
                kept += rest.nbytes
                if rest.last == rep.target:
                    self._reached(rep)
                rest = None
                continue
            if inside > 0:  # the chunk goes past this target: split there
                head, rest = rest.split(inside)
                rep.chunks.append(head)
                kept += head.nbytes
            self._reached(rep)
        self._drop_empty()
        return rest, kept

    def _from_first(self, rep: Replay, chunk: Chunk) -> Chunk | None:
        """``chunk`` from the first record of the piece ``rep`` re-forms, where its batch names
        it: a read from before it (a lease that started at LATEST is read again from a margin
        before its first read) would give the piece other first records, so another id, and an
        idempotent sink would write its records twice (the executor path pins the same first)."""
        piece = rep.piece(self._lease_key)
        if piece is None or piece.first <= chunk.first:
            return chunk
        before = chunk.count_before(piece.first)
        log.info("lease %s: %d record(s) read from before its piece %s left out",
                 self._lease_key, before, piece.piece_id)  # fmt: skip
        return None if before == chunk.rows else chunk.split(before)[1]

    def next_unfilled(
        self, lease_key: str
    ) -> tuple[ExtendedSequenceNumber, ExtendedSequenceNumber | None] | None:
        """The next range no records have filled yet: its last record, and its first when its
        batch names the piece (what a read on the executors pins to re-form it)."""
        for rep in self._queue:
            if not rep.ready:
                piece = rep.piece(lease_key)
                return rep.target, None if piece is None else piece.first
        return None

    def unread(self) -> None:
        """Every replay waits for its records again (their stored copies are gone): each is
        re-formed by a read pinned to its piece's ends."""
        for rep in self._queue:
            rep.chunks = []
            rep.ready = False
            rep.unread = True

    @property
    def unread_waiting(self) -> bool:
        """A replay whose records were lost waits for them (``unread``)."""
        return any(rep.unread and not rep.ready for rep in self._queue)

    @property
    def last_target(self) -> ExtendedSequenceNumber | None:
        return self._queue[-1].target if self._queue else None

    def reach_all(self) -> None:
        """No more records will come (shard end): each replay is re-formed from what arrived."""
        for rep in self._queue:
            if not rep.ready:
                self._reached(rep)
        self._drop_empty()

    def pop_first(self) -> Replay:
        return self._queue.popleft()

    def push_front(self, replays: list[Replay]) -> None:
        self._queue.extendleft(reversed(replays))

    def clear(self) -> None:
        self._queue.clear()

    def _reached(self, rep: Replay) -> None:
        rep.ready = True
        if not rep.chunks:
            log.warning(
                "lease %s: the records up to its pending checkpoint %s are gone (trimmed?); "
                "the range cannot be re-formed and is skipped",
                self._lease_key,
                rep.target,
            )
            return
        last = rep.chunks[-1].last
        if last != rep.target:
            log.warning(
                "lease %s: pending checkpoint %s is not a record position delivered again "
                "(last at or before it: %s); the re-formed piece differs from the original",
                self._lease_key,
                rep.target,
                last,
            )

    def _drop_empty(self) -> None:
        if any(r.ready and not r.chunks for r in self._queue):
            self._queue = deque(r for r in self._queue if r.chunks or not r.ready)


def replays_from_pending(
    lease_key: str,
    pending: tuple[ExtendedSequenceNumber, bytes | None] | None,
    checkpoint: ExtendedSequenceNumber | None,
) -> list[tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any]]:
    """The ranges to re-form on a lease just taken, from its pending checkpoint (position,
    state): each piece in flight after ``checkpoint`` (target, its batch, its token), in order.
    A state written by something else: the range up to the pending position, alone."""
    if pending is None or (checkpoint is not None and not checkpoint < pending[0]):
        return []
    position, raw = pending
    state = PendingState.decode(raw)
    if state is None:
        targets: list[tuple[ExtendedSequenceNumber, tuple[PieceKey, ...], Any]] = [
            (position, (), None)
        ]
    else:
        # Each piece's own last record: the pending checkpoint says SHARD_END instead when the
        # last piece ended at a closed shard's last record.
        targets = [(key.last, e.group, e.token) for key, e in state.after(lease_key, checkpoint)]
        if not targets:
            targets = [(position, (), None)]
    if any(t.is_sentinel for t, _, _ in targets):
        log.warning("lease %s: pending checkpoint %s cannot be re-formed", lease_key, position)
        return []
    log.info(
        "lease %s: re-forming %s first",
        lease_key,
        ", ".join(f"the range up to {t}" for t, _, _ in targets),
    )
    return targets
