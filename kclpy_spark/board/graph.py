"""Where each lease sits in the drawn shard graph: a column per generation (a shard right of its
parents) and a row within it. Pure; the page draws it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def layout(parents: Mapping[str, Iterable[str]]) -> dict[str, tuple[int, int]]:
    """``{shard: (column, row)}`` for the shards in ``parents`` (shard -> its parent shards).

    A shard's column is one more than its deepest parent's among the shards given (parents
    outside the set, aged out of the table, do not count); rows follow shard-id order within a
    column. A cycle (never in a real stream, possible in a hand-edited table) is cut where it
    closes, so every shard is placed.
    """
    known = {s: sorted(p for p in ps if p in parents and p != s) for s, ps in parents.items()}
    column: dict[str, int] = {}
    for start in sorted(known):
        # Depth-first without recursion: a stream can have thousands of generations.
        stack: list[tuple[str, int]] = [(start, 0)]
        visiting: set[str] = set()
        while stack:
            shard, index = stack.pop()
            if shard in column:
                continue
            visiting.add(shard)
            pending = [p for p in known[shard][index:] if p not in column and p not in visiting]
            if pending:
                stack.append((shard, known[shard].index(pending[0]) + 1))
                stack.append((pending[0], 0))
                continue
            placed = [column[p] for p in known[shard] if p in column]
            column[shard] = 1 + max(placed) if placed else 0
            visiting.discard(shard)
    rows: dict[int, int] = {}
    result: dict[str, tuple[int, int]] = {}
    for shard in sorted(column, key=lambda s: (column[s], s)):
        col = column[shard]
        result[shard] = (col, rows.get(col, 0))
        rows[col] = rows.get(col, 0) + 1
    return result
