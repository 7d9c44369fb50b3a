"""The acknowledgment set of one batch: a reference count over its sinks (pure, table-driven)."""

from __future__ import annotations

import pytest

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.spark.acks import DEAD_LETTERED, FAILED, WRITTEN, AckSet, SinkFailedError

BOOM = RuntimeError("boom")


@pytest.mark.parametrize(
    ("answers", "waiting", "done", "failed", "dead_lettered"),
    [
        ([], ("a", "b"), False, False, False),
        ([("a", WRITTEN)], ("b",), False, False, False),
        ([("b", WRITTEN)], ("a",), False, False, False),
        ([("a", WRITTEN), ("b", WRITTEN)], (), True, False, False),
        ([("a", WRITTEN), ("b", DEAD_LETTERED)], (), True, False, True),
        ([("a", DEAD_LETTERED), ("b", DEAD_LETTERED)], (), True, False, True),
        ([("a", FAILED)], ("b",), False, True, False),
        ([("a", WRITTEN), ("b", FAILED)], (), False, True, False),
        ([("a", DEAD_LETTERED), ("b", FAILED)], (), False, True, True),
    ],
)
def test_the_checkpoint_waits_for_every_sink_and_one_failure_fails_the_batch(
    answers: list[tuple[str, str]],
    waiting: tuple[str, ...],
    done: bool,
    failed: bool,
    dead_lettered: bool,
) -> None:
    acks = AckSet(("a", "b"))
    for name, outcome in answers:
        acks.answer(name, outcome, BOOM if outcome != WRITTEN else None)
    assert acks.waiting == waiting
    assert (acks.done, acks.failed, acks.dead_lettered) == (done, failed, dead_lettered)
    assert acks.written_any == any(outcome == WRITTEN for _, outcome in answers)


def test_a_sink_answers_once_and_only_sinks_of_the_batch_answer() -> None:
    acks = AckSet(("a", "b"))
    acks.answer("a", WRITTEN)
    with pytest.raises(ValueError, match="already answered"):
        acks.answer("a", FAILED, BOOM)
    with pytest.raises(KeyError):
        acks.answer("c", WRITTEN)
    with pytest.raises(ValueError, match="unknown"):
        acks.answer("b", "maybe")
    for bad in ((), ("a", "a")):
        with pytest.raises(ValueError, match="distinct"):
            AckSet(bad)


def test_the_error_names_the_failed_sink_when_there_are_several() -> None:
    one = AckSet(("only",))
    one.answer("only", FAILED, BOOM)
    assert one.error() is BOOM
    two = AckSet(("parquet", "alerts"))
    two.answer("parquet", WRITTEN)
    two.answer("alerts", FAILED, BOOM)
    error = two.error()
    assert isinstance(error, SinkFailedError) and isinstance(error, KclpySparkError)
    assert error.sink == "alerts" and error.error is BOOM and "alerts" in str(error)
    assert not error.retriable
    assert AckSet(("a",)).error() is None
