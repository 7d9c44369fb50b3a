"""A batch as the writer carries it, and what the writer tells the batcher about it.

``Batch`` is one micro-batch's cuts and where its write stands; ``LaneEvents`` is the batcher's
side (updates.py): every lane change a write causes goes through it, under the batcher's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from checkpoint.checkpointer import CheckpointError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.acks import AckSet
from kclpy_spark.spark.batch import SinkBatch
from kclpy_spark.spark.lane import Cut, Lane
from kclpy_spark.spark.pieces import PendingState, PieceKey


@dataclass(eq=False)
class Batch:
    """One micro-batch: a cut of each of its lanes, sorted by piece key."""

    parts: list[tuple[Lane, Cut]]
    sink_batch: SinkBatch | None = None
    tokens_ready: bool = False
    prepared: set[int] = field(default_factory=set)  # id() of the cuts whose pending is written
    error: BaseException | None = None  # the last failure, once given up
    outcome: str = "pending"  # written | dead-lettered | parked | abandoned
    acks: AckSet | None = None  # the sinks' answers
    attempts: dict[str, int] = field(default_factory=dict)  # write attempts by sink name

    @property
    def group(self) -> tuple[PieceKey, ...]:
        return tuple(sorted(cut.key for _, cut in self.parts))

    def __repr__(self) -> str:
        keys = ", ".join(f"{k.lease_key}[{k.first}..{k.last}]" for k in self.group)
        return f"Batch({keys})"


class LaneEvents(Protocol):
    """What the writer tells the batcher; each call changes lanes under the batcher's lock."""

    def tokened(self, lane: Lane, cut: Cut, token: Any) -> None: ...

    def pending_state(
        self, lane: Lane, cut: Cut, group: tuple[PieceKey, ...]
    ) -> tuple[ExtendedSequenceNumber, PendingState] | None: ...

    def prepared(self, lane: Lane, cut: Cut) -> None: ...

    def not_prepared(self, lane: Lane, cut: Cut, error: CheckpointError) -> None: ...

    def all_closed(self, batch: Batch) -> bool: ...

    def attempt(self, error: BaseException | None, prepare_s: float, write_s: float) -> None: ...

    def written(self, batch: Batch, *, dead_lettered: bool) -> list[Lane]: ...

    def claim_commit(self, lane: Lane) -> Cut | None: ...

    def committed(self, lane: Lane, cut: Cut, seconds: float) -> None: ...

    def commit_failed(self, lane: Lane, cut: Cut, error: Exception) -> None: ...

    def gave_up(self, batch: Batch, error: BaseException) -> None: ...
