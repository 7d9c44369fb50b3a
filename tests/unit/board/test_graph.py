"""The shard graph's layout: a column per generation, rows in shard-id order. Table-driven."""

from __future__ import annotations

import pytest

from kclpy_spark.board.graph import layout

CASES = {
    "no shards": ({}, {}),
    "one shard": ({"a": []}, {"a": (0, 0)}),
    "roots share column 0": ({"b": [], "a": []}, {"a": (0, 0), "b": (0, 1)}),
    "a split": (
        {"p": [], "c1": ["p"], "c2": ["p"]},
        {"p": (0, 0), "c1": (1, 0), "c2": (1, 1)},
    ),
    "a merge goes right of its deepest parent": (
        {"a": [], "b": ["a"], "m": ["a", "b"]},
        {"a": (0, 0), "b": (1, 0), "m": (2, 0)},
    ),
    "a parent aged out of the table does not count": ({"c": ["gone"]}, {"c": (0, 0)}),
    "a cycle is cut, every shard placed": ({"a": ["b"], "b": ["a"]}, {"b": (0, 0), "a": (1, 0)}),
    "a shard is not its own parent": ({"a": ["a"]}, {"a": (0, 0)}),
}


@pytest.mark.parametrize("parents,expected", CASES.values(), ids=CASES.keys())
def test_layout(parents: dict[str, list[str]], expected: dict[str, tuple[int, int]]) -> None:
    assert layout(parents) == expected


def test_a_long_chain_of_generations_needs_no_recursion() -> None:
    parents = {f"s{i}": ([f"s{i - 1}"] if i else []) for i in range(5000)}
    placed = layout(parents)
    assert placed["s4999"] == (4999, 0)
    assert len(placed) == 5000
