"""The status records of workers gone for an hour: which they are, and their deletion by
version (every start of a worker without a worker_id writes a new record, and each take round's
Scan reads them all)."""

from __future__ import annotations

import json

import pytest

from checkpoint.coordination import (
    GONE_WORKER_AFTER,
    PRUNED_AT_MOST,
    gone_workers,
    prune_gone_workers,
    worker_key,
)
from checkpoint.port import CoordinationRecord
from checkpoint.stores.memory import MemoryLeaseTable

NOW = 1_700_000_000.0


def status(worker: str, updated_at: object, version: int = 1, **more: object) -> CoordinationRecord:
    data = json.dumps({"updated_at": updated_at, **more})
    return CoordinationRecord(worker_key(worker), None, version, 0.0, data)


@pytest.mark.parametrize(
    ("record", "gone"),
    [
        (status("a", NOW - GONE_WORKER_AFTER - 1), True),
        (status("a", NOW - 60), False),  # alive
        (status("a", NOW - GONE_WORKER_AFTER + 1), False),
        (status("a", NOW - 2 * GONE_WORKER_AFTER, stopped=True), True),  # stopped long ago
        (status("a", "yesterday"), False),  # no time it can read: left alone
        (status("a", True), False),
        (CoordinationRecord("leader", "a", 1, 0.0, "{}"), False),  # not a worker's record
        (CoordinationRecord("stream/s", None, 1, 0.0, '{"updated_at": 1}'), False),
    ],
)
def test_which_worker_records_are_gone(record: CoordinationRecord, gone: bool) -> None:
    assert (gone_workers([record], NOW) == [record]) is gone


def test_gone_records_are_deleted_by_version_and_at_most_so_many_a_time() -> None:
    store = MemoryLeaseTable()
    old = [status(f"w{i}", NOW - 2 * GONE_WORKER_AFTER) for i in range(PRUNED_AT_MOST + 5)]
    alive = status("alive", NOW - 5)
    for record in [*old, alive]:
        assert store.put_record(record, None)
    revived = status("w0", NOW - 1, version=2)  # written again since the scan saw it
    assert store.put_record(revived, 1)
    scanned = [*old, alive]
    assert prune_gone_workers(store, scanned, NOW) == PRUNED_AT_MOST - 1  # w0 lost its race
    assert store.get_record(worker_key("w0")) == revived
    assert store.get_record(worker_key("alive")) == alive
    left = [r for r in old if store.get_record(r.key) is not None]
    assert len(left) == 6  # w0 and the five beyond this prune's limit
    assert prune_gone_workers(store, left, NOW) == 5  # the next prune
