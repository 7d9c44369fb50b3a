"""A thread pool whose idle threads end: every pool of the daemon (processor calls, lease-table
calls, renewals, Spark watchdog callbacks).

The standard ``ThreadPoolExecutor`` starts a thread whenever a call finds none idle and keeps it
for the life of the pool, so over weeks its size is the highest number of calls ever in flight at
once (a take of several leases while others checkpoint), not what runs now: the soaks of
2026-11-24 saw the daemon's threads climb 18 -> 20, then 13 -> 14 and 20 -> 21, in half an hour.
Here a thread that has waited ``idle_seconds`` for work ends, so the count follows the calls of
the last ``idle_seconds``.

A subclass of ThreadPoolExecutor (asyncio's ``set_default_executor`` takes nothing else) that
replaces how threads start and end, with its own count of idle threads under the pool's lock:

* a submitted call is queued, then threads are started while more calls wait than threads are
  idle (up to ``max_workers``); a started thread counts as idle;
* a thread that takes a call stops counting as idle and tops the pool up again (a call submitted
  just before it stopped counting must not wait behind it);
* a thread that waited ``idle_seconds`` ends only if, under the lock, no call is queued;
  otherwise it takes it.

Calls are only queued under the lock, so "no call queued" seen there is true, and a queued call
always has an idle thread coming for it or every thread busy."""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import thread as _thread
from typing import Any, TypeVar, cast

IDLE_SECONDS = 30.0

T = TypeVar("T")

__all__ = ["IDLE_SECONDS", "RetiringThreadPool"]


class RetiringThreadPool(ThreadPoolExecutor):
    """``ThreadPoolExecutor`` with at most ``max_workers`` threads, each ending after
    ``idle_seconds`` without work."""

    def __init__(
        self, max_workers: int, thread_name_prefix: str, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        if idle_seconds <= 0:
            raise ValueError("idle_seconds must be positive")
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix)
        self._idle_seconds = idle_seconds
        self._idle = 0
        self._names = itertools.count()

    @property
    def thread_count(self) -> int:
        with self._shutdown_lock:
            return len(self._threads)

    @property
    def _live(self) -> set[threading.Thread]:
        return cast(set[threading.Thread], self._threads)  # typeshed: AbstractSet

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``. Our own work items, not the standard pool's (whose
        private ``run`` changes between Python versions)."""
        with self._shutdown_lock:
            if self._shutdown or _thread._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[T] = Future()
            cast(Any, self._work_queue).put(_Call(future, fn, args, kwargs))
            self._top_up()
            return future

    def _top_up(self) -> None:
        while self._work_queue.qsize() > self._idle and len(self._threads) < self._max_workers:
            self._start_thread()

    def _start_thread(self) -> None:
        def wake(_: object, q: Any = self._work_queue) -> None:
            q.put(None)  # the pool was collected without shutdown(): let its threads end

        t = threading.Thread(
            name=f"{self._thread_name_prefix}_{next(self._names)}",
            target=_serve,
            args=(weakref.ref(self, wake), self._work_queue, self._idle_seconds),
            daemon=True,
        )
        self._idle += 1
        t.start()
        self._live.add(t)
        # joined at interpreter exit, as the standard pool's threads are
        cast(MutableMapping[Any, Any], _thread._threads_queues)[t] = self._work_queue

    def _took_call(self) -> None:
        with self._shutdown_lock:
            self._idle -= 1
            self._top_up()

    def _done_call(self) -> None:
        with self._shutdown_lock:
            self._idle += 1

    def _may_end(self, me: threading.Thread) -> bool:
        """After ``idle_seconds`` without work: True (and ``me`` forgotten) unless a call is
        queued."""
        with self._shutdown_lock:
            if self._work_queue.qsize() > 0:
                return False
            self._idle -= 1
            self._live.discard(me)
            return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)
        if wait:
            with self._shutdown_lock:
                threads = list(self._threads)  # idle threads leave the set as they end
            for t in threads:
                t.join()


class _Call:
    """One submitted call; ``future`` is what ``shutdown(cancel_futures=True)`` cancels."""

    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:
            self.future.set_exception(exc)
            del self  # no cycle: the traceback's frame would hold the future holding it
        else:
            self.future.set_result(result)


def _serve(
    pool_ref: weakref.ref[RetiringThreadPool], work: queue.SimpleQueue[Any], idle: float
) -> None:
    me = threading.current_thread()
    while True:
        try:
            item = work.get(timeout=idle)
        except queue.Empty:
            pool = pool_ref()
            if pool is None or pool._may_end(me):
                return
            del pool
            continue
        if item is None:  # shutdown(), interpreter exit or the pool collected
            pool = pool_ref()
            if _thread._shutdown or pool is None or pool._shutdown:
                if pool is not None:
                    pool._shutdown = True
                work.put(None)  # wake the next thread
                return
            del pool
            continue
        pool = pool_ref()
        if pool is not None:
            pool._took_call()
        del pool
        item.run()
        del item
        pool = pool_ref()
        if pool is not None:
            pool._done_call()
        del pool
