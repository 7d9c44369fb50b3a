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
``shard_ended`` raising or not checkpointing SHARD_END) is reported to ``failed``, the consumer's
one failure budget, which parks the lease when it is spent (then it is redelivered later and the
step tried again). A failure to release the lease after SHARD_END is written is only logged: the
shard is finished whoever holds it, and the lease expires.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease
from kclpy_spark.processor import RecordProcessor, ShardEndedInput
from kclpy_spark.retrieval.source import FetchedBatch, ShardProbe
from kclpy_spark.runtime.tenure import LeaseLost, Parked, ShutdownSignal, Tenure, call_processor
from shard_sync.children import ChildLeases, create_child_leases

log = logging.getLogger(__name__)

T = TypeVar("T")

# Blocked attempts between two releases of a lease whose merge child is blocked (the KCL: 1 in 30).
BLOCKED_RELEASE_EVERY = 30

# Told (what failed, the error); counts toward the consumer's budget: waits a backoff, or raises
# Parked when the budget is spent (or LeaseLost when the lease went meanwhile).
Failed = Callable[[str, BaseException], Awaitable[None]]
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
    failed: Failed,
    call: Call = call_processor,
    note_blocked: Callable[[str], None] = lambda _: None,
) -> ShardEnd:
    """Run the shard-end step for ``tenure``'s lease. Raises LeaseLost / ShutdownSignal from its
    waits, Parked from ``failed``."""
    steps = _Steps(tenure, poll_interval, failed)
    children = await _children(steps, batch.child_shards, probe, note_blocked)
    if children is None:
        await tenure.release("a merge child stays blocked on its other parent; another may try")
        return ShardEnd.RELEASED

    def record(lease: Lease) -> Lease | None:
        return tenure.table.update_lease(replace(lease, child_shard_ids=children.children))

    if children.children:
        await steps.retry("recording the child shards in the lease", lambda: tenure.update(record))
    await _shard_ended(tenure, processor, failed, call)
    try:
        await tenure.finished()
    except Exception as exc:  # SHARD_END is stored: the shard is done whoever holds the lease
        log.warning("shard %s: releasing the finished lease failed (%r)", tenure.shard_id, exc)
    log.info("shard %s reached SHARD_END; its children may start", tenure.shard_id)
    return ShardEnd.DONE


class _Steps:
    """Runs one table or Kinesis call of the shard-end step: a retriable error waits
    ``poll_interval`` and tries again without counting; any other error counts (``failed``)."""

    def __init__(self, tenure: Tenure, poll_interval: float, failed: Failed) -> None:
        self.tenure = tenure
        self.poll = poll_interval
        self._failed = failed

    async def retry(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        while True:
            self.tenure.current()
            try:
                return await call()
            except (LeaseLost, ShutdownSignal, Parked):
                raise
            except KclpySparkError as exc:
                if not exc.retriable:
                    await self._failed(what, exc)
                    continue
                log.warning("shard %s: %s failed (%s); retrying", self.tenure.shard_id, what, exc)
                await self.tenure.pause(self.poll)
            except Exception as exc:
                await self._failed(what, exc)


async def _children(
    steps: _Steps,
    child_shards: list[dict[str, Any]],
    probe: ShardProbe,
    note_blocked: Callable[[str], None],
) -> ChildLeases | None:
    """The children's leases, created; None when blocked for BLOCKED_RELEASE_EVERY attempts."""
    tenure = steps.tenure
    gone: set[str] = set()
    blocked = 0
    while True:
        result = await steps.retry(
            "creating the child leases",
            lambda: asyncio.to_thread(
                create_child_leases, tenure.table, tenure.lease, child_shards, gone_parents=gone
            ),
        )
        if not result.blocked:
            return result
        vanished = []
        for parent in result.blocked_on:
            look = functools.partial(_exists, tenure, probe, parent)
            exists = await steps.retry(f"looking up merge parent {parent}", look)
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
            steps.poll,
        )
        if blocked % BLOCKED_RELEASE_EVERY == 0:
            return None
        await tenure.pause(steps.poll)


async def _exists(tenure: Tenure, probe: ShardProbe, shard_id: str) -> bool:
    return await tenure.wait_or_stop(probe.shard_exists(shard_id))


async def _shard_ended(
    tenure: Tenure, processor: RecordProcessor, failed: Failed, call: Call
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
            error = exc
        else:
            if tenure.current().lease.checkpoint.is_shard_end:
                return
            error = RuntimeError(
                "the processor did not checkpoint at SHARD_END in shard_ended; its children "
                "cannot start"
            )
        await failed("shard_ended", error)
