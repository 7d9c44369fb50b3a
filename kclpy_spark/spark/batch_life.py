"""One micro-batch's life, and what the writer reports about it.

``Batch`` is the one owner of a batch's state: every transition goes through ``Batch.move``, which
refuses any move the table ``MOVES`` does not list. A batch is *cut* from its lanes, *prepared*
(sink tokens and pending checkpoints written, the ``SinkBatch`` built), then ends in one of four
states: *written* or *dead-lettered* (every sink answered positively: its cuts are the lanes' to
commit), *parked* (a sink gave up: its cuts are put back and their lanes parked), *abandoned*
(the sink is closing, or every lease of the batch was lost: their next owners write it) or, read
on the executors, *reread* (the rows its reads stored there are gone: its cuts are put back to be
read again, pinned). The
writer (writer.py) does the I/O and reports through ``LaneEvents``; the batcher's side
(updates.py) applies each report, lanes and batch, under the batcher's lock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import CheckpointError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.acks import AckSet
from kclpy_spark.spark.lane import Cut, Lane
from kclpy_spark.spark.pieces import PendingState, PieceKey
from kclpy_spark.spark.sink_batch import SinkBatch


class BatchState(enum.Enum):
    CUT = "cut"  # taken from its lanes; nothing stored for it yet
    PREPARED = "prepared"  # sink tokens and pending checkpoints written; the SinkBatch built
    WRITTEN = "written"  # every sink wrote it
    DEAD_LETTERED = "dead-lettered"  # every sink answered, one or more by its dead-letter place
    PARKED = "parked"  # a sink gave up: the cuts are put back, their lanes parked
    ABANDONED = "abandoned"  # the sink is closing or every lease was lost: not written here
    # The rows its reads stored on the executors are gone (an executor lost): the cuts are put
    # back to be read again, pinned to their ends; the lanes go on.
    REREAD = "reread"

    @property
    def settled(self) -> bool:
        """The batch is over: nothing more happens to it (commits are its lanes')."""
        return not MOVES[self]


_ENDS = frozenset({BatchState.WRITTEN, BatchState.DEAD_LETTERED})
MOVES: dict[BatchState, frozenset[BatchState]] = {
    BatchState.CUT: frozenset({BatchState.PREPARED, BatchState.PARKED, BatchState.ABANDONED}),
    BatchState.PREPARED: _ENDS | {BatchState.PARKED, BatchState.ABANDONED, BatchState.REREAD},
    BatchState.WRITTEN: frozenset(),
    BatchState.DEAD_LETTERED: frozenset(),
    BatchState.PARKED: frozenset(),
    BatchState.ABANDONED: frozenset(),
    BatchState.REREAD: frozenset(),
}


class BatchStateError(KclpySparkError):
    """A move the batch's life does not allow (a bug: the batch would be written or put back
    twice)."""


@dataclass(eq=False)
class Batch:
    """One micro-batch: a cut of each of its lanes, sorted by piece key."""

    parts: list[tuple[Lane, Cut]]
    sink_batch: SinkBatch | None = None
    tokens_ready: bool = False
    prepared: set[int] = field(default_factory=set)  # id() of the cuts whose pending is written
    error: BaseException | None = None  # the last failure, once given up
    acks: AckSet | None = None  # the sinks' answers
    attempts: dict[str, int] = field(default_factory=dict)  # write attempts by sink name
    # Sinks whose prepare gave up on the batch, with the error: each goes to its dead letter.
    unprepared: dict[str, BaseException] = field(default_factory=dict)
    state: BatchState = BatchState.CUT

    def move(self, to: BatchState) -> None:
        if to not in MOVES[self.state]:
            raise BatchStateError(f"{self!r}: cannot move from {self.state.value} to {to.value}")
        self.state = to

    @property
    def group(self) -> tuple[PieceKey, ...]:
        return tuple(sorted(cut.key for _, cut in self.parts))

    def __repr__(self) -> str:
        keys = ", ".join(f"{k.lease_key}[{k.first}..{k.last}]" for k in self.group)
        return f"Batch({keys})"


class LaneEvents(Protocol):
    """What the writer tells the batcher; each call changes lanes under the batcher's lock."""

    def tokened(self, lane: Lane, cut: Cut, token: Any) -> None: ...

    def write_pending(
        self,
        lane: Lane,
        cut: Cut,
        group: tuple[PieceKey, ...],
        write: Callable[[ExtendedSequenceNumber, PendingState], None],
    ) -> bool: ...

    def prepared(self, lane: Lane, cut: Cut) -> None: ...

    def not_prepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None: ...

    def leave_unprepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None: ...

    def batch_prepared(self, batch: Batch) -> None: ...

    def all_closed(self, batch: Batch) -> bool: ...

    def attempt(
        self, error: BaseException | None, prepare_s: float, write_s: float, sink: str = ""
    ) -> None: ...

    def answered(self, sink: str, outcome: str) -> None: ...

    def written(self, batch: Batch, *, dead_lettered: bool) -> list[Lane]: ...

    def claim_commit(self, lane: Lane) -> Cut | None: ...

    def committed(self, lane: Lane, cut: Cut, seconds: float) -> None: ...

    def commit_failed(self, lane: Lane, cut: Cut, error: Exception) -> None: ...

    def release_claim(self, lane: Lane, cut: Cut) -> None: ...

    def gave_up(self, batch: Batch, error: BaseException) -> None: ...

    def reread(self, batch: Batch, error: BaseException) -> bool: ...

    def abandoned(self, batch: Batch) -> None: ...
