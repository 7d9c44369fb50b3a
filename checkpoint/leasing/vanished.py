"""A held lease whose item vanished from the table: put back where its holder left it.

When an operator, a script or a restore deletes the item of a lease a worker holds, the worker's
next write of it loses its condition. Without more, shard sync re-creates the lease later (a
minute, or three audit rounds) at the *initial position*: with LATEST, every record written in
between is skipped for good. The holder knows better: its last write of the lease holds the
checkpoint (and pending checkpoint) the table lost. So after a lost write it reads the item once;
if it is gone, it creates it again from that last write, unowned, so any worker takes it and reads
on from there. If shard sync re-creates it between that read and the create (still unowned and
not started), its position is moved to ours with a write conditional on its counter. A lease
found in the table at that read is left alone, though it may have been re-created at the
initial position before: an operator's ``reset`` (unowned, at a start position) looks the same,
and must not be undone. Shard sync re-creates a vanished lease rounds later, so the holder,
which reads at its next lost write (within half a failover time), is nearly always first.

Not put back: a lease at SHARD_END (its deletion is the leader's cleanup of a finished shard); a
lease a child of whose shard has started (``children_started``: the leader's cleanup deletes a
finished lease once its children have started, so another worker finished it after ours was
lost, while this holder's view is older); and a lease the holder's ``restorable`` refuses (the
worker's: its shard is gone from the stream, so the leader's garbage cleanup deleted it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease
from checkpoint.port import LeaseTable
from checkpoint.sequence import Sentinel

log = logging.getLogger(__name__)

_NOT_STARTED = frozenset({Sentinel.TRIM_HORIZON, Sentinel.LATEST, Sentinel.AT_TIMESTAMP})


def put_back(last: Lease) -> Lease | None:
    """The lease to create again from ``last`` (the holder's last write of it): unowned, no
    handoff, its counter moved on (a write conditional on the old counter can never win); None
    for a finished lease."""
    if last.checkpoint.is_shard_end:
        return None
    return replace(
        last,
        lease_owner=None,
        checkpoint_owner=None,
        lease_counter=last.lease_counter + 1,
        written=None,
    )


def resumed_from(found: Lease, last: Lease) -> Lease | None:
    """``found`` (re-created by someone else after the item vanished) with ``last``'s position,
    if it is unowned, not started, and elsewhere than ``last``; else None (leave it alone)."""
    if (
        found.lease_owner is not None
        or found.checkpoint.sentinel not in _NOT_STARTED
        or last.checkpoint.is_shard_end
        or (found.checkpoint, found.start_timestamp) == (last.checkpoint, last.start_timestamp)
    ):
        return None
    return replace(
        found,
        checkpoint=last.checkpoint,
        pending_checkpoint=last.pending_checkpoint,
        pending_checkpoint_state=last.pending_checkpoint_state,
        start_timestamp=last.start_timestamp,
    )


def children_started(key: str, leases: list[Lease]) -> bool:
    """Whether a lease of ``leases`` names the lease ``key``'s shard as a parent and has started
    (``Lease.started``, as the leader's cleanup judges it): then ``key``'s shard was finished."""
    return any(
        lease.started and any(lease.sibling_key(parent) == key for parent in lease.parent_shard_ids)
        for lease in leases
    )


def restore_if_vanished(
    table: LeaseTable, last: Lease, restorable: Callable[[Lease], bool] = lambda _: True
) -> bool:
    """After a lost write of ``last``'s lease: if its item is gone (or was re-created behind our
    position) and ``restorable(last)``, put it back from ``last``. True if a write restored it.
    Never raises: a failed read or write is logged, and the lease is lost as before."""
    key = last.lease_key
    try:
        if table.get_lease(key) is not None:
            return False
        again = put_back(last)
        if again is None:
            return False
        try:
            finished = children_started(key, table.list_leases())
        except KclpySparkError as exc:  # the scan alone failed: put it back as before
            log.warning("lease %s: its children could not be read (%s)", key, exc)
            finished = False
        if finished:
            log.warning("lease %s vanished while held at %s; a child of its shard has started "
                        "(another worker finished it, and the cleanup deleted it), so it stays "
                        "gone", key, last.checkpoint)  # fmt: skip
            return False
        if not restorable(last):
            log.info("lease %s vanished while held; its shard is gone, so it stays gone", key)
            return False
        if table.create_lease_if_absent(again):
            log.error(
                "lease %s vanished from the lease table while held; created it again, unowned, "
                "at its last checkpoint %s (not at the initial position: nothing in between is "
                "skipped)", key, last.checkpoint,
            )  # fmt: skip
            return True
        found = table.get_lease(key)
        moved = None if found is None else resumed_from(found, last)
        if moved is not None and table.update_lease(moved) is not None:
            log.error(
                "lease %s vanished from the lease table while held and was re-created at %s; "
                "moved it to its last checkpoint %s", key, found.checkpoint if found else "?",
                last.checkpoint,
            )  # fmt: skip
            return True
    except KclpySparkError as exc:
        log.warning("lease %s: checking whether it vanished failed: %s", key, exc)
    return False
