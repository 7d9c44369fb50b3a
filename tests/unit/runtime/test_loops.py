"""The worker's periodic loops: renewals keep their rate when a round is slow."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from checkpoint.base.clock import ManualClock
from kclpy_spark.runtime.worker import Worker


def _sleeps(rate: bool, step_seconds: float, interval: float = 3.3) -> list[float]:
    clock = ManualClock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        if len(slept) == 3:
            raise asyncio.CancelledError

    async def step() -> None:
        clock.advance(step_seconds)

    fake = SimpleNamespace(clock=clock, sleep=sleep, cfg=SimpleNamespace(worker_id="w"))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Worker._loop(fake, step, interval, rate=rate))  # type: ignore[arg-type]
    return slept


def test_a_rate_loop_starts_each_round_one_interval_after_the_last_began() -> None:
    assert _sleeps(rate=True, step_seconds=2.0) == [1.3, 1.3, 1.3]
    assert _sleeps(rate=True, step_seconds=5.0) == [0.0, 0.0, 0.0]  # late: at once


def test_other_loops_wait_one_interval_after_the_last_ended() -> None:
    assert _sleeps(rate=False, step_seconds=2.0) == [3.3, 3.3, 3.3]
