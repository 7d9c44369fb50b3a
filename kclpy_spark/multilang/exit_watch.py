"""Seeing a child's exit while its stdout stays open: a process it started (a wrapper script's
``app &``) holds the pipe, so its end never comes, and a child that died during a call was
waited for ``timeoutInSeconds``, or for ever without one.

The exit is seen through a pidfd on the event loop (Linux 5.3+; no polling, nothing per line
read). Where there is none, a death behind an open stdout is seen as before, at the timeout.
"""

from __future__ import annotations

import asyncio
import os

# However fast lines come after the child's exit, reading ends this long after it.
AFTER_EXIT_MOST = 30.0


class ExitWatch:
    """Reads one child's stdout lines (``read_line``); once the child has exited, a read that
    gets nothing within ``grace`` seconds is its stdout's end (b"")."""

    def __init__(self, pid: int, grace: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._grace = grace
        self.exited = False
        self._exited_at = 0.0  # loop time the exit was seen
        self._waited = 0.0  # seconds reads waited since
        self._reader: asyncio.Task[object] | None = None  # the task in a read begun before exit
        self._ended_read = False  # ``_end_read`` cancelled it
        self._timer: asyncio.TimerHandle | None = None
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:  # gone (reaped) already
            self.exited, self._exited_at = True, self._loop.time()
            return
        except (AttributeError, OSError):
            return
        self._loop.add_reader(self._fd, self._exit_seen)

    async def read_line(self, stream: asyncio.StreamReader, timeout: float | None) -> bytes:
        """``stream``'s next line (b"" at its end); TimeoutError after ``timeout``. Once the
        child has exited, a read waits at most what is left of ``grace`` (waits added up: a
        backlog of lines the child wrote before its exit is read however long its handling
        takes) and reading ends ``AFTER_EXIT_MOST`` seconds after it at the latest (a process it
        started may write on for ever). A child writes nothing while it waits for a
        checkpoint's answer, so the reads of its call take all it wrote."""
        if self.exited:
            return await self._read_after_exit(stream, timeout)
        task = asyncio.current_task()
        self._reader = task
        try:
            async with asyncio.timeout(timeout):  # no inner task: no cancel can be swallowed
                return await stream.readline()
        except asyncio.CancelledError:
            if not self._own_cancel(task):
                raise
            return b""  # a line come with the cancel stays buffered: not the dead child's
        finally:
            self._reader = None

    async def _read_after_exit(self, stream: asyncio.StreamReader, timeout: float | None) -> bytes:
        now = self._loop.time()
        left = min(self._grace - self._waited, self._exited_at + AFTER_EXIT_MOST - now)
        if left <= 0:
            return b""
        limit = left if timeout is None else min(left, timeout)
        try:
            async with asyncio.timeout(limit):
                return await stream.readline()
        except TimeoutError:
            if timeout is not None and timeout <= left:
                raise  # the caller's limit
            return b""
        finally:
            self._waited += self._loop.time() - now

    def _own_cancel(self, task: asyncio.Task[object] | None) -> bool:
        """Take back the cancel ``_end_read`` made; False if there was none, or another's
        cancel stands too."""
        if not self._ended_read or task is None:
            return False
        self._ended_read = False
        return task.uncancel() == 0

    def close(self) -> None:
        """Stop watching (the child is done with); idempotent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._unwatch()

    def _unwatch(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _exit_seen(self) -> None:
        self.exited, self._exited_at = True, self._loop.time()
        self._unwatch()
        self._timer = self._loop.call_later(self._grace, self._end_read)

    def _end_read(self) -> None:
        self._timer = None
        task = self._reader
        if task is not None and not task.done():
            self._ended_read = True
            task.cancel()
