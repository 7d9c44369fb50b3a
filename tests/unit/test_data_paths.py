"""The two data paths of ARCHITECTURE.md ("The data paths, counted"), measured: how many of the
project's modules run code for one batch of records and for one micro-batch, and how many calls
go from one module into another (tests/unit/path_trace.py). The figures ARCHITECTURE.md states
must be the ones measured, so a change that adds a module to a path says so there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.path_trace import micro_batch_path, record_path

ARCHITECTURE = Path(__file__).resolve().parents[2] / "ARCHITECTURE.md"


def _stated(path: str) -> tuple[int, int]:
    for line in ARCHITECTURE.read_text().splitlines():
        if line.startswith(f"| {path}:"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            return int(cells[1]), int(cells[2])
    raise AssertionError(f"ARCHITECTURE.md states no figures for {path!r}")


@pytest.mark.parametrize(
    ("path", "run"),
    [("record -> checkpoint", record_path), ("micro-batch -> acknowledgment", micro_batch_path)],
)
def test_each_data_path_crosses_the_modules_architecture_states(path: str, run: object) -> None:
    modules, calls = _stated(path)
    trace = run()  # type: ignore[operator]
    assert len(trace.modules) == modules, (
        f"{path}: {len(trace.modules)} modules, ARCHITECTURE.md says {modules}: "
        f"{sorted(trace.modules)}"
    )
    assert abs(trace.crossings - calls) <= 0.05 * calls, (
        f"{path}: {trace.crossings} calls between modules, ARCHITECTURE.md says {calls}"
    )


def test_the_trace_sees_each_role_of_the_micro_batch_path() -> None:
    modules = micro_batch_path().modules
    roles = [
        "kclpy_spark.spark." + m for m in ("sink_processor", "micro_batcher", "writer", "lane")
    ]
    roles += ["kclpy_spark.spark.batch_life", "checkpoint.checkpointer", "checkpoint.stores.memory"]
    assert set(roles) <= modules, sorted(set(roles) - modules)
    assert not any(re.match(r"tests\.", m) for m in modules)  # the test helpers are not counted
