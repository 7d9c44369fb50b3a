"""Which write failures mean the rows a read stored on the executors are gone (``frames``)."""

from __future__ import annotations

import pytest

from kclpy_spark.spark.acks import SinkFailedError
from kclpy_spark.spark.frames import stored_rows_lost

LOST = RuntimeError(
    "An error occurred while calling o37.parquet.\n: org.apache.spark.SparkException: "
    "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_3_1 not found!"
)


def _chained(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (LOST, True),
        (_chained(TimeoutError("the write failed"), LOST), True),
        (SinkFailedError("audit", LOST), True),  # one sink's of several
        (RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] no table"), False),
        (SinkFailedError("audit", ValueError("bad row")), False),
        (None, False),
    ],
)
def test_only_a_lost_stored_block_says_the_rows_are_gone(
    error: BaseException | None, lost: bool
) -> None:
    assert stored_rows_lost(error) is lost


def test_a_cycle_of_causes_ends() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert stored_rows_lost(a) is False
