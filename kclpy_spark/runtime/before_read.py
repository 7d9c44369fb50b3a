"""The steps before a lease is read: its parents reach SHARD_END (waited for as long as they
take), and its checkpoint is checked against the stream's retention (``aged_checkpoint_policy``).
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease
from checkpoint.sequence import LATEST, TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.retrieval.source import ShardProbe
from kclpy_spark.runtime.budget import FailureBudget
from kclpy_spark.runtime.lease_calls import lease_call
from kclpy_spark.runtime.resume import ReadStart
from kclpy_spark.runtime.tenure import Parked, Tenure

log = logging.getLogger(__name__)


async def parents_ended(tenure: Tenure, poll_interval: float) -> None:
    """Return once every parent lease of ``tenure``'s lease is at SHARD_END (or gone); reads
    again every ``poll_interval``. Raises what the tenure's waits raise (loss, shutdown)."""
    lease = tenure.lease
    while True:
        blocking = []
        try:
            for parent in sorted(lease.parent_shard_ids):
                parent_lease = await lease_call(tenure.table.get_lease, lease.sibling_key(parent))
                if parent_lease is not None and not parent_lease.checkpoint.is_shard_end:
                    blocking.append(parent)
        except KclpySparkError as exc:
            log.warning("shard %s: reading its parents' leases failed: %s", lease.shard_id, exc)
            blocking.append("(unknown)")
        if not blocking:
            return
        log.info(
            "shard %s waits for parent shard(s) %s to reach SHARD_END",
            lease.shard_id,
            ", ".join(blocking),
        )
        await tenure.pause(poll_interval)


@runtime_checkable
class PendingStarts(Protocol):
    """A processor factory whose processors write pending checkpoints (the Spark sink's): where
    the pieces a lease's pending checkpoint ends begin (None: it cannot tell)."""

    def pending_first(self, lease: Lease) -> ExtendedSequenceNumber | None: ...


async def check_retention(
    tenure: Tenure,
    probe: ShardProbe,
    policy: str,
    budget: FailureBudget,
    start: ReadStart,
    pending_starts: PendingStarts | None = None,
) -> None:
    """Apply ``policy`` (``aged_checkpoint_policy``) when the stored sequence number (the
    checkpoint's, or a start position's pending one) is older than anything the stream still
    holds: park the lease (``fail``: raises Parked), or restart it at TRIM_HORIZON
    (``earliest``) or LATEST (``latest``), which drops the pending piece."""
    checkpoint, pending = tenure.lease.checkpoint, tenure.lease.pending_checkpoint
    if not checkpoint.is_sentinel:
        what = f"checkpoint {checkpoint}"
    elif pending is not None and not pending.is_sentinel:
        # Pieces written (pending) from a start position, never committed: once their first
        # records aged out they cannot be read again as they were (a read pinned to them failed
        # every tenure; re-formed on the driver, another piece: written twice).
        begins = pending_starts.pending_first(tenure.lease) if pending_starts else None
        checkpoint = begins if begins is not None and not begins.is_sentinel else pending
        what = f"pending checkpoint {pending} (pieces being written, from {checkpoint})"
    else:
        return
    first = await tenure.wait_or_stop(probe.earliest_sequence_number(tenure.shard_id))
    if first is None or int(checkpoint.sequence_number) >= int(first):
        return
    what = (
        f"shard {tenure.shard_id}: {what} is older than the stream's retention (earliest "
        f"record {first}); records after the checkpoint may have aged out"
    )
    if policy == "fail":
        log.error("%s. Parking the lease; set aged_checkpoint_policy or run reset", what)
        await budget.park("aged-out checkpoint")
        raise Parked()
    target = TRIM_HORIZON if policy == "earliest" else LATEST
    await tenure.restart_at(target)
    start.restarted(target)
    log.error(
        "%s. Policy %r: restarting at %s (%s)",
        what,
        policy,
        target,
        "what aged out before the oldest record is gone"
        if policy == "earliest"
        else "records in between are lost",
    )
