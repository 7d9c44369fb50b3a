"""One tenure: a lease held by this worker from its take to its end, and every way out of it.

A ``Tenure`` owns what a shard consumer shares with the worker about its lease: the held lease and
its checkpointer, the two signals that end it early (lost, shutdown requested) and the waits that
honour them, and its writes: those that end it on purpose, ``release`` (evict: any worker may take
it at once), ``park`` (release with a reopen time every worker sees) and ``finished`` (shard end),
each logged and leaving ``finishing`` set so the worker does not mistake the lease's going for a
loss; ``restart_at``, the aged-checkpoint policy's reset, and ``pin_start``, which fixes where a
LATEST lease began; after those the tenure goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from checkpoint.base.clock import AsyncSleep, Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import Checkpointer
from checkpoint.lease import Lease
from checkpoint.leasing.held_lease import HeldLease, UpdateResult
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.port import LeaseTable
from checkpoint.sequence import LATEST, ExtendedSequenceNumber
from kclpy_spark.runtime.lease_calls import lease_call
from kclpy_spark.runtime.loop_executor import processor_code

log = logging.getLogger(__name__)

T = TypeVar("T")


class Outcome(enum.StrEnum):
    SHARD_END = "shard_end"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    PARKED = "parked"
    RELEASED = "released"  # given back so another worker may try (a blocked merge child)
    CAUGHT_UP = "caught_up"  # until_caught_up: read to the tip as of start (the lease is kept)


@dataclass
class ShardStats:
    """Live figures for one shard (read by the status display and metrics)."""

    shard_id: str
    state: str = "waiting_on_parents"
    records: int = 0
    batches: int = 0
    bytes: int = 0
    millis_behind_latest: int | None = None
    last_delivered: str | None = None
    failures: int = 0
    park_reason: str = ""
    call_started: float | None = None  # monotonic start of the processor call running now


class LeaseLost(Exception):
    """Internal: the lease was lost while a step was waiting."""


class ShutdownSignal(Exception):
    """Internal: shutdown was requested while a step was waiting."""


class Parked(Exception):
    """Internal: the lease was parked (released with a reopen time); the step must end."""


class Tenure:
    def __init__(
        self,
        held: HeldLease,
        holder: LeaseHolder,
        table: LeaseTable,
        *,
        sleep: AsyncSleep,
        clock: Clock,
        on_checkpoint: Callable[[float], None] | None = None,
        on_event: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.held = held
        self._holder = holder
        self.table = table
        self._sleep = sleep
        self._clock = clock  # reopen times (wall) and the checkpointer's write timing
        self._on_checkpoint = on_checkpoint
        self._on_event = on_event  # (lease key, kind, detail): the worker's EventLog.add
        self.lost = asyncio.Event()
        self.shutdown = asyncio.Event()
        # True once the lease is given up on purpose (shard end, parking, release).
        self.finishing = False
        self.checkpointer = self._checkpointer(held.lease.checkpoint)

    def _checkpointer(self, largest: ExtendedSequenceNumber) -> Checkpointer:
        return Checkpointer(
            self._holder,
            self.lease_key,
            self.held.token,
            largest,
            on_write=self._on_checkpoint,
            monotonic=self._clock.monotonic,
        )

    @property
    def lease_key(self) -> str:
        return self.held.lease_key

    @property
    def lease(self) -> Lease:
        return self.held.lease

    @property
    def shard_id(self) -> str:
        return self.held.lease.shard_id

    # --- signals and waits -----------------------------------------------------------------------

    def current(self) -> HeldLease:
        """The lease as held now; raises LeaseLost if it is not held any more (lost signal, local
        expiry, a lost write) or held under a later tenure's token."""
        held = self._holder.get_if_held(self.lease_key)
        if self.lost.is_set() or held is None or held.token != self.held.token:
            raise LeaseLost()
        return held

    async def wait_or_stop(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` unless the lease is lost or shutdown is requested first."""
        task = asyncio.ensure_future(awaitable)
        lost = asyncio.ensure_future(self.lost.wait())
        stop = asyncio.ensure_future(self.shutdown.wait())
        try:
            done, _ = await asyncio.wait({task, lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Whatever ended the wait (a signal, or this task cancelled), nothing is left running.
            for t in (lost, stop, task):
                if not t.done():
                    t.cancel()
        if task in done:
            return task.result()
        raise LeaseLost() if self.lost.is_set() else ShutdownSignal()

    async def pause(self, seconds: float) -> None:
        """Sleep (the injected sleep) unless the lease is lost or shutdown is requested first."""
        await self.wait_or_stop(self._sleep(seconds))

    # --- ways out --------------------------------------------------------------------------------

    async def _release(self, change: Callable[[Lease], Lease] | None) -> UpdateResult:
        self.finishing = True
        return await lease_call(
            self._holder.release, self.lease_key, self.held.token, change=change
        )

    async def release(self, why: str, *, level: int = logging.WARNING) -> bool:
        """Evict the lease so any worker may take it now; True if the write won. This worker
        stops holding it whatever the outcome (a failed write: it expires for the others)."""
        try:
            won = (await self._release(None)).won
            outcome = "" if won else " - the write lost: another worker holds it already"
        except Exception as exc:
            won, outcome = False, f" - not written ({exc!r}); it expires instead"
        log.log(level, "shard %s: released its lease (%s)%s", self.shard_id, why, outcome)
        self._event("released", f"{why}{outcome}")
        return won

    async def park(self, reason: str, duration: float) -> None:
        """Release the lease with a reopen time ``duration`` seconds from now (CLOSED in status,
        visible to every worker); its records come again from the last checkpoint then."""
        reopen_at = self._clock.wall() + duration

        def parked(lease: Lease) -> Lease:
            return lease.parked(reopen_at)

        try:
            result = await self._release(parked)
            written = "written" if result.won else "write lost: another worker holds it"
        except Exception as exc:  # the table failed: the lease expires for others anyway
            written = f"not written ({exc}); it expires instead"
        log.error(
            "shard %s: parked (%s); it reopens in %.0fs and is redelivered from its last "
            "checkpoint (%s)",
            self.shard_id,
            reason,
            duration,
            written,
        )
        self._event("parked", f"{reason}; reopens in {duration:.0f}s ({written})")

    async def finished(self) -> None:
        """Shard end: give the lease up so no worker renews it; cleanup deletes it later."""
        result = await self._release(None)
        if not result.won:
            log.warning("shard %s: releasing the finished lease lost its write", self.shard_id)
        self._event("finished", "shard end: every record read and checkpointed")

    def _event(self, kind: str, detail: str) -> None:
        if self._on_event is not None:
            self._on_event(self.lease_key, kind, detail)

    async def restart_at(self, target: ExtendedSequenceNumber) -> None:
        """Move the checkpoint to ``target`` (a reset by policy, which may go backwards) and give
        the processor a checkpointer that starts there. Raises LeaseLost if that fails."""
        held = self.current()

        def write(lease: Lease) -> Lease | None:
            # A reset drops a LATEST lease's pinned start too: the next read pins anew.
            return self.table.update_lease(
                replace(lease.checkpointed(target), start_timestamp=None)
            )

        result = await lease_call(self._holder.update, self.lease_key, held.token, write)
        if not result.won or result.lease is None:
            raise LeaseLost()
        self.held = HeldLease(result.lease, held.token, held.last_counter_change)
        self.checkpointer = self._checkpointer(result.lease.checkpoint)

    async def pin_start(self, since: float) -> None:
        """A lease checkpointed at LATEST starts reading now: store ``since`` beside its LATEST
        checkpoint, so whoever of ours reads it next (this tenure after a failed read, a later
        one after a park, a crash or a hand-over) starts there (AT_TIMESTAMP) instead of at a
        new LATEST, which would skip what was written in between. The checkpoint stays LATEST:
        a Java KCL worker reads the AT_TIMESTAMP sentinel with its own configured time, none
        under LATEST (it failed on the lease for good). A checkpoint() before any delivery
        writes LATEST again and keeps the time. Raises LeaseLost if the write did not win."""

        def write(lease: Lease) -> Lease | None:
            pinned = replace(lease.checkpointed(LATEST), start_timestamp=since)
            return self.table.update_lease(pinned)

        held = self.current()
        result = await lease_call(self._holder.update, self.lease_key, held.token, write)
        if not result.won or result.lease is None:
            raise LeaseLost()
        self.held = HeldLease(result.lease, held.token, held.last_counter_change)

    async def update(self, write: Callable[[Lease], Lease | None]) -> Lease:
        """One conditional write of the held lease; raises LeaseLost if it did not win."""
        held = self.current()
        result = await lease_call(self._holder.update, self.lease_key, held.token, write)
        if not result.won or result.lease is None:
            raise LeaseLost()
        return result.lease


def call_processor(
    method: Callable[[Any], Any],
    arg: object,
    on_thread: Callable[[asyncio.Future[Any]], None],
) -> Awaitable[None]:
    """Call a processor method: ``async def`` ones on the loop, plain ones in a thread.
    ``sys.exit()`` in it (and KeyboardInterrupt in a thread, where only user code raises it) is a
    ProcessorExitError: a failed call, not the daemon's end with the status it chose.
    ``on_thread`` is told the thread's future: cancelling the caller does not stop the thread,
    and whoever starts another call for the lease must wait for it. What it runs in threads
    (itself, and ``asyncio.to_thread`` in it) runs on the processor pool (loop_executor.py)."""

    async def run() -> None:
        with processor_code():
            try:
                result = await _on_loop_or_thread(method, arg, on_thread)
                if asyncio.iscoroutine(result):
                    await result
            except SystemExit as exc:
                raise exited(method, exc) from exc
            except asyncio.CancelledError as exc:
                _unless_ours(method, exc)

    return run()


async def _on_loop_or_thread(
    method: Callable[[Any], Any],
    arg: object,
    on_thread: Callable[[asyncio.Future[Any]], None],
) -> Any:
    from kclpy_spark.processor import is_async

    if is_async(method):
        await method(arg)
        return None
    # asyncio.to_thread's way (this context's variables on the thread); ``returned`` ends when
    # the thread's call does (the awaited future is cancelled with its caller).
    loop = asyncio.get_running_loop()
    returned: asyncio.Future[None] = loop.create_future()
    context = contextvars.copy_context()
    started = _Started()
    call = functools.partial(context.run, _told, in_thread, method, arg, returned, started)
    on_thread(returned)
    queued = loop.run_in_executor(None, call)
    queued.add_done_callback(functools.partial(_unless_started, started, returned))
    return await queued


class _Started:
    """Whether a processor call queued for a thread began there, or was dropped before it did
    (its caller cancelled while every thread was busy: it never runs)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.began = False
        self.dropped = False


def _unless_started(
    started: _Started, returned: asyncio.Future[None], queued: asyncio.Future[Any]
) -> None:
    """On the loop, when the queued call's future is done: cancelled before its thread took it,
    the call never runs, so ``returned`` is done now (nothing would ever tell it: the lease
    stayed out of this worker for good, waiting for a call that never ran)."""
    if not queued.cancelled():
        return
    with started.lock:
        if started.began:
            return  # running on: _told tells when it ends
        started.dropped = True
    _set_done(returned)


def _told(
    call: Callable[[Callable[[Any], Any], object], Any],
    method: Callable[[Any], Any],
    arg: object,
    returned: asyncio.Future[None],
    started: _Started,
) -> Any:
    """``call(method, arg)`` on the thread, then ``returned`` done on its loop; nothing if the
    call was dropped before the thread took it."""
    with started.lock:
        if started.dropped:
            return None
        started.began = True
    try:
        return call(method, arg)
    finally:
        loop = returned.get_loop()
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_set_done, returned)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def in_thread(method: Callable[[Any], Any], arg: object) -> Any:
    """``method(arg)`` on a worker thread; KeyboardInterrupt there is the user code's own, and
    so is a cancelled future's CancelledError (an Exception there, which the loop's wrapper of
    the thread's future turns into asyncio's, a cancel of the consumer's task)."""
    try:
        return method(arg)
    except (
        SystemExit,
        KeyboardInterrupt,
        asyncio.CancelledError,
        concurrent.futures.CancelledError,
    ) as exc:
        raise exited(method, exc) from exc


def _unless_ours(method: Callable[[Any], Any], exc: asyncio.CancelledError) -> None:
    """Raise ``exc`` again if the calling task is being cancelled; else it is the processor's
    own (an ``async def`` awaiting something cancelled): a failed call. Taken for a cancel of
    the consumer, it ended the lease's task without a release, the lease renewed unread."""
    task = asyncio.current_task()
    if task is None or task.cancelling():
        raise exc
    raise exited(method, exc) from exc


def exited(what: object, exc: BaseException) -> ProcessorExitError:
    name = getattr(what, "__name__", "the processor")
    return ProcessorExitError(
        f"{name} raised {exc!r}; a processor fails a call by raising an Exception"
    )


class ProcessorExitError(KclpySparkError):
    """A processor method raised SystemExit or KeyboardInterrupt: counted as a failed call (it
    ended the whole daemon with the exit status the processor chose, 0 for ``sys.exit()``); or
    a CancelledError of its own (it ended the lease's task as if the worker had cancelled it)."""
