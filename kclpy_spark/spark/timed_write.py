"""One write attempt with a deadline: on a sink-write thread (write_threads.py), its Spark jobs
tagged there; at ``timeout`` the jobs are interrupted (the watchdog, one thread for every write);
a write that still gives no answer after the grace that follows is abandoned, left running, and
counts as failed (``WriteHungError``, not retried while it may still run)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import wait
from typing import TypeVar

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.spark.sink_batch import BatchSink, Interrupter, SinkBatch
from kclpy_spark.spark.watchdog import Watchdog
from kclpy_spark.spark.write_threads import WriteThreads

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
        self, writers: int, interrupter: Interrupter, watchdog: Watchdog | None = None
    ) -> None:
        self._interrupter = interrupter
        self.watchdog = watchdog or Watchdog(callback_threads=writers)
        self.threads = WriteThreads(
            writers, "kclpy-spark-sink-write", MAX_HUNG_PER_WRITER * writers
        )

    def close(self) -> None:
        self.watchdog.close()
        self.threads.close()

    def write(
        self, sink: BatchSink, view: SinkBatch, timeout: float, index: str, of: str = ""
    ) -> None:
        """``sink.write(view)``, or raise: its own error, WriteTimeoutError (interrupted at the
        timeout), WriteHungError (no answer after the grace), or the threads' refusals."""
        tag = f"kclpy-spark-{view.batch_id:016x}-{index}-{view.attempt}"

        def on_timeout() -> None:
            log.warning("batch %s overran its %gs write timeout%s", tag, timeout, of)
            self._interrupter.interrupt(tag)

        deadline = self.watchdog.after(timeout, on_timeout)
        try:
            future = self.threads.submit(lambda: self._tagged(sink, view, tag))
            wait([future], timeout + min(HUNG_GRACE, timeout))
            if self.threads.abandon(future):
                log.error(
                    "batch %s%s gave no answer; abandoned (%d write(s) hung now)",
                    tag,
                    of,
                    self.threads.hung,
                )
                raise WriteHungError(
                    f"batch {view.batch_id}{of} gave no answer within {timeout:g}s and the grace "
                    "after it: counted as failed (the write is left running; not tried again "
                    "while it may still run)"
                )
            try:
                future.result()
            except Exception as exc:
                if deadline.fired.is_set():
                    raise WriteTimeoutError(
                        f"batch {view.batch_id}{of} overran {timeout:g}s: {exc!r}"
                    ) from exc
                raise
        finally:
            deadline.cancel()

    def _tagged(self, sink: BatchSink, view: SinkBatch, tag: str) -> None:
        with self._interrupter.tagged(tag):  # on the thread that runs the Spark jobs
            sink_call(lambda: sink.write(view))


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
