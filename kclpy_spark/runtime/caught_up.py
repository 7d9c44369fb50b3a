"""``until_caught_up``: the daemon as a job that reads every shard up to its tip as of start,
commits, and exits.

A lease is caught up when a batch read from it is at the tip (MillisBehindLatest 0) or holds a
record that arrived after the worker started (everything before it was read). Its consumer then
ends as at a shutdown: the processor gets ``shutdown_requested`` (its chance to checkpoint; the
Spark sink writes and commits what it holds), and the lease is done if its stored checkpoint
covers every record delivered, failed otherwise (a lease parked in a job fails too); either way
it is released, and this worker does not take it again. The worker stops when every lease is
finished (SHARD_END), done or failed here, or created after the start as a descendant of one of
those (a child of a shard that split after the start holds nothing from before it).

Every lease is read by this worker: with several job workers on one table, each reads what the
others released after them (from their checkpoints: at once caught up). A daemon that keeps
holding leases of the same application makes a job wait for ever: do not share one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease
from kclpy_spark.processor import LeaseLostInput, RecordProcessor, ShutdownRequestedInput
from kclpy_spark.retrieval.source import FetchedBatch
from kclpy_spark.runtime.lease_calls import lease_call

if TYPE_CHECKING:
    from kclpy_spark.runtime.tenure import Tenure

log = logging.getLogger(__name__)

SafeCall = Callable[[Callable[[Any], Any], object, str], Awaitable[None]]


@dataclass
class CaughtUp:
    started_wall: float  # the worker's start: "the tip as of start"
    done: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)  # lease key -> why
    initial: frozenset[str] | None = None  # the lease keys of the first scan
    complete: bool = False  # every lease done or failed: the worker stops (the taker sets it)

    def reached(self, batch: FetchedBatch) -> bool:
        """Whether ``batch`` (delivered, not a shard end) shows its shard caught up."""
        if batch.millis_behind_latest == 0 and not batch.page_full:
            return True
        started_ms = self.started_wall * 1000.0
        return any(r.timestamp_millis >= started_ms for r in batch.records[-1:])

    def finished(self, lease_key: str, problem: str | None) -> None:
        if problem is None:
            self.done.add(lease_key)
            self.failed.pop(lease_key, None)
        else:
            self.failed[lease_key] = problem

    async def conclude(
        self, tenure: Tenure, processor: RecordProcessor | None, safe: SafeCall
    ) -> None:
        """A caught-up lease: the processor's chance to checkpoint (``shutdown_requested``),
        then done if the stored checkpoint covers every record delivered, failed otherwise."""
        if processor is not None:
            arg = ShutdownRequestedInput(tenure.checkpointer, caught_up=True)
            await safe(processor.shutdown_requested, arg, "shutdown_requested")
            # Then lease_lost, as after every shutdown_requested (the lease is released below).
            await safe(processor.lease_lost, LeaseLostInput(), "lease_lost")
        delivered = tenure.checkpointer.largest_permitted
        key = tenure.lease_key
        try:
            stored = await lease_call(tenure.table.get_lease, key)
        except KclpySparkError as exc:
            self.finished(key, f"its checkpoint could not be read back ({exc})")
            await tenure.release("not caught up", level=logging.INFO)
            return
        if stored is None or stored.checkpoint < delivered:
            at = "no lease" if stored is None else str(stored.checkpoint)
            self.finished(
                key,
                f"records up to {delivered} were delivered but the checkpoint is {at} (the "
                "processor did not checkpoint them, in process_records or shutdown_requested)",
            )
        else:
            log.info("shard %s: caught up; checkpoint %s", tenure.shard_id, stored.checkpoint)
            self.finished(key, None)
        await tenure.release(
            "caught up" if key in self.done else "not caught up", level=logging.INFO
        )

    def _blocked_by(self, parent: str) -> str:
        if parent in self.done:
            return f"its parent {parent} was caught up before its end"
        return f"its parent {parent} did not reach its end in this job ({self.failed[parent]})"

    def is_ended(self, lease_key: str) -> bool:
        return lease_key in self.done or lease_key in self.failed

    def remaining(self, leases: Iterable[Lease]) -> list[str]:
        """The lease keys still to catch up (sorted); empty when the job is complete.

        A lease that existed at the start and whose parent was caught up before its end, or
        failed here (parked), cannot be read (it waits for that SHARD_END) and is failed here,
        loudly, rather than skipped or waited for."""
        by_key = {x.lease_key: x for x in leases}
        if self.initial is None and by_key:
            self.initial = frozenset(by_key)
        initial = self.initial or frozenset()
        ended = self.done | set(self.failed)
        beyond: set[str] = set()  # created after the start, below a lease ended here
        changed = True
        while changed:
            changed = False
            for key, lease in by_key.items():
                if key in beyond or self.is_ended(key) or lease.checkpoint.is_shard_end:
                    continue
                parents = {lease.sibling_key(p) for p in lease.parent_shard_ids}
                if not parents & (ended | beyond):
                    continue
                if key in initial:  # its parents' end will not come in this job (unless
                    # another job worker has read them to it meanwhile)
                    finished = {
                        p for p in parents if p in by_key and by_key[p].checkpoint.is_shard_end
                    }
                    stuck = sorted((parents & ended) - finished)
                    if stuck:
                        self.finished(key, self._blocked_by(stuck[0]))
                    continue
                beyond.add(key)
                changed = True
        return sorted(
            key
            for key, lease in by_key.items()
            if not lease.checkpoint.is_shard_end and not self.is_ended(key) and key not in beyond
        )
