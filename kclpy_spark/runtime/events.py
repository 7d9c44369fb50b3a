"""What happened to leases here: a bounded log of takes, steals, losses, releases, parkings and
shard ends, with their reasons, for the status page and the worker's published status.

Bounded by ``maxlen`` however long the daemon runs. Appended from the event loop and from
threads (renewal reports), so guarded by a lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kclpy_spark.logs import redact

# "asked": a graceful handoff to us begun (the steal of the KCL 3.x); "handed": one from us ended.
KINDS = (
    "took",
    "stole",
    "asked",
    "handed",
    "lost",
    "released",
    "parked",
    "finished",
    "assigned",
    "moving",
    "reopened",  # a false SHARD_END replaced (shard_sync/false_ends.py)
    "restored",  # a held lease's vanished item put back (checkpoint/leasing/vanished.py)
)
MAX_DETAIL = 300  # a reason may carry a whole Java stack trace; the status record must stay small


@dataclass(frozen=True)
class LeaseEvent:
    at: float  # wall seconds
    lease_key: str
    kind: str  # one of KINDS
    worker: str
    detail: str = ""


class EventLog:
    def __init__(self, worker: str, wall: Callable[[], float], maxlen: int = 100) -> None:
        self._worker = worker
        self._wall = wall
        self._events: deque[LeaseEvent] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def add(self, lease_key: str, kind: str, detail: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown lease event kind {kind!r}")
        # Published in the status record and on the status page: redacted as log lines are
        # (an exception's text may carry a password), before the cut (no half secret).
        detail = redact(detail)
        if len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 3] + "..."
        event = LeaseEvent(self._wall(), lease_key, kind, self._worker, detail)
        with self._lock:
            self._events.append(event)

    def recent(self, n: int | None = None) -> list[dict[str, Any]]:
        """The newest ``n`` (all if None) events, oldest first, as plain dicts."""
        with self._lock:
            events = list(self._events)
        return [asdict(e) for e in (events if n is None else events[-n:] if n else [])]
