"""What a sink is given: one micro-batch (``SinkBatch``), and the small ports around a write.

A sink implements ``BatchSink``: ``prepare`` (before the pending checkpoints are written; returns a
JSON-able token per lease that comes back unchanged when the piece is re-formed after a crash) and
``write`` (one attempt; raise to fail it). A plain foreachBatch function ``fn(df, batch_id)`` is
wrapped by ``FunctionSink``; while it runs, ``current_batch()`` tells it the batch's pieces.
``SinkRoute`` gives a sink its name and its own failure policy (several sinks per application).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from kclpy_spark.spark.frames import ExecutorFrames
from kclpy_spark.spark.pieces import SCHEMA, Piece

ToDataFrame = Callable[[pa.Table], Any]


@dataclass
class SinkBatch:
    """One micro-batch. Read on the driver, ``table`` holds the pieces' rows in ``pieces`` order
    (``offsets[i]`` is where piece i starts); read on the executors, ``table`` is None and
    ``frames`` gives their DataFrame (``frame``, ``arrow``). ``tokens`` maps a lease key to its
    sink token."""

    batch_id: int
    pieces: tuple[Piece, ...]
    table: pa.Table | None
    tokens: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 0
    to_df: ToDataFrame | None = None
    frames: ExecutorFrames | None = None

    @property
    def on_executors(self) -> bool:
        return self.table is None

    def frame(self, pieces: Sequence[Piece] | None = None, index_column: str | None = None) -> Any:
        """The DataFrame of some pieces (default: all), decoded as configured; with
        ``index_column``, each row carries its piece's index in ``pieces``."""
        chosen = tuple(pieces) if pieces is not None else self.pieces
        if self.frames is not None:
            return self.frames.frame(chosen, index_column=index_column)
        table = self.subset(chosen)
        if index_column is not None:
            rows = [p.rows for p in chosen]  # numpy: no Python object per row
            index = pa.array(np.repeat(np.arange(len(chosen), dtype=np.int32), rows))
            table = table.append_column(index_column, index)
        return self.dataframe(table)

    def arrow(self, pieces: Sequence[Piece] | None = None) -> pa.Table:
        """The raw record columns of some pieces (default: all) as Arrow, on the driver."""
        chosen = tuple(pieces) if pieces is not None else self.pieces
        if self.frames is not None:
            return self.frames.arrow(chosen)
        return self.subset(chosen)

    @property
    def offsets(self) -> list[int]:
        out, at = [], 0
        for piece in self.pieces:
            out.append(at)
            at += piece.rows
        return out

    @property
    def rows(self) -> int:
        if self.table is None:
            return sum(p.rows for p in self.pieces)
        return int(self.table.num_rows)

    def _driver_table(self) -> pa.Table:
        if self.table is None:
            raise RuntimeError("this batch was read on the executors: use frame() or arrow()")
        return self.table

    def piece_table(self, piece: Piece) -> pa.Table:
        """The rows of one piece (zero-copy; read on the driver)."""
        index = self.pieces.index(piece)
        return self._driver_table().slice(self.offsets[index], piece.rows)

    def subset(self, pieces: Sequence[Piece]) -> pa.Table:
        """The rows of some pieces, in the given order (zero-copy slices; read on the driver)."""
        if len(pieces) == len(self.pieces):
            return self._driver_table()
        parts = [self.piece_table(p) for p in pieces]
        return pa.concat_tables(parts) if parts else SCHEMA.empty_table()

    def dataframe(self, table: pa.Table | None = None) -> Any:
        """A Spark DataFrame of ``table`` (default: the whole batch), decoded as configured."""
        if table is None and self.frames is not None:
            return self.frames.frame(self.pieces)
        if self.to_df is None:
            raise RuntimeError("this batch has no Spark session to build a DataFrame with")
        return self.to_df(self._driver_table() if table is None else table)


