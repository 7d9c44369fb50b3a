"""A sink write with a deadline, and the threads writes run on.

One attempt (``TimedWrites.write``) runs on a sink-write thread, its Spark jobs tagged there; at
``timeout`` the jobs are interrupted (the watchdog, one thread for every write); a write that
still gives no answer after the grace that follows is abandoned, left running, and counts as
failed (``WriteHungError``, not retried while it may still run).

The threads (``WriteThreads``) are there so that a write that never answers can be given up on.

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
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.spark.sink_batch import BatchSink, Interrupter, SinkBatch
from kclpy_spark.spark.watchdog import Watchdog

log = logging.getLogger(__name__)
T = TypeVar("T")

# A write that overran its timeout gets this long (at most its timeout again) to end after its
# Spark jobs were interrupted; after that it counts as failed and is abandoned.
HUNG_GRACE = 30.0
# Writes that may hang at once per writer thread; beyond that writes are refused (and fail).
MAX_HUNG_PER_WRITER = 2


class WriteHungError(KclpySparkError):
    """A write gave no answer within its timeout and the grace after it: failed, left running."""


class SinkExitError(KclpySparkError):
    """A sink raised SystemExit or KeyboardInterrupt (``sys.exit()`` in a user function): a
    failed attempt like any other. Let through, it ended the writer thread, and no batch was
    written or parked again."""

    retriable = True


class WriteTimeoutError(KclpySparkError):
    """A write attempt overran its sink's ``write_timeout``: its Spark jobs were interrupted."""

    retriable = True


class TimedWrites:
    def __init__(
        self,
        writers: int,
        interrupter: Interrupter,
        watchdog: Watchdog | None = None,
        *,
        name: str = "kclpy-spark-sink-write",
    ) -> None:
        self._interrupter = interrupter
        self.watchdog = watchdog or Watchdog(callback_threads=writers)
        self.threads = WriteThreads(writers, name, MAX_HUNG_PER_WRITER * writers)

    def close(self) -> None:
        self.watchdog.close()
        self.threads.close()

    def write(
        self, sink: BatchSink, view: SinkBatch, timeout: float, index: str, of: str = ""
    ) -> None:
        """``sink.write(view)``, or raise: its own error, WriteTimeoutError (interrupted at the
        timeout), WriteHungError (no answer after the grace), or the threads' refusals."""
        tag = f"kclpy-spark-{view.batch_id:016x}-{index}-{view.attempt}"
        self.call(lambda: sink.write(view), timeout, tag, f"batch {view.batch_id}{of}")

    def call(self, fn: Callable[[], T], timeout: float, tag: str, what: str) -> T:
        """``fn()`` (a sink's code: a write, a sink's ``prepare``, a dead-letter write) on a
        sink-write thread, its Spark jobs tagged ``tag`` and interrupted at ``timeout``; raises
        as ``write`` does, ``what`` naming the call."""

        def on_timeout() -> None:
            log.warning("%s (%s) overran its %gs write timeout", what, tag, timeout)
            self._interrupter.interrupt(tag)

        deadline = self.watchdog.after(timeout, on_timeout)
        try:
            future = self.threads.submit(lambda: self._tagged(fn, tag))
            wait([future], timeout + min(HUNG_GRACE, timeout))
            if self.threads.abandon(future):
                log.error(
                    "%s (%s) gave no answer; abandoned (%d write(s) hung now)",
                    what,
                    tag,
                    self.threads.hung,
                )
                raise WriteHungError(
                    f"{what} gave no answer within {timeout:g}s and the grace after it: counted "
                    "as failed (the write is left running; not tried again while it may still "
                    "run)"
                )
            try:
                result: T = future.result()
            except Exception as exc:
                if deadline.fired.is_set():
                    raise WriteTimeoutError(f"{what} overran {timeout:g}s: {exc!r}") from exc
                raise
            return result
        finally:
            deadline.cancel()

    def _tagged(self, fn: Callable[[], T], tag: str) -> T:
        with self._interrupter.tagged(tag):  # on the thread that runs the Spark jobs
            return sink_call(fn)


def sink_call(call: Callable[[], T]) -> T:
    """``call()``: a sink's own code. SystemExit or KeyboardInterrupt from it is a SinkExitError
    (a failed attempt); let through, it would end the thread that runs it, and nothing more."""
    try:
        return call()
    except Exception:
        raise
    except BaseException as exc:
        raise SinkExitError(
            f"the sink raised {exc!r}; a sink fails a batch by raising an Exception"
        ) from exc


# --- the threads writes run on --------------------------------------------------------------------


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
            # Known as this thread's before it runs: ``abandon`` at that very moment found it
            # running and not yet ours, took it for ended, and its caller then waited on the
            # write without a deadline.
            with self._lock:
                self._running[future] = me
            if not future.set_running_or_notify_cancel():
                with self._lock:
                    self._running.pop(future, None)
                continue
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
