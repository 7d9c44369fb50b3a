"""The batch's life: every move the table allows, every other refused (pure)."""

from __future__ import annotations

import itertools

import pytest

from kclpy_spark.spark.batch_life import MOVES, Batch, BatchState, BatchStateError

S = BatchState
ALLOWED = {
    (S.CUT, S.PREPARED),
    (S.CUT, S.PARKED),
    (S.CUT, S.ABANDONED),
    (S.PREPARED, S.WRITTEN),
    (S.PREPARED, S.DEAD_LETTERED),
    (S.PREPARED, S.PARKED),
    (S.PREPARED, S.ABANDONED),
    (S.PREPARED, S.REREAD),  # read on the executors: the rows stored there are gone
}


@pytest.mark.parametrize(("start", "to"), list(itertools.product(S, S)))
def test_each_move_is_allowed_only_when_listed(start: BatchState, to: BatchState) -> None:
    batch = Batch([], state=start)
    if (start, to) in ALLOWED:
        batch.move(to)
        assert batch.state is to
    else:
        with pytest.raises(BatchStateError, match=f"from {start.value} to {to.value}"):
            batch.move(to)
        assert batch.state is start


def test_the_table_is_the_one_spelled_out_here() -> None:
    assert {(a, b) for a, tos in MOVES.items() for b in tos} == ALLOWED


@pytest.mark.parametrize("state", list(S))
def test_settled_means_no_move_left(state: BatchState) -> None:
    assert state.settled == (state not in (S.CUT, S.PREPARED))


def test_a_batch_starts_cut_and_cannot_be_written_before_it_is_prepared() -> None:
    batch = Batch([])
    assert batch.state is S.CUT
    with pytest.raises(BatchStateError):
        batch.move(S.WRITTEN)
    batch.move(S.PREPARED)
    batch.move(S.WRITTEN)
    with pytest.raises(BatchStateError):  # written twice, or put back after it was written
        batch.move(S.PARKED)
