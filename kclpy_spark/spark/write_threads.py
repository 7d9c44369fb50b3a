"""The threads sink writes run on, so that a write that never answers can be given up on.

``count`` long-lived daemon threads take calls from one queue (Spark keeps a JVM thread per Python
thread, so they are not recycled). ``abandon(future)`` gives up on a call that is still running:
its thread is left to finish it and then ends, and a fresh thread takes its place, so the threads
alive are ``count`` plus the calls still hung. At most ``max_hung`` may hang at once; beyond that
``submit`` refuses (``TooManyHungWritesError``) rather than add threads without bound. Daemon
threads, and not ``concurrent.futures`` ones (joined when the interpreter exits): a hung user
write never keeps the process from exiting. After ``close`` every call is refused
(``WriteThreadsClosedError``) and queued ones are cancelled.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from checkpoint.base.errors import KclpySparkError

log = logging.getLogger(__name__)


class WriteThreadsClosedError(KclpySparkError):
    """The sink is closing: the write was not started (not a failure of the sink)."""


class TooManyHungWritesError(KclpySparkError):
    """Too many writes hang already: no thread is started for another one."""


_Call = tuple[Callable[[], Any], "Future[Any]"]


class WriteThreads:
    def __init__(self, count: int, name: str, max_hung: int) -> None:
        self._name = name
        self._max_hung = max_hung
        self._lock = threading.Lock()
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._hung: set[Future[Any]] = set()
        self._leaving: set[threading.Thread] = set()  # will end after their hung call
        self._running: dict[Future[Any], threading.Thread] = {}
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._closed = False
        self._serial = 0
        for _ in range(count):
            self._start()

    def _start(self) -> None:
        self._serial += 1
        thread = threading.Thread(
            target=self._loop, name=f"{self._name}-{self._serial}", daemon=True
        )
        self._threads.add(thread)
        thread.start()

    @property
    def alive(self) -> int:
        with self._lock:
            return sum(t.is_alive() for t in list(self._threads))

    @property
    def max_hung(self) -> int:
        return self._max_hung

    @property
    def hung(self) -> int:
        with self._lock:
            return len(self._hung)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise WriteThreadsClosedError("the sink is closing; the write was not started")
            if len(self._hung) >= self._max_hung:
                raise TooManyHungWritesError(
                    f"{len(self._hung)} sink write(s) hang already (at most {self._max_hung}); "
                    "not starting another until one returns"
                )
            self._calls.put((fn, future))
        return future

    def abandon(self, future: Future[Any]) -> bool:
        """Give up on ``future``: True when it was left running (a thread replaces its own),
        False when it had not started (cancelled) or has ended meanwhile."""
        if future.cancel() or future.done():
            return False
        with self._lock:
            thread = self._running.get(future)
            if thread is None or future.done():
                return False
            self._hung.add(future)
            self._leaving.add(thread)
            if not self._closed:
                self._start()
        future.add_done_callback(self._returned)
        return True

    def _returned(self, future: Future[Any]) -> None:
        with self._lock:
            self._hung.discard(future)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            alive = sum(t.is_alive() for t in list(self._threads))
        while True:  # cancel what is queued; wake every thread to end
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                call[1].cancel()
        for _ in range(alive):
            self._calls.put(None)

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            call = self._calls.get()
            if call is None:
                return
            fn, future = call
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running[future] = me
            try:
                result = fn()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._running.pop(future, None)
                    leaving = me in self._leaving
                    self._leaving.discard(me)
            if leaving:
                log.info("a sink write given up on has returned; its thread ends")
                return
