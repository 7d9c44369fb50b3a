"""The demo's view of the Parquet table the workers write (pyarrow, no Spark job): its rows, the
records in them, and when each shard's pieces were published."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Order:
    ok: bool
    lines: list[str]


class ParquetView:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _table(self, columns: list[str]) -> Any:
        import pyarrow.dataset as ds  # type: ignore[import-untyped, unused-ignore]

        if not self.path.exists():
            return None
        try:  # "_staging" and "_SUCCESS" are skipped (pyarrow ignores names starting with _)
            return ds.dataset(str(self.path), format="parquet", partitioning="hive").to_table(
                columns=columns
            )
        except (FileNotFoundError, ValueError):  # nothing published yet
            return None

    def count(self) -> int:
        table = self._table(["shard_id"])
        return 0 if table is None else int(table.num_rows)

    def numbers(self) -> list[int]:
        """The record numbers in the table, one per row (duplicates kept)."""
        table = self._table(["data"])
        if table is None:
            return []
        return [int(json.loads(bytes(d))["n"]) for d in table.column("data").to_pylist()]

    def published(self) -> dict[str, list[float]]:
        """shard id -> when each of its pieces' files was written (mtime: a piece is written in
        staging, then renamed into the table, which keeps the time)."""
        import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]

        times: dict[str, list[float]] = {}
        for part in sorted(self.path.glob("kcl_piece=*/*.parquet")):
            shards = set(pq.read_table(part, columns=["shard_id"]).column(0).to_pylist())
            for shard in shards:
                times.setdefault(shard, []).append(part.stat().st_mtime)
        return times

    def children_after_parents(self, parents: Mapping[str, Sequence[str]]) -> Order:
        """Whether every child's first piece was published after its parents' last."""
        published = self.published()
        lines, ok = [], True
        for child in sorted(parents):
            if not parents[child] or child not in published:
                continue
            first = min(published[child])
            for parent in parents[child]:
                if parent not in published:
                    continue
                gap = first - max(published[parent])
                ok = ok and gap >= 0
                lines.append(
                    f"child {child} first written {gap:+.1f}s after parent {parent}'s last piece"
                    f" ({'parents first' if gap >= 0 else 'CHILD BEFORE PARENT'})"
                )
        if not lines:
            lines.append("children after parents   (no child with a written parent to compare)")
        return Order(ok, lines)
