"""How bench_vs_kcl_rs.py reads another process's CPU over a window it did not choose the edges
of: cumulative CPU samples, each edge interpolated between the samples around it
(``bench/common.py``: ``cpu_between``), and which results file a run writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_vs_kcl_rs
from common import cpu_between

SAMPLES = [(10.0, 1.0), (11.0, 2.0), (12.0, 4.0), (13.0, 4.0)]


@pytest.mark.parametrize(
    ("start", "end", "cpu"),
    [
        (10.0, 12.0, 3.0),  # on samples
        (10.5, 11.5, 1.5),  # both edges between samples: 0.5 of 1 s, then 0.5 of 2 s
        (11.5, 13.0, 1.0),  # idle after 12 s adds nothing
        (5.0, 10.5, 0.5),  # before the first sample: held at its value
        (12.5, 20.0, 0.0),  # after the last sample: held too
    ],
)
def test_cpu_between_interpolates_each_edge(start: float, end: float, cpu: float) -> None:
    assert cpu_between(SAMPLES, start, end) == pytest.approx(cpu)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        ([], "vs_kcl_rs.md"),
        (["--read-data"], "vs_kcl_rs_read_data.md"),
        (["--source", "standin", "--no-read-limits"], "vs_kcl_rs_standin_unlimited.md"),
        (["--source", "standin", "--settings", "defaults"], "vs_kcl_rs_standin_defaults.md"),
    ],
)
def test_each_variant_writes_its_own_results_file(argv: list[str], name: str) -> None:
    args = bench_vs_kcl_rs.build_parser().parse_args(argv)
    assert bench_vs_kcl_rs.results_name(args) == name
