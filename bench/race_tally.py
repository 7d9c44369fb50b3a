"""What the two consumers of ``bench_vs_kcl_rs.py`` measure in their own process: the time and
process CPU (every thread) at the first record and when the target count is reached, written
once to ``$RACE_RESULT`` as JSON. ``$RACE_READ_DATA`` = 1: every record's payload is read."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Tally:
    """Counts records across every shard's processor (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._bytes = 0
        self._first: tuple[float, float] | None = None
        self._target = int(os.environ["RACE_TARGET"])
        self._result = Path(os.environ["RACE_RESULT"])
        self.read_data = os.environ.get("RACE_READ_DATA") == "1"
        self._done = False
        # $RACE_TRACE = a path: one line per batch (time, thread, records) for gap analysis.
        trace = os.environ.get("RACE_TRACE")
        self._trace = Path(trace).open("a") if trace else None  # noqa: SIM115 (open for life)

    def add(self, records: Sequence[Any]) -> None:
        size = sum(len(r.binary_data) for r in records) if self.read_data else 0
        with self._lock:
            if self._trace is not None:
                now = time.time()
                self._trace.write(f"{now:.4f} {threading.current_thread().name} {len(records)}\n")
                self._trace.flush()
            if self._first is None:
                self._first = (time.time(), _cpu())
            self._count += len(records)
            self._bytes += size
            if self._done or self._count < self._target:
                return
            self._done = True
            wall, cpu = time.time(), _cpu()
            first_wall, first_cpu = self._first
            tmp = self._result.with_suffix(".tmp")
            tmp.write_text(json.dumps({
                "records": self._count, "bytes": self._bytes, "first_wall": first_wall,
                "last_wall": wall, "cpu": cpu - first_cpu,
            }))  # fmt: skip
            tmp.rename(self._result)


TALLY = Tally()
