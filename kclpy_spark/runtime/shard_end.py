"""A shard consumer's last step when its shard has ended: children first, then SHARD_END.

In the KCL's order: the children's leases are created (``shard_sync.children``), the parent lease
records its children, the processor's ``shard_ended`` checkpoints SHARD_END (retried until it
does: the children may start only then), and the lease is released.

A merge child whose other parent has no lease yet blocks the step (the KCL's
BlockedOnParentShardException). The lease is kept and the step retried every
``parent_shard_poll_interval``: shard sync creates the missing parent's lease meanwhile. Every
``BLOCKED_RELEASE_EVERY`` blocked attempts the lease is released so another worker may try (the
KCL drops it one time in 30 at random; counting makes it predictable). A missing parent that no
longer exists in the stream (aged out of retention) stops blocking: nobody can read it any more.
SHARD_END is never checkpointed while a child's lease is missing.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.lease import Lease
from kclpy_spark.processor import RecordProcessor, ShardEndedInput
from kclpy_spark.retrieval.source import FetchedBatch, ShardProbe
from kclpy_spark.runtime.tenure import Tenure, call_processor
from shard_sync.children import ChildLeases, create_child_leases

log = logging.getLogger(__name__)

# Blocked attempts between two releases of a lease whose merge child is blocked (the KCL: 1 in 30).
BLOCKED_RELEASE_EVERY = 30


class ShardEnd(enum.Enum):
    DONE = "done"  # children created, SHARD_END checkpointed, lease released
    RELEASED = "released"  # blocked on a merge parent for long: released for another worker


async def finish_shard(
    tenure: Tenure,
    processor: RecordProcessor,
    batch: FetchedBatch,
    probe: ShardProbe,
    *,
    poll_interval: float,
    backoff: Backoff,
    note_blocked: Callable[[str], None] = lambda _: None,
) -> ShardEnd:
    """Run the shard-end step for ``tenure``'s lease. Raises LeaseLost / ShutdownSignal from its
    waits; table errors while creating children are retried after ``poll_interval``."""
    children = await _children(tenure, batch.child_shards, probe, poll_interval, note_blocked)
    if children is None:
        await tenure.release("a merge child stays blocked on its other parent; another may try")
        return ShardEnd.RELEASED

    def record(lease: Lease) -> Lease | None:
        return tenure.table.update_lease(replace(lease, child_shard_ids=children.children))

    if children.children:
        await tenure.update(record)
    await _shard_ended(tenure, processor, backoff)
    await tenure.finished()
    log.info("shard %s reached SHARD_END; its children may start", tenure.shard_id)
    return ShardEnd.DONE


async def _children(
    tenure: Tenure,
    child_shards: list[dict[str, Any]],
    probe: ShardProbe,
    poll_interval: float,
    note_blocked: Callable[[str], None],
) -> ChildLeases | None:
    """The children's leases, created; None when blocked for BLOCKED_RELEASE_EVERY attempts."""
    gone: set[str] = set()
    blocked = 0
    while True:
        tenure.current()
        try:
            result = await asyncio.to_thread(
                create_child_leases, tenure.table, tenure.lease, child_shards, gone_parents=gone
            )
        except KclpySparkError as exc:
            if not exc.retriable:
                raise  # malformed child shards, a missing table: nothing a retry fixes
            log.warning("shard %s: creating child leases failed (%s)", tenure.shard_id, exc)
            await tenure.pause(poll_interval)
            continue
        if not result.blocked:
            return result
        vanished = [p for p in result.blocked_on if not await probe.shard_exists(p)]
        if vanished:
            log.warning(
                "shard %s: merge parent(s) %s aged out of the stream; creating the child without "
                "waiting for their leases",
                tenure.shard_id,
                ", ".join(vanished),
            )
            gone.update(vanished)
            continue
        blocked += 1
        note_blocked(tenure.shard_id)
        log.warning(
            "shard %s ended, but its merge child waits for a lease of parent %s (attempt %d); "
            "keeping the lease, retrying in %.0fs (no SHARD_END before the child has a lease)",
            tenure.shard_id,
            ", ".join(result.blocked_on),
            blocked,
            poll_interval,
        )
        if blocked % BLOCKED_RELEASE_EVERY == 0:
            return None
        await tenure.pause(poll_interval)


async def _shard_ended(tenure: Tenure, processor: RecordProcessor, backoff: Backoff) -> None:
    """Call ``shard_ended`` until the processor checkpointed SHARD_END."""
    tenure.checkpointer.mark_shard_end()
    attempt = 0
    while True:
        tenure.current()
        try:
            await call_processor(processor.shard_ended, ShardEndedInput(tenure.checkpointer))
        except Exception:
            log.exception("shard %s: shard_ended raised", tenure.shard_id)
        if tenure.current().lease.checkpoint.is_shard_end:
            return
        attempt += 1
        log.error(
            "shard %s: the processor did not checkpoint at SHARD_END in shard_ended; its "
            "children cannot start. Retrying (attempt %d)",
            tenure.shard_id,
            attempt,
        )
        await tenure.pause(backoff.delay(attempt))
