"""The watchdog: one thread fires every write timeout; cancelled deadlines never fire and do not
pile up; a hung callback does not hold back the others; after close, deadlines are inert."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from kclpy_spark.spark import timed_write
from kclpy_spark.spark.sink_batch import NoInterrupter
from kclpy_spark.spark.timed_write import TimedWrites
from kclpy_spark.spark.watchdog import Watchdog


def test_a_deadline_fires_and_a_cancelled_one_never() -> None:
    dog = Watchdog()
    fired = threading.Event()
    cancelled: list[str] = []
    try:
        with dog._cond:  # the loop cannot fire it before it is cancelled, however late this runs
            early = dog.after(0.02, lambda: cancelled.append("fired"))
            early.cancel()  # due before the one that fires: the loop passes it by
        later = dog.after(0.1, fired.set)
        assert fired.wait(10.0) and later.fired.is_set()
        time.sleep(0.05)
        assert cancelled == [] and not early.fired.is_set()
    finally:
        dog.close()


def test_one_thread_and_cancelled_deadlines_behind_a_live_one_are_compacted() -> None:
    dog = Watchdog(name="watchdog-compaction")
    try:
        live = dog.after(500.0, lambda: None)  # at the head: the loop cannot drop what follows
        for _ in range(1000):  # a thousand writes that finished before their timeout
            dog.after(600.0, lambda: None).cancel()
        mine = [t for t in threading.enumerate() if t.name.startswith("watchdog-compaction")]
        assert len(mine) == 1  # no thread per deadline (no callback ran: no pool thread)
        assert dog.scheduled <= 1 + 17  # without compaction: 1001
        live.cancel()
    finally:
        dog.close()
    assert not dog.alive


def test_a_hung_callback_does_not_hold_back_the_next_deadline() -> None:
    dog = Watchdog(callback_threads=2)
    hang = threading.Event()
    fired = threading.Event()

    def hung() -> None:
        hang.wait(10.0)  # an interrupt request Spark never answers

    def bad() -> None:
        raise RuntimeError("boom")

    try:
        dog.after(0.0, hung)
        dog.after(0.0, bad)
        dog.after(0.05, fired.set)
        assert fired.wait(5.0)
    finally:
        hang.set()
        dog.close()


def test_after_close_deadlines_are_inert_not_errors() -> None:
    dog = Watchdog()
    dog.close()
    fired: list[int] = []
    deadline = dog.after(0.0, lambda: fired.append(1))
    deadline.cancel()
    time.sleep(0.05)
    assert fired == [] and not deadline.fired.is_set()


_HUNG_INTERRUPT = textwrap.dedent(
    """
    import threading, time
    from kclpy_spark.spark.sink_batch import NoInterrupter
    from kclpy_spark.spark.timed_write import TimedWrites

    class HungSpark(NoInterrupter):
        def interrupt(self, tag):          # cancelJobsWithTag / interruptTag to a JVM
            threading.Event().wait()       # that answers no more

    writes = TimedWrites(1, HungSpark())
    try:
        writes.call(lambda: time.sleep(0.3), 0.05, "tag", "a write")  # overruns: interrupt
    except Exception as exc:
        print("write:", type(exc).__name__)
    writes.close()                         # what MicroBatcher.close() ends with
    print("closed; exiting", flush=True)
    """
)


def test_the_process_exits_after_close_even_if_an_interrupt_hangs() -> None:
    """A write's interrupt to a JVM or Connect server that stopped answering (just when deadlines
    fire) ran on a pool thread joined at interpreter exit: after a clean stop the daemon never
    ended, its stop signals already ignored (only SIGKILL did)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HUNG_INTERRUPT],
        cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the process did not exit after close (output: {out!r})") from None
    assert "closed; exiting" in out


_PICKED_UP = threading.Event()
_GO_ON = threading.Event()


class _SlowToRegister(Future):  # type: ignore[type-arg]
    """The write thread is preempted right after moving the future to RUNNING."""

    def set_running_or_notify_cancel(self) -> bool:
        ok = super().set_running_or_notify_cancel()
        _PICKED_UP.set()
        _GO_ON.wait(10.0)
        return ok


def test_a_write_picked_up_at_its_deadline_is_abandoned_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given up on between its thread taking it and knowing it as its own, a write was taken for
    ended, and its caller waited on it with no deadline (a hung write: the writer thread lost,
    the batch's leases never drained)."""
    monkeypatch.setattr(timed_write, "Future", _SlowToRegister)
    writes = TimedWrites(1, NoInterrupter())
    sink_hangs = threading.Event()
    outcome: list[object] = []

    def caller() -> None:
        try:
            writes.call(lambda: sink_hangs.wait(60.0), 0.05, "tag", "a write")
            outcome.append("returned")
        except Exception as exc:  # WriteHungError expected
            outcome.append(exc)

    t = threading.Thread(target=caller, daemon=True)
    t.start()
    assert _PICKED_UP.wait(5.0)
    # the caller's wait (timeout + grace = 0.1 s) ends now; abandon() sees no thread yet
    t.join(0.5)
    _GO_ON.set()  # the write thread registers and runs the hanging write
    t.join(3.0)
    try:
        assert not t.is_alive(), "TimedWrites.call is blocked in future.result() on a hung write"
        assert isinstance(outcome[0], timed_write.WriteHungError)
    finally:
        sink_hangs.set()
        writes.close()
