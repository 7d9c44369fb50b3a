"""When a shard read on the executors may be called again (``read_timing.paced``): pure, a table.

The job began at 100.0 and ended at ``done`` on the driver's monotonic clock; the driver's wall
clock read 5000.0 at its end. A page of 1 MiB at 2 MiB a second asks a 0.5 s pause."""

from __future__ import annotations

import pytest

from kclpy_spark.retrieval.polling import MAX_READ_PAUSE
from kclpy_spark.spark.ranges import RangeEnd
from kclpy_spark.spark.read_timing import paced

MIB = 1024 * 1024


def end(nbytes: int, next_call_at: float | None) -> RangeEnd:
    return RangeEnd("k", None, None, 1, nbytes, next_call_at=next_call_at)


@pytest.mark.parametrize(
    ("nbytes", "next_call_at", "done", "want", "why"),
    [
        (MIB, None, 103.0, 103.5, "no call's time from the task: the pause counts from the end"),
        (MIB, 5000.3, 103.0, 103.3, "the task's own figure, 0.3 s from the job's end"),
        (MIB, 4999.0, 103.0, 103.0, "the call may be made now: at the job's end"),
        (MIB, 4990.0, 100.1, 100.5, "a task clock ahead: never before the pause from the begin"),
        (0, 5000.1, 103.0, 103.1, "an empty page: the calls' interval as the task paced it"),
        (MIB, 9e3, 103.0, 103.0 + MAX_READ_PAUSE, "a task clock far behind: the longest pause"),
    ],
)
def test_when_the_shard_is_called_again(
    nbytes: int, next_call_at: float | None, done: float, want: float, why: str
) -> None:
    got = paced(
        end(nbytes, next_call_at), 100.0, done=done, wall=5000.0, min_interval=0.2,
        read_rate=2 * MIB,
    )  # fmt: skip
    assert got == pytest.approx(want), why
