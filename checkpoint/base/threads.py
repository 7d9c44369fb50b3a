"""A thread pool whose idle threads end: every pool of the daemon (processor calls, lease-table
calls, renewals, Spark watchdog callbacks).

The standard ``ThreadPoolExecutor`` starts a thread whenever a call finds none idle and keeps it
for the life of the pool, so over weeks its size is the highest number of calls ever in flight at
once (a take of several leases while others checkpoint), not what runs now: the soaks of
2026-11-24 saw the daemon's threads climb 18 -> 20, then 13 -> 14 and 20 -> 21, in half an hour.
Here a thread that has waited ``idle_seconds`` for work ends, so the count follows the calls of
the last ``idle_seconds``. Calls go to the thread that became idle *last* (a stack, not one shared
queue): with one shared queue a steady trickle of calls wakes every idle thread in turn, none is
ever idle for long, and the count stays at the highest burst since start (soak run 3: 19 -> 20,
late, for good); with the stack, surplus threads stay idle and end.

A subclass of ThreadPoolExecutor (asyncio's ``set_default_executor`` takes nothing else) that
replaces how calls reach threads, everything under the pool's lock:

* ``submit`` hands the call to the most recently idle thread (its own one-slot queue), else
  starts a thread with it (up to ``max_workers``), else appends it to a backlog;
* a thread that finished a call takes the oldest backlog call, else pushes itself on the idle
  stack and waits ``idle_seconds`` on its slot;
* a thread whose wait ran out ends if it is still on the stack; if it is not, a call was handed
  to it meanwhile, and it runs that call.

So a call is always either handed to a thread or in the backlog with every thread busy."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import thread as _thread
from typing import Any, TypeVar, cast

IDLE_SECONDS = 30.0

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["IDLE_SECONDS", "RetiringThreadPool", "pool_limits"]

_POOLS: weakref.WeakSet[RetiringThreadPool] = weakref.WeakSet()  # every pool not collected
_POOLS_LOCK = threading.Lock()  # a WeakSet's iteration must not meet an add from another thread


def pool_limits() -> dict[str, int]:
    """The most threads each pool prefix may have now: the ``max_workers`` of its pools that
    are not shut down, summed by prefix (what ``kclpy_spark_thread_pool_limit`` exports). A
    thread that retires is forgotten just before it ends, so for that instant a pool's threads
    may be one over while a new one starts."""
    limits: collections.Counter[str] = collections.Counter()
    with _POOLS_LOCK:
        pools = list(_POOLS)
    for pool in pools:
        if not pool._shutdown:
            limits[pool._thread_name_prefix or "ThreadPoolExecutor"] += pool._max_workers
    return dict(limits)


class RetiringThreadPool(ThreadPoolExecutor):
    """``ThreadPoolExecutor`` with at most ``max_workers`` threads, each ending after
    ``idle_seconds`` without work; calls go to the most recently idle thread."""

    def __init__(
        self, max_workers: int, thread_name_prefix: str, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        if idle_seconds <= 0:
            raise ValueError("idle_seconds must be positive")
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix)
        self._idle_seconds = idle_seconds
        self._idle_stack: list[queue.SimpleQueue[Any]] = []  # the last one became idle last
        self._backlog: collections.deque[_Call] = collections.deque()
        self._slots: set[queue.SimpleQueue[Any]] = set()  # every live thread's slot
        self._names = itertools.count()
        with _POOLS_LOCK:
            _POOLS.add(self)

    @property
    def thread_count(self) -> int:
        with self._shutdown_lock:
            return len(self._threads)

    @property
    def _live(self) -> set[threading.Thread]:
        return cast(set[threading.Thread], self._threads)  # typeshed: AbstractSet

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` on a thread. Our own work items, not the standard pool's
        (whose private ``run`` changes between Python versions)."""
        # The global lock too, as the standard pool: interpreter exit must not run between the
        # check and a thread's registration (or a call handed to a thread it just woke to end).
        with self._shutdown_lock, _thread._global_shutdown_lock:
            if self._shutdown or _thread._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[T] = Future()
            call = _Call(future, fn, args, kwargs)
            if self._idle_stack:
                self._idle_stack.pop().put(call)
            elif len(self._threads) < self._max_workers:
                self._start_thread(call)
            else:
                self._backlog.append(call)
            return future

    def _start_thread(self, first: _Call) -> None:
        slot: queue.SimpleQueue[Any] = queue.SimpleQueue()
        slots = self._slots

        def wake(_: object) -> None:  # the pool was collected without shutdown(): end
            for each in list(slots):
                each.put(None)

        t = threading.Thread(
            name=f"{self._thread_name_prefix}_{next(self._names)}",
            target=_serve,
            args=(weakref.ref(self, wake), slot, self._idle_seconds),
            daemon=True,
        )
        slot.put(first)  # not in the thread's args: those live as long as the thread
        self._slots.add(slot)
        t.start()
        self._live.add(t)
        # joined at interpreter exit, as the standard pool's threads are (None ends it)
        cast(MutableMapping[Any, Any], _thread._threads_queues)[t] = slot

    def _next(self, slot: queue.SimpleQueue[Any], me: threading.Thread) -> _Call | bool | None:
        """After a call: the oldest backlog call; False when the thread must end (shutdown: it
        is forgotten); otherwise None, with ``slot`` pushed on the idle stack."""
        with self._shutdown_lock:
            if self._backlog:
                return self._backlog.popleft()
            if self._shutdown or _thread._shutdown:
                self._forget(slot, me)
                return False
            self._idle_stack.append(slot)
            return None

    def _forget(self, slot: queue.SimpleQueue[Any], me: threading.Thread) -> None:
        """``me`` ends (call with the lock held)."""
        if slot in self._idle_stack:
            self._idle_stack.remove(slot)
        self._slots.discard(slot)
        self._live.discard(me)

    def _ended(self, slot: queue.SimpleQueue[Any], me: threading.Thread) -> None:
        with self._shutdown_lock:
            self._forget(slot, me)

    def _may_end(self, slot: queue.SimpleQueue[Any], me: threading.Thread) -> bool:
        """After ``idle_seconds`` idle: True (and ``me`` forgotten) if still on the idle stack;
        False if a call was handed to it meanwhile (it is in ``slot``)."""
        with self._shutdown_lock:
            if slot not in self._idle_stack:
                return False
            self._forget(slot, me)
            return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Refuse new calls; backlog calls still run unless ``cancel_futures`` (a call already
        handed to a thread runs either way, as in the standard pool); idle threads end now, busy
        ones after their calls; ``wait``: until every thread ended."""
        with self._shutdown_lock:
            self._shutdown = True
            if cancel_futures:
                for call in self._backlog:
                    call.future.cancel()
                self._backlog.clear()
            idle, self._idle_stack = self._idle_stack, []
            threads = list(self._threads)
        for slot in idle:
            slot.put(None)
        if wait:
            for t in threads:
                t.join()

    def abandon(self, grace: float) -> int:
        """Shut down, waiting at most ``grace`` seconds for the calls still running; those that
        run on after it (a call that never returns) are not joined at interpreter exit either:
        the process ends without them. How many were abandoned."""
        self.shutdown(wait=False, cancel_futures=True)
        with self._shutdown_lock:
            busy = list(self._threads)
        end = time.monotonic() + grace
        for t in busy:
            t.join(max(0.0, end - time.monotonic()))
        left = [t for t in busy if t.is_alive()]
        queues = cast(MutableMapping[Any, Any], _thread._threads_queues)
        for t in left:
            queues.pop(t, None)
        return len(left)


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
    pool_ref: weakref.ref[RetiringThreadPool], slot: queue.SimpleQueue[Any], idle: float
) -> None:
    me = threading.current_thread()
    try:
        _serve_calls(pool_ref, slot, idle, me)
    except BaseException:  # a bug here must not leave a thread counted that is gone
        log.exception("a pool thread failed")
    finally:
        pool = pool_ref()
        if pool is not None:
            pool._ended(slot, me)


def _serve_calls(
    pool_ref: weakref.ref[RetiringThreadPool],
    slot: queue.SimpleQueue[Any],
    idle: float,
    me: threading.Thread,
) -> None:
    """Wait on ``slot`` for a call (the first one is there at start), run it, then the backlog's
    calls; then wait on the slot again, on the idle stack. Nothing holds a call once it ran (its
    result, arguments and context would live as long as the thread)."""
    while True:
        try:
            item = slot.get(timeout=idle)
        except queue.Empty:
            pool = pool_ref()
            if pool is None:  # collected without shutdown: run what was handed over, then end
                with contextlib.suppress(queue.Empty):
                    last = slot.get_nowait()
                    if last is not None:
                        last.run()
                return
            if pool._may_end(slot, me):
                return
            del pool
            item = slot.get()  # handed to us just as we ran out of patience
        if item is None:  # shutdown(), interpreter exit or the pool collected
            return
        item.run()
        item = None
        while True:
            pool = pool_ref()
            if pool is None:
                return
            follow = pool._next(slot, me)
            del pool
            if follow is None:
                break  # on the idle stack: wait on the slot
            if follow is False:
                return
            assert isinstance(follow, _Call)
            follow.run()
            follow = None
