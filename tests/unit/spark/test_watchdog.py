"""The watchdog: one thread fires every write timeout; cancelled deadlines never fire and do not
pile up."""

from __future__ import annotations

import threading

import pytest

from kclpy_spark.spark.watchdog import Watchdog


def test_a_deadline_fires_once_and_a_cancelled_one_never() -> None:
    dog = Watchdog()
    fired = threading.Event()
    never: list[str] = []
    try:
        late = dog.after(60.0, lambda: never.append("late"))
        soon = dog.after(0.01, fired.set)
        assert fired.wait(10.0) and soon.fired.is_set()
        late.cancel()
        assert not late.fired.is_set() and never == []
    finally:
        dog.close()
    with pytest.raises(RuntimeError):
        dog.after(1.0, lambda: None)


def test_one_thread_whatever_the_number_of_deadlines_and_cancelled_ones_are_dropped() -> None:
    before = threading.active_count()
    dog = Watchdog()
    try:
        for _ in range(1000):  # a thousand writes that finished before their timeout
            dog.after(600.0, lambda: None).cancel()
        assert threading.active_count() == before + 1
        assert dog.scheduled <= 17
    finally:
        dog.close()
    assert not dog.alive


def test_a_failing_callback_does_not_stop_the_watchdog() -> None:
    dog = Watchdog()
    fired = threading.Event()

    def bad() -> None:
        raise RuntimeError("boom")

    try:
        dog.after(0.0, bad)
        dog.after(0.02, fired.set)
        assert fired.wait(10.0)
    finally:
        dog.close()
