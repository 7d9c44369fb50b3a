"""The daemon's log lines are written to stderr by a thread of their own.

Whatever reads the daemon's stderr can stop reading: a log shipper that stalls, a container
runtime whose blocking log driver waits on a full disk. Written by the thread that logs, the next
line then blocked that thread once the pipe's 64 KiB filled, and with it the event loop whose
renewal rounds keep every lease: all of them were lost to a log reader. Here a line is handed to a
bounded queue (the filter that adds the lease context and redacts secrets runs first, in the
thread that logged); when the queue is full the line is dropped and counted, and the writer says
how many were dropped once it writes again.
"""

from __future__ import annotations

import copy
import logging
import logging.handlers
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

QUEUE_LINES = 10_000  # lines waiting for stderr before new ones are dropped (~ a few MB)


class QueuedLines(logging.handlers.QueueHandler):
    """Hands each line to the writer without waiting; counts those a full queue refused."""

    def __init__(self, lines: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(lines)
        self.dropped = 0
        self._switch = threading.Lock()
        self._direct: Callable[[logging.LogRecord], None] | None = None

    def write_directly(
        self, write: Callable[[logging.LogRecord], None], left: Callable[[], None]
    ) -> None:
        """From now on ``write`` each line at once (the writer thread ended), after ``left()``
        wrote what was still queued: a line a thread was handing over meanwhile is neither lost
        nor written before older ones."""
        with self._switch:
            left()
            self._direct = write

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record as the writer formats it: its message and traceback are text already (the
        filter made them, redacted); the traceback's frames stay behind."""
        record = copy.copy(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        with self._switch:
            if self._direct is not None:
                self._direct(record)
                return
            try:
                self.queue.put_nowait(record)
            except queue.Full:
                self.dropped += 1


class LogWriter:
    """The thread that writes queued lines, formatted by ``handler`` (the stderr one). Lines go
    to the stream's file descriptor with ``os.write``, not through the handler or the stream's
    buffer: a write stuck on a full pipe then holds no lock that the exit (``logging.shutdown``,
    the interpreter's flush of stderr) would wait on. A stream without a descriptor (a test's
    capture) is written through the handler."""

    def __init__(self, handler: logging.StreamHandler[Any], size: int = QUEUE_LINES) -> None:
        self.handler = handler
        self._lines: queue.Queue[logging.LogRecord | None] = queue.Queue(size)
        self.queued = QueuedLines(self._lines)
        self._told = 0  # drops already reported
        self._fd = _descriptor(handler.stream)
        self._thread = threading.Thread(target=self._run, name="kclpy-spark-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            record = self._lines.get()
            if record is None:
                return
            self.write_now(record)
            self._tell_drops()

    def write_now(self, record: logging.LogRecord) -> None:
        if self._fd is None:
            self.handler.handle(record)
            return
        try:
            data = memoryview((self.handler.format(record) + "\n").encode("utf-8", "replace"))
            while data:
                data = data[os.write(self._fd, data) :]
        except Exception:
            self.handler.handleError(record)

    def _tell_drops(self) -> None:
        dropped = self.queued.dropped
        if dropped > self._told:
            lost, self._told = dropped - self._told, dropped
            record = logging.LogRecord(
                "kclpy_spark", logging.WARNING, __file__, 0,
                f"{lost} log line(s) were dropped: stderr was not read as fast as the daemon "
                "wrote (a stalled log reader)", None, None,
            )  # fmt: skip
            for each in self.queued.filters:  # the context the format names, as every line's
                if isinstance(each, logging.Filter):
                    each.filter(record)
            self.write_now(record)

    def close(self, timeout: float) -> bool:
        """Write what is queued, waiting at most ``timeout`` seconds in all (a reader that never
        comes back must not hold the exit); whether it was all written."""
        end = time.monotonic() + timeout
        try:
            self._lines.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(max(0.0, end - time.monotonic()))
        return not self._thread.is_alive()

    def write_left(self) -> None:
        """After ``close``: write here the lines queued since (another thread logged while the
        writer ended), then the count of those dropped since the writer last told it: a full
        queue refused lines until the switch to direct writes, and the ended writer never said
        so (81 lines of 20,000 went unsaid in a loaded test run)."""
        while True:
            try:
                record = self._lines.get_nowait()
            except queue.Empty:
                break
            if record is not None:
                self.write_now(record)
        self._tell_drops()


def _descriptor(stream: Any) -> int | None:
    try:
        fd = stream.fileno()
        stream.flush()  # what was written through it before goes first
    except (AttributeError, OSError, ValueError):
        return None
    return fd if isinstance(fd, int) else None
