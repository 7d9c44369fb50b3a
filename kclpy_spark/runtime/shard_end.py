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

Waiting is not failing: a blocked merge child and a retriable error (throttling, a dependency that
does not answer) are retried without limit. Every other failure (child shards the table refuses,
``shard_ended`` raising or not checkpointing SHARD_END) spends the consumer's failure budget
(budget.py), which parks the lease when it is spent (then it is redelivered later and the step
tried again). A failure to release the lease after SHARD_END is written is only logged: the
shard is finished whoever holds it, and the lease expires.
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from checkpoint.lease import Lease
from kclpy_spark.processor import RecordProcessor, RedeliverFromCheckpoint, ShardEndedInput
from kclpy_spark.retrieval.source import FetchedBatch, ShardProbe
from kclpy_spark.runtime.budget import FailureBudget
from kclpy_spark.runtime.lease_calls import lease_call
from kclpy_spark.runtime.tenure import Tenure
from shard_sync.children import ChildLeases, create_child_leases

log = logging.getLogger(__name__)

# Blocked attempts between two releases of a lease whose merge child is blocked (the KCL: 1 in 30).
BLOCKED_RELEASE_EVERY = 30

# Calls a processor method (the consumer's: it times the call).
Call = Callable[[Callable[[Any], Any], object], Awaitable[None]]


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
    budget: FailureBudget,
    call: Call,
    note_blocked: Callable[[str], None] = lambda _: None,
) -> ShardEnd:
    """Run the shard-end step for ``tenure``'s lease. Raises LeaseLost / ShutdownSignal from its
    waits, Parked from the budget."""
    children = await _children(
        tenure, budget, batch.child_shards, probe, poll_interval, note_blocked
    )
    if children is None:
        await tenure.release("a merge child stays blocked on its other parent; another may try")
        return ShardEnd.RELEASED

    def record(lease: Lease) -> Lease | None:
        return tenure.table.update_lease(replace(lease, child_shard_ids=children.children))

    if children.children:
        await budget.retrying(
            "recording the child shards in the lease", lambda: tenure.update(record)
        )
    await _shard_ended(tenure, processor, budget, call)
    try:
        await tenure.finished()
    except Exception as exc:  # SHARD_END is stored: the shard is done whoever holds the lease
        log.warning("shard %s: releasing the finished lease failed (%r)", tenure.shard_id, exc)
    log.info("shard %s reached SHARD_END; its children may start", tenure.shard_id)
    return ShardEnd.DONE


async def _children(
    tenure: Tenure,
    budget: FailureBudget,
    child_shards: list[dict[str, Any]],
    probe: ShardProbe,
    poll_interval: float,
    note_blocked: Callable[[str], None],
) -> ChildLeases | None:
    """The children's leases, created; None when blocked for BLOCKED_RELEASE_EVERY attempts."""
    gone: set[str] = set()
    blocked = 0
    while True:
        result = await budget.retrying(
            "creating the child leases",
            lambda: lease_call(
                create_child_leases, tenure.table, tenure.lease, child_shards, gone_parents=gone
            ),
        )
        if not result.blocked:
            return result
        vanished = []
        for parent in result.blocked_on:
            look = functools.partial(_exists, tenure, probe, parent)
            exists = await budget.retrying(f"looking up merge parent {parent}", look)
            if not exists:
                vanished.append(parent)
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


async def _exists(tenure: Tenure, probe: ShardProbe, shard_id: str) -> bool:
    return await tenure.wait_or_stop(probe.shard_exists(shard_id))


async def _shard_ended(
    tenure: Tenure, processor: RecordProcessor, budget: FailureBudget, call: Call
) -> None:
    """Call ``shard_ended`` until the processor checkpointed SHARD_END; each call that raised or
    did not checkpoint counts as a failure."""
    tenure.checkpointer.mark_shard_end()
    while True:
        tenure.current()
        error: BaseException
        try:
            await call(processor.shard_ended, ShardEndedInput(tenure.checkpointer))
        except Exception as exc:
            stored = tenure.current().lease.checkpoint.is_shard_end
            if isinstance(exc, RedeliverFromCheckpoint) and not stored:
                raise  # the consumer reads again from the checkpoint (and comes back here)
            if stored:
                # SHARD_END is stored: the shard is finished whatever failed after it (calling
                # shard_ended again, or parking a finished lease, would stop its children).
                log.warning(
                    "shard %s: shard_ended raised after checkpointing SHARD_END (%r); the "
                    "shard is finished",
                    tenure.shard_id,
                    exc,
                )
                return
            error = exc
        else:
            if tenure.current().lease.checkpoint.is_shard_end:
                return
            error = RuntimeError(
                "the processor did not checkpoint at SHARD_END in shard_ended; its children "
                "cannot start"
            )
        await budget.failed("shard_ended", error)
