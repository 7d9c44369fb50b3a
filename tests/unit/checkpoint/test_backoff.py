"""Full-jitter backoff: each wait within its bound, the bound doubling to the cap, and one jitter
generator for the backoffs that bring none (a lease-table call or a checkpoint makes a backoff)."""

from __future__ import annotations

import random

import pytest

from checkpoint.base.retry import Backoff, RetryPolicy


@pytest.mark.parametrize(
    ("failures", "bound"),
    [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (6, 10.0), (1_000, 10.0)],
)
def test_the_bound_doubles_with_each_failure_up_to_the_cap(failures: int, bound: float) -> None:
    backoff = Backoff(random.Random(7), base=0.5, cap=10.0)
    assert backoff.bound(failures) == bound
    assert all(0.0 <= backoff.delay(failures) <= bound for _ in range(200))


def test_failures_are_counted_until_a_reset() -> None:
    backoff = Backoff(random.Random(1), base=1.0, cap=4.0)
    waits = [backoff.next_delay() for _ in range(4)]
    assert backoff.failures == 4 and all(w <= b for w, b in zip(waits, (1, 2, 4, 4), strict=True))
    backoff.reset()
    assert backoff.failures == 0 and backoff.next_delay() <= 1.0


def test_backoffs_without_a_generator_share_one() -> None:
    made = [Backoff(), RetryPolicy().backoff(), Backoff(base=1.0, cap=2.0)]
    assert len({id(b._rng) for b in made}) == 1
    mine = random.Random(3)
    assert Backoff(mine)._rng is mine


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 1.0), (2.0, 1.0)])
def test_a_bad_backoff_is_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(base=base, cap=cap)
