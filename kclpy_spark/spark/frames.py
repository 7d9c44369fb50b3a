"""Records read on the executors, as the micro-batcher carries them: a ``RangeChunk`` is a lane's
chunk whose rows stay on the executors (what the driver holds is its ends, its size and the read
it came from), and ``ExecutorFrames`` turns a batch's chunks into the DataFrame its sinks write.

A lane takes a ``RangeChunk`` as it takes an Arrow ``Chunk`` (lane.py, replays.py): the read of
the lane's range fills it whole, so it is never split (a pinned range ends exactly at a re-formed
piece's last record; a batch cuts every chunk of a lane whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kclpy_spark.spark.pieces import Chunk, Piece

# Spark's error class when a local checkpoint's block is gone: the executor that stored it was
# lost (or the rows were freed). Another write of the same frame fails the same way.
LOST_BLOCK = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


def stored_rows_lost(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it came from, or wraps as ``error.error``: one sink's of
    several) says the rows a read stored on the executors are gone: the records must be read
    again, not the write tried again."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if LOST_BLOCK in str(error):
            return True
        wrapped = getattr(error, "error", None)
        inner = wrapped if isinstance(wrapped, BaseException) else None
        error = error.__cause__ or error.__context__ or inner
    return False


@dataclass(frozen=True)
class RangeChunk(Chunk):
    """One lease's records of one executor read (``read``: a ``cluster_read.RangeRead``)."""

    read: Any = None
    lease_key: str = ""
    row_count: int = 0
    byte_count: int = 0

    @property
    def rows(self) -> int:
        return self.row_count

    @property
    def nbytes(self) -> int:
        return self.byte_count

    def split(self, rows: int) -> tuple[Chunk, Chunk]:
        raise AssertionError("a chunk read on the executors is cut whole, never split")


class ExecutorFrames:
    """A batch's records read on the executors: its chunks' reads, filtered to its pieces."""

    def __init__(self, chunks: Sequence[RangeChunk], parse: Callable[[Any], Any]) -> None:
        self._chunks = tuple(chunks)
        self._parse = parse  # the value schema's parse (identity without one)

    def frame(
        self,
        pieces: Sequence[Piece],
        *,
        parsed: bool = True,
        index_column: str | None = None,
    ) -> Any:
        """The records of ``pieces`` (one read's leases, or a union over reads); with
        ``index_column``, each row also carries its piece's index in ``pieces``."""
        from pyspark.sql import functions as F

        from kclpy_spark.spark.cluster_read import without_read_columns
        from kclpy_spark.spark.range_tasks import LEASE_COLUMN
        from kclpy_spark.spark.sql_text import sql_string

        wanted = {p.lease_key for p in pieces}
        by_read: dict[int, tuple[Any, list[str]]] = {}
        for chunk in self._chunks:
            if chunk.lease_key in wanted:
                by_read.setdefault(id(chunk.read), (chunk.read, []))[1].append(chunk.lease_key)
        if not by_read:
            raise ValueError("no records of these pieces in this batch")
        # Each read filtered to its leases of this batch, then one union: the index and the
        # dropped lease column are added once, not once a read (each is calls to the JVM, and a
        # batch unions every read its pieces came from).
        frames = [read.stored_of(keys) for read, keys in by_read.values()]
        out = frames[0]
        for more in frames[1:]:
            out = out.unionByName(more)
        if index_column is not None:
            # A row's piece by its lease: one map lookup a row (a CASE WHEN per piece grew with
            # the leases of a batch). A lease has one piece in a batch; were there two, the last
            # wins. The map is SQL text, parsed on the JVM: a map of literal columns was two
            # calls to the JVM per lease and read, ~240 for a batch of 24 leases.
            indexes = {p.lease_key: i for i, p in enumerate(pieces)}
            entries = ", ".join(f"{sql_string(k)}, {i}" for k, i in indexes.items())
            out = out.withColumn(index_column, F.expr(f"map({entries})[{LEASE_COLUMN}]"))
        out = without_read_columns(out)
        return self._parse(out) if parsed else out

    def arrow(self, pieces: Sequence[Piece]) -> Any:
        """The raw record columns of ``pieces`` as an Arrow table, on the driver (for sinks that
        write from the driver: Delta, the dead-letter location)."""
        from kclpy_spark.spark.pieces import SCHEMA

        table = self.frame(pieces, parsed=False).toArrow()
        return table.cast(SCHEMA) if table.num_rows else SCHEMA.empty_table()
