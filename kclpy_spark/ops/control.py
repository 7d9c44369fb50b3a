"""Application-wide control state kept in the lease store's coordination records.

* ``suspended``: set by ``kclpy-spark suspend``; every worker stops taking and processing leases
  (keeping its checkpoints, staying alive) until ``resume``. It lives in the store, so it holds
  across restarts and machines.
* ``reset-timestamp``: the time an ``AT_TIMESTAMP`` reset moved checkpoints to; consumers of a lease
  checkpointed at AT_TIMESTAMP read from it (before the configured initial position's time).
* ``worker/<id>``: what each worker publishes about itself for ``kclpy-spark status`` (leases, lag,
  records, last renewal). Only its own worker writes it.

Writes are conditional on the record's version like every other write; a lost race is retried a
few times by re-reading, since these are single-writer records or idempotent flags.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from checkpoint.port import CoordinationRecord, CoordinationStore

SUSPEND_KEY = "suspended"
RESET_TIMESTAMP_KEY = "reset-timestamp"
_ATTEMPTS = 5


def worker_key(worker_id: str) -> str:
    return f"worker/{worker_id}"


def _data(record: CoordinationRecord | None) -> dict[str, Any]:
    if record is None:
        return {}
    try:
        value = json.loads(record.data or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def update_record(
    store: CoordinationStore,
    key: str,
    change: Callable[[dict[str, Any]], dict[str, Any]],
    *,
    owner: str | None,
    now_wall: float,
) -> bool:
    """Read-modify-write of a record's JSON data, conditional on its version. True if written."""
    for _ in range(_ATTEMPTS):
        current = store.get_record(key)
        data = change(_data(current))
        version = 1 if current is None else current.version + 1
        record = CoordinationRecord(key, owner, version, now_wall, json.dumps(data))
        if current is not None:
            record = replace(record, owner=owner if owner is not None else current.owner)
        if store.put_record(record, None if current is None else current.version):
            return True
    return False


def is_suspended(store: CoordinationStore) -> bool:
    return bool(_data(store.get_record(SUSPEND_KEY)).get("suspended"))


def set_suspended(store: CoordinationStore, suspended: bool, *, by: str, now_wall: float) -> bool:
    return update_record(
        store,
        SUSPEND_KEY,
        lambda d: {**d, "suspended": suspended, "by": by, "at": now_wall},
        owner=None,
        now_wall=now_wall,
    )


def reset_timestamp(store: CoordinationStore) -> float | None:
    value = _data(store.get_record(RESET_TIMESTAMP_KEY)).get("timestamp")
    return float(value) if isinstance(value, int | float) else None


def set_reset_timestamp(store: CoordinationStore, timestamp: float, *, now_wall: float) -> bool:
    return update_record(
        store,
        RESET_TIMESTAMP_KEY,
        lambda d: {**d, "timestamp": timestamp, "at": now_wall},
        owner=None,
        now_wall=now_wall,
    )


def publish_worker_status(
    store: CoordinationStore, worker_id: str, status: dict[str, Any], *, now_wall: float
) -> bool:
    return update_record(
        store,
        worker_key(worker_id),
        lambda _: {**status, "updated_at": now_wall, "worker_id": worker_id},
        owner=worker_id,
        now_wall=now_wall,
    )


def worker_status(store: CoordinationStore, worker_id: str) -> dict[str, Any]:
    return _data(store.get_record(worker_key(worker_id)))
