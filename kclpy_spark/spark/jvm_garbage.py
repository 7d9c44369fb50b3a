"""What the driver JVM keeps for Python objects that are already dead, bounded.

py4j caches each method a Python ``JavaObject`` calls in a ``JavaMember`` that points back at
the object: every JavaObject pyspark uses is in a reference cycle. Reference counting never frees
it; only Python's cyclic collector does, and until then the JVM object it names stays reachable
from py4j's registry. For a micro-batch that is the whole DataFrame, the RDD under it and the
batch's rows in Arrow form. Python runs a full collection only when its long-lived objects grow
by a quarter, which a daemon whose Python heap is stable may not do for a long time: measured in a
process that wrote 100,000-row batches back to back and allocated little else, the driver's heap
after a full JVM collection swung between 180 and 660 MB, then ran out (``OutOfMemoryError`` in
Spark's scheduler thread, after which every job hangs); with a collection per write it stayed at
140-260 MB, and the JVM's own collector had that much less to trace (the writes cost it 7.6
instead of 11.5 us of CPU per record in that run).

So the sink counts what it hands to Spark and runs Python's collector before a DataFrame that
would take the Arrow bytes made since the last collection past ``max_bytes``, or when
``max_frames`` have been made since (a small batch still pins its plan and RDD). A full
collection took ~55 ms in a process with Spark up before ``gc.freeze()``, and next to nothing
after it (the daemon freezes what start-up made, runtime/daemon.py): at the default limits well
under 0.3 us per 300-byte record.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# Arrow bytes handed to Spark between two collections: one batch at the default max_bytes, so
# the dead batches never hold more than about one batch's rows next to the live ones (Spark's
# default driver heap is 1 GB, and a batch's rows are held there two or three times over while
# it is written).
MAX_BYTES = 64 * 1024 * 1024
# DataFrames made between two collections: small batches pin a plan and an RDD each (tens of
# KB); at 100 a collection per 100 small batches costs next to nothing after gc.freeze().
MAX_FRAMES = 100


class JvmGarbage:
    """Counts the DataFrames made for Spark and collects Python's cycles before the next one
    when it would take those made since the last collection (dead by now, or about to be) past
    ``max_bytes``, or when ``max_frames`` have been made since. Thread-safe: writer threads
    make DataFrames concurrently; the collection runs outside the lock."""

    def __init__(
        self,
        *,
        max_bytes: int = MAX_BYTES,
        max_frames: int = MAX_FRAMES,
        collect: Callable[[], object] = gc.collect,
    ) -> None:
        self._max_bytes = max_bytes
        self._max_frames = max_frames
        self._collect = collect
        self._lock = threading.Lock()
        self._bytes = 0
        self._frames = 0
        self.collections = 0

    def before_frame(self, nbytes: int) -> None:
        """Called before a DataFrame of ``nbytes`` Arrow bytes is made."""
        with self._lock:
            due = self._frames > 0 and (
                self._bytes + nbytes > self._max_bytes or self._frames >= self._max_frames
            )
            if due:
                self._bytes = self._frames = 0
                self.collections += 1
            self._bytes += nbytes
            self._frames += 1
        if due:
            started = time.perf_counter()
            self._collect()
            log.debug(
                "collected Python's cycles (py4j objects) in %.1f ms",
                (time.perf_counter() - started) * 1000,
            )