class BatchSink(Protocol):
    """A sink. With ``writers`` > 1, up to ``batches_in_flight`` batches of one lease may be
    written at once and finish in any order (checkpoints still move in order); a sink class that
    needs a lease's batches one after another sets ``ordered_per_lease = True``."""

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        """Called before the pieces' pending checkpoints are written; returns JSON-able tokens by
        lease key (may be empty). Not called for pieces re-formed from a pending checkpoint:
        their stored token is reused. Raise to fail the batch attempt."""
        ...

    def write(self, batch: SinkBatch) -> None:
        """Write the batch once; raise on failure. Idempotent sinks skip pieces already written."""
        ...


@runtime_checkable
class InOrderPerLease(Protocol):
    """A sink that says whether it needs one lease's batches one after another (Delta's versions
    commit in order): ``ordered_per_lease = True`` on its class."""

    ordered_per_lease: bool


def needs_order(sink: object) -> bool:
    """True if ``sink`` needs one lease's batches written one after another."""
    return isinstance(sink, InOrderPerLease) and sink.ordered_per_lease


@runtime_checkable
class IdempotentPerPiece(Protocol):
    """A sink that writes each piece at most once whatever batch it comes in (Parquet's piece
    folders, Delta's versions per lease): ``idempotent_per_piece = True`` on its class. A piece
    re-formed after a crash then need not come back in its old batch (same ``batch_id``), so a
    lease's pending checkpoint names only its own piece, not every piece of the batch (which
    grew with the leases of a batch: 144 KB a lease at 1,000, past DynamoDB's 400 KB item limit
    near 2,800)."""

    idempotent_per_piece: bool


def per_piece(sink: object) -> bool:
    """True if ``sink`` writes a piece at most once whatever batch it comes in."""
    return isinstance(sink, IdempotentPerPiece) and sink.idempotent_per_piece


def own_pieces_only(routes: Iterable[SinkRoute]) -> bool:
    """Whether a lease's pending checkpoint names only its own piece with these sinks (each
    writes a piece once whatever its batch), not every piece of its batch."""
    return all(per_piece(route.sink) for route in routes)


@runtime_checkable
class RetiresTokens(Protocol):
    """A sink whose tokens must never be handed out again once their batch was dead-lettered
    (Delta's versions: the write may still commit later, and the lease's next batch, given the
    same version, would then be skipped as committed)."""

    def retire_tokens(self, batch: SinkBatch) -> None:
        """Make ``batch.tokens`` used; raise if that failed (the batch is then not
        acknowledged)."""
        ...


class DeadLetterWriter(Protocol):
    def write(self, batch: SinkBatch, error: BaseException) -> None:
        """Store the batch durably with the error; raise if that failed."""
        ...


@dataclass(frozen=True)
class SinkRoute:
    """One sink of the application with its own failure policy: ``max_attempts`` writes of a
    batch (each within ``write_timeout`` seconds), then its ``dead_letter`` location, or, without
    one, the batch's leases park. ``name`` tells the sinks apart (logs, tokens, metrics)."""

    name: str
    sink: BatchSink
    max_attempts: int
    write_timeout: float
    dead_letter: DeadLetterWriter | None = None


class Interrupter(Protocol):
    """Cancels a write that overran its timeout (Spark job tags; a no-op without Spark)."""

    def tagged(self, tag: str) -> contextlib.AbstractContextManager[None]: ...

    def interrupt(self, tag: str) -> None: ...


class NoInterrupter:
    @contextlib.contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        yield

    def interrupt(self, tag: str) -> None:
        return None


_CURRENT: contextvars.ContextVar[SinkBatch | None] = contextvars.ContextVar(
    "kclpy_spark_current_batch", default=None
)


def current_batch() -> SinkBatch | None:
    """The batch being written by this thread's foreachBatch function (None outside one)."""
    return _CURRENT.get()


class FunctionSink:
    """Calls ``fn(df, batch_id)``, Spark's foreachBatch signature, once per attempt."""

    def __init__(self, fn: Callable[[Any, int], object]) -> None:
        self.fn = fn

    def __repr__(self) -> str:
        return f"FunctionSink({getattr(self.fn, '__qualname__', self.fn)!r})"

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        return {}

    def write(self, batch: SinkBatch) -> None:
        df = batch.dataframe()
        token = _CURRENT.set(batch)
        try:
            self.fn(df, batch.batch_id)
        finally:
            _CURRENT.reset(token)
