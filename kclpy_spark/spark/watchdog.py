"""One thread that fires deadlines: the write timeouts of every writer thread.

A timer thread per write attempt would make the thread count follow the number of batches; the
watchdog is one daemon thread, started at first use, whatever the number of writes. Due callbacks
run on a small pool of its own (``callback_threads``), so one interrupt that hangs (Spark not
answering, which is when timeouts fire) does not hold back the others. After ``close`` new
deadlines are inert: a write still running while the process stops is not failed for it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from checkpoint.base.threads import RetiringThreadPool

log = logging.getLogger(__name__)


class Deadline:
    """A scheduled callback; ``cancel()`` before it fires and it never runs."""

    def __init__(self, at: float, callback: Callable[[], None], owner: Watchdog) -> None:
        self.at = at
        self.callback = callback
        self.cancelled = False
        self.fired = threading.Event()
        self._owner = owner

    def cancel(self) -> None:
        self._owner._cancel(self)


class Watchdog:
    def __init__(self, name: str = "kclpy-spark-watchdog", callback_threads: int = 2) -> None:
        self._name = name
        self._callbacks = RetiringThreadPool(callback_threads, f"{name}-fire")
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cancelled = 0  # cancelled deadlines still in the heap

    def after(self, seconds: float, callback: Callable[[], None]) -> Deadline:
        """Run ``callback`` in ``seconds`` unless cancelled first."""
        deadline = Deadline(time.monotonic() + seconds, callback, self)
        with self._cond:
            if self._closed:
                deadline.cancelled = True  # inert: the process is stopping
                return deadline
            heapq.heappush(self._heap, (deadline.at, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return deadline

    @property
    def scheduled(self) -> int:
        """Deadlines not yet fired or dropped (cancelled ones are dropped when due)."""
        with self._cond:
            return len(self._heap)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cancelled = 0
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        # A callback still running (a Spark interrupt to a JVM or server that stopped answering,
        # just when deadlines fire) is left: joined at interpreter exit, it kept the process
        # from ending, with its stop signals already ignored.
        self._callbacks.abandon(0.0)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    self._drop_cancelled()
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        _, _, due = heapq.heappop(self._heap)
                        due.fired.set()
                        break
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
            try:
                self._callbacks.submit(_run, due.callback)
            except RuntimeError:  # closed meanwhile
                return

    def _cancel(self, deadline: Deadline) -> None:
        with self._cond:
            if deadline.cancelled or deadline.fired.is_set():
                return
            deadline.cancelled = True
            self._cancelled += 1
            # Cancelled deadlines would otherwise stay until due (write_timeout later): the heap
            # is rebuilt once they are most of it, so its size follows the writes in flight.
            if self._cancelled > 16 and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _drop_cancelled(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
            self._cancelled -= 1


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        log.exception("a watchdog callback failed")
