"""The worker's run state: suspended and resumed (dated), stopping for good."""

from __future__ import annotations

import asyncio

import pytest

from checkpoint.base.clock import ManualClock
from kclpy_spark.runtime.run_state import RunState


@pytest.mark.parametrize(
    ("steps", "suspended", "may_take", "changed"),
    [
        ((), False, True, []),
        (("suspend",), True, False, [True]),
        (("suspend", "suspend"), True, False, [True, False]),
        (("resume",), False, True, [False]),
        (("suspend", "resume"), False, True, [True, True]),
        (("stop",), False, False, [None]),
        (("stop", "suspend", "resume"), False, False, [None, True, True]),
    ],
)
def test_each_change_says_whether_it_changed_anything(
    steps: tuple[str, ...], suspended: bool, may_take: bool, changed: list[bool | None]
) -> None:
    state = RunState("w", ManualClock().monotonic)
    said = [state.stop("test") if s == "stop" else getattr(state, s)() for s in steps]
    assert said == changed
    assert (state.suspended, state.may_take, state.stopping) == (
        suspended,
        may_take,
        "stop" in steps,
    )


def test_a_resume_is_dated_by_the_clock_and_a_repeat_keeps_the_date() -> None:
    clock = ManualClock()
    state = RunState("w", clock.monotonic)
    assert state.resumed_at == float("-inf")
    state.suspend()
    clock.advance(7.0)
    state.resume()
    assert state.resumed_at == clock.monotonic()
    clock.advance(3.0)
    assert not state.resume() and state.resumed_at == clock.monotonic() - 3.0


def test_a_stop_wakes_the_waiter_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        state = RunState("w1", ManualClock().monotonic)
        waiter = asyncio.ensure_future(state.stopped())
        await asyncio.sleep(0)
        assert not waiter.done()
        state.stop("signal")
        state.stop("again")
        await asyncio.wait_for(waiter, 1.0)

    with caplog.at_level("INFO", logger="kclpy_spark.runtime.run_state"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == ["worker w1: shutdown requested (signal)"]
