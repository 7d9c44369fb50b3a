"""The start-up probe's rules (executor_probe.py): which answer is on another kclpy-spark version
than the driver's, and what a probe task answers (its version beside its error)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kclpy_spark import __version__
from kclpy_spark.spark.executor_probe import ProbeAnswer, other_version, probe_partition
from kclpy_spark.spark.range_tasks import AwsTarget


@pytest.mark.parametrize(
    ("versions", "other"),
    [
        (["1.2.0", "1.2.0"], None),  # every executor on the driver's version
        (["1.2.0", "1.1.0"], 1),  # one on an older one: named
        ([None], 0),  # an answer without a version (an executor older than the check)
        ([], None),
    ],
)
def test_an_executor_on_another_version_is_found(
    versions: list[str | None], other: int | None
) -> None:
    answers = [ProbeAnswer(i, f"host-{i}", None, v) for i, v in enumerate(versions)]
    found = other_version(answers, "1.2.0")
    assert found == (None if other is None else answers[other])


def test_a_probe_task_answers_with_its_version_and_its_error() -> None:
    unreachable = AwsTarget("us-east-1", "http://127.0.0.1:9")  # refused at once
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1], pa.int64())], names=["id"])
    [answer] = list(probe_partition(unreachable, {"StreamName": "s"}, iter([batch])))
    rows = answer.to_pylist()
    assert [r["version"] for r in rows] == [__version__, __version__]
    assert all(r["error"] for r in rows)  # the endpoint refused the call
