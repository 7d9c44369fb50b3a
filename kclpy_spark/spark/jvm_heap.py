"""The driver JVM's heap, as the sink's metrics show it: what is in use now, what was still in use
after the last garbage collection (the live set: what a leak would grow), and the limit.

Read through py4j in a sink-write thread, at most every ``every`` seconds (a read is a few dozen
py4j calls, ~2 ms), and kept: the metrics endpoint reports the kept figures and never calls into
the JVM itself, so a JVM that hangs cannot stall a scrape (or the event loop serving it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoint.base.clock import Clock, SystemClock

log = logging.getLogger(__name__)

EVERY = 5.0  # seconds between two reads of the heap


@dataclass(frozen=True)
class HeapFigures:
    """Bytes: in use now, in use right after the last collection of each heap pool (summed), and
    the most the heap may grow to."""

    used: int
    live: int
    limit: int


def read_heap(jvm: Any) -> HeapFigures:
    """The heap figures of the JVM behind a py4j ``jvm`` view (``sparkContext._jvm``)."""
    factory = jvm.java.lang.management.ManagementFactory
    heap = factory.getMemoryMXBean().getHeapMemoryUsage()
    live = 0
    for pool in factory.getMemoryPoolMXBeans():
        if str(pool.getType().toString()) != "Heap memory":
            continue
        after = pool.getCollectionUsage()  # None for a pool no collector manages
        if after is not None:
            live += int(after.getUsed())
    return HeapFigures(int(heap.getUsed()), live, int(heap.getMax()))


class HeapSampler:
    """Keeps the last heap figures read; ``maybe_read`` reads again when ``every`` seconds have
    passed. A failed read is logged once and leaves the last figures in place."""

    def __init__(
        self,
        read: Callable[[], HeapFigures],
        *,
        every: float = EVERY,
        clock: Clock | None = None,
    ) -> None:
        self._read = read
        self._every = every
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._next = 0.0
        self._warned = False
        self.figures: HeapFigures | None = None

    def maybe_read(self) -> None:
        now = self._clock.monotonic()
        with self._lock:
            if now < self._next:
                return
            self._next = now + self._every
        try:
            self.figures = self._read()
        except Exception:
            if not self._warned:
                self._warned = True
                log.warning("could not read the Spark driver's heap figures", exc_info=True)
