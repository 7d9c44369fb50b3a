"""What the demo reports: the lag sparkline, and its reading of the Parquet table (records,
duplicates, children written after their parents). Pure: a table made here with pyarrow."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kclpy_spark.demo.chart import sparkline, terminal_chart
from kclpy_spark.demo.table import ParquetView


@pytest.mark.parametrize(
    ("values", "width", "expected"),
    [
        ([], 10, ""),
        ([0, 0, 0], 10, "▁▁▁"),
        ([0, 50, 100], 10, "▁▅█"),
        ([0, None, 100], 10, "▁ █"),
        ([10, 100, 10, 0], 2, "█▂"),  # resampled to the peak of each slice
        ([0, 0, 100, 0], 2, "▁█"),
    ],
)
def test_sparkline(values: list[float | None], width: int, expected: str) -> None:
    assert sparkline(values, width) == expected


def test_terminal_chart_names_each_shard_and_its_peak() -> None:
    lines = terminal_chart({"shardId-1": [(0.0, 5.0), (1.0, 1500.0)], "shardId-0": [(0.0, None)]})
    assert lines[0].startswith("  shardId-0") and lines[0].endswith("peak 0 ms")
    assert "peak 1,500 ms" in lines[1]


def piece(table: Path, name: str, rows: list[tuple[str, int]], at: float) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = table / f"kcl_piece={name}"
    folder.mkdir(parents=True)
    data = [json.dumps({"n": n}).encode() for _, n in rows]
    pq.write_table(
        pa.table({"shard_id": [s for s, _ in rows], "data": pa.array(data, pa.binary())}),
        folder / "part-0.parquet",
    )
    os.utime(folder / "part-0.parquet", (at, at))
    if name.startswith("p"):  # a lease-scope piece has a marker; a worker-scope one has none
        (folder / "_SUCCESS").write_text("")


def test_the_view_counts_records_and_duplicates(tmp_path: Path) -> None:
    view = ParquetView(tmp_path / "table")
    assert view.count() == 0 and view.numbers() == []
    piece(view.path, "p1", [("s0", 0), ("s0", 1)], 100.0)
    piece(view.path, "p2", [("s1", 2), ("s1", 1)], 101.0)
    (view.path / "_staging").mkdir()
    assert view.count() == 4 and sorted(view.numbers()) == [0, 1, 1, 2]


def test_children_written_after_their_parents(tmp_path: Path) -> None:
    view = ParquetView(tmp_path / "table")
    piece(view.path, "p1", [("parent", 0)], 100.0)
    piece(view.path, "p2", [("parent", 1)], 110.0)
    piece(view.path, "c1", [("child", 2)], 112.5)
    order = view.children_after_parents({"child": ["parent"], "parent": []})
    assert order.ok and "child child first written +2.5s after parent parent" in order.lines[0]


def test_a_child_written_before_its_parent_fails_the_check(tmp_path: Path) -> None:
    view = ParquetView(tmp_path / "table")
    piece(view.path, "p1", [("parent", 0)], 100.0)
    piece(view.path, "c1", [("child", 2)], 95.0)
    piece(view.path, "p2", [("parent", 1)], 110.0)
    order = view.children_after_parents({"child": ["parent"]})
    assert not order.ok and "CHILD BEFORE PARENT" in order.lines[0]
