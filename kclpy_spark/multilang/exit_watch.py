"""Seeing a child's exit while its stdout stays open: a process it started (a wrapper script's
``app &``) holds the pipe, so its end never comes, and a child that died during a call was
waited for ``timeoutInSeconds``, or for ever without one.

The exit is seen through a pidfd on the event loop (Linux 5.3+; no polling, nothing per line
read). Where there is none, a death behind an open stdout is seen as before, at the timeout.
"""

from __future__ import annotations

import asyncio
import os


class ExitWatch:
    """Reads one child's stdout lines (``read_line``); once the child has exited, a read that
    gets nothing within ``grace`` seconds is its stdout's end (b"")."""

    def __init__(self, pid: int, grace: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._grace = grace
        self.exited = False
        self._exited_at = 0.0  # loop time the exit was seen
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
        child has exited, lines come only for ``grace`` seconds from its exit: what it wrote
        before it (a child writes nothing while it waits for a checkpoint's answer, so the
        reads of its call take them in time); a process it started may write on for ever."""
        if self.exited:
            left = self._exited_at + self._grace - self._loop.time()
            if left <= 0:
                return b""
            if timeout is not None and timeout < left:
                return await asyncio.wait_for(stream.readline(), timeout)  # the caller's limit
            try:
                return await asyncio.wait_for(stream.readline(), left)
            except TimeoutError:
                return b""
        task = asyncio.current_task()
        self._reader = task
        try:
            line = await asyncio.wait_for(stream.readline(), timeout)
        except asyncio.CancelledError:
            if not self._own_cancel(task):
                raise
            return b""
        finally:
            self._reader = None
        if self._ended_read:  # our cancel came as the line did: wait_for returned the line
            self._own_cancel(task)
        return line

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
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None

    def _exit_seen(self) -> None:
        self.exited, self._exited_at = True, self._loop.time()
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        self._timer = self._loop.call_later(self._grace, self._end_read)

    def _end_read(self) -> None:
        self._timer = None
        task = self._reader
        if task is not None and not task.done():
            self._ended_read = True
            task.cancel()
