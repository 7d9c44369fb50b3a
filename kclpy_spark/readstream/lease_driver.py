"""The driver side of a ``kinesis-kcl`` query that holds KCL leases (``leaseStore`` set).

``LeaseDriver`` owns the query's worker (``query_worker.py``) and answers three questions for
the source:

* **What does a completed batch acknowledge?** Spark asks for batch N+1's end only after batch N
  was written by the sink and noted in Spark's commit log (micro-batches run one after another),
  so the batch ending at ``latestOffset``'s ``start`` is complete: its shards' pins become the
  leases' checkpoints there, once per batch (``acknowledge``). The lease checkpoint therefore
  trails Spark's own checkpoint by the batch in flight, and after a stop by the last batch
  until the query runs again (its next run acknowledges that batch once it holds the leases
  again at the batch's start): a new owner of the lease meanwhile reads those records again,
  never fewer.
* **When does a run start reading?** A run's first plan (its worker has just started) and
  AvailableNow wait for the leases (``settle``): a Trigger.Once run otherwise ended at once.
* **What does the next batch read?** The shards whose leases the worker holds
  (``leased.next_leased_offset``); Trigger.AvailableNow ends only once no lease of the
  application is left waiting for this worker (``settle``).
* **What does a replayed batch read?** A batch planned by an earlier run of the query (Spark
  replays the last one after a restart) reads a shard only once this worker holds its lease
  again with the checkpoint where the batch starts (``replay_reads``); a lease that moved to
  another worker, or went on without this query, leaves the shard out of the replay, for good.
  Waiting for the leases of the earlier run costs a restart up to ``replay_wait`` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from checkpoint.lease import Lease
from kclpy_spark.readstream.leased import (
    acknowledgments,
    children_in,
    ends_to_hand,
    next_leased_offset,
    owner_of,
    resume_start,
)
from kclpy_spark.readstream.offsets import Pin, ShardPlan, SourceOffset
from kclpy_spark.readstream.options import SourceOptions
from kclpy_spark.readstream.pins import DirectoryPins
from kclpy_spark.readstream.query_worker import QueryWorker, acknowledge_all, hand_end

log = logging.getLogger(__name__)


class LeaseLiveness:
    """Which leases of other workers are live: their counters seen to move (pure but for the
    times given)."""

    def __init__(self, failover_time: float) -> None:
        self._failover = failover_time
        self._seen: dict[str, tuple[int, float, bool]] = {}  # counter, since, moved

    def quiet(
        self, leases: Sequence[Lease], mine: str, now: float, reading: Collection[str] = ()
    ) -> bool:
        """Whether no lease waits for worker ``mine``: every unfinished lease is one ``mine``
        reads (``reading``: the planner decides about those), or another worker's and live
        (unowned ones, ours not read yet and expired ones wait)."""
        quiet = True
        for lease in leases:
            if lease.checkpoint.is_shard_end or (
                lease.lease_owner == mine and lease.lease_key in reading
            ):
                continue
            if lease.lease_owner is None or lease.lease_owner == mine:
                quiet = False
                continue
            first = (lease.lease_counter, now, False)
            counter, since, moved = self._seen.get(lease.lease_key, first)
            if counter != lease.lease_counter:
                counter, since, moved = lease.lease_counter, now, True
            self._seen[lease.lease_key] = (counter, since, moved)
            if not moved or now - since > self._failover:
                quiet = False  # not yet seen renewed, or expired: ours to take
        return quiet


class LeaseDriver:
    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._worker: QueryWorker | None = None
        self._acked: tuple[str, int] | None = None  # the last batch acknowledged
        self._read_under: dict[tuple[str, int], dict[str, str]] = {}  # replays re-checked
        self._planned = False  # this run planned a batch (or found nothing to) already

    @property
    def replay_wait(self) -> float:
        """How long a replay waits for an earlier run's leases: they expire after the
        failover time (and the clock skew allowed), then a take round finds them."""
        return 2 * self._options.failover_time + 10

    def worker(self) -> QueryWorker:
        if self._worker is None or not self._worker.running():
            if self._worker is not None:
                log.warning("kinesis-kcl: the lease worker stopped (%s); starting another",
                            self._worker.error)  # fmt: skip
            self._worker = QueryWorker(self._options.worker_config())
            self._worker.start()
        return self._worker

    def acknowledge(
        self,
        offset: SourceOffset,
        pins: Mapping[str, Pin],
        store: DirectoryPins,
        children: Callable[[str], list[dict[str, Any]]],
    ) -> None:
        """Acknowledge the completed batch ``offset`` (once), and hand the end of every shard
        it knows ended to a consumer that reads it still (``leased.ends_to_hand``);
        ``children(shard_id)``: a shard's children from a listing, for ends found without."""
        key = (offset.run, offset.batch)
        if offset.batch < 0 or self._acked == key:
            return
        leases = self.worker().leases
        skipped = store.skipped(*key)
        under = self._read_under.get(key)
        if under is None and self._plans(offset, skipped)[1]:
            # An earlier run's batch, not replayed (completed before this run): acknowledged
            # under the tenures held again, which the next plan then goes on under.
            under = self._held_again(offset, skipped)[1]
            self._read_under = {key: under}
        acks = acknowledgments(offset, pins, skipped, under)
        acknowledge_all(leases, acks, children)
        for sid in ends_to_hand(offset, pins, leases.readable(), skipped):
            log.info("kinesis-kcl: shard %s ended in an earlier batch; handing its end", sid)
            hand_end(leases, sid, children(sid))
        self._acked = key

    def plan(
        self,
        previous: SourceOffset,
        pins: Mapping[str, Pin],
        listed: Sequence[Any],
        until_ms: int | None,
        skipped: set[str],
    ) -> SourceOffset:
        closed = {s.shard_id for s in listed if s.ending_sequence_number is not None}
        names = {s.shard_id for s in listed} if listed else None
        under = self._read_under.get((previous.run, previous.batch))
        leases = self.worker().leases

        def following() -> SourceOffset:
            for sid in ends_to_hand(previous, pins, leases.readable(), skipped):
                hand_end(leases, sid, children_in(listed, sid))  # taken again since acknowledged
            return next_leased_offset(
                previous, pins, leases.readable(), closed=closed, listed=names,
                until_ms=until_ms, skipped=skipped, read_under=under,
            )  # fmt: skip

        def nothing(offset: SourceOffset) -> bool:
            return offset is previous or not offset.read_shards()

        planned = following()
        # AvailableNow, and a run's first plan (its worker has just started: a Trigger.Once
        # run found no lease taken yet and ended without a batch), wait for the leases.
        first, self._planned = not self._planned, True
        if (until_ms is not None or first) and nothing(planned):
            if self.settle(lambda: not nothing(following())):
                planned = following()
            elif until_ms is not None:
                log.warning("kinesis-kcl: leases still wait for this worker; the run ends "
                            "without them")  # fmt: skip
        # Nothing to read: no batch (Spark asks again; the source paces the asking).
        return previous if nothing(planned) else planned

    def settle(self, readable: Callable[[], bool], seconds: float | None = None) -> bool:
        """AvailableNow: wait (up to ``replay_wait``) until ``readable()`` (a plan would read
        something now) or no lease of the application waits for this worker: none unowned,
        none of ours (a consumer starting, waiting on its parents, or finishing a shard's end
        and so creating its children), none of a worker that stopped renewing it (ours to take
        once it expires). Another worker's lease counts as live once its counter was seen to
        move, so with other workers a run ends no sooner than one of their renewals after its
        last read."""
        worker = self.worker()
        seen = LeaseLiveness(self._options.failover_time)

        def settled() -> bool:
            if readable():
                return True
            return seen.quiet(worker.store.list_leases(), worker.worker_id, time.monotonic(),
                              worker.leases.readable())  # fmt: skip

        return worker.leases.wait(settled, self.replay_wait if seconds is None else seconds)

    def replay_reads(self, offset: SourceOffset, store: DirectoryPins) -> list[str]:
        """The shards the batch ``offset`` reads: all it planned when this run planned it; for a
        batch an earlier run planned, each once this worker holds its lease again at the
        batch's start (all waited for at once), the others left out for good
        (``store.mark_skipped``)."""
        key = (offset.run, offset.batch)
        decided = self._read_under.get(key)
        if decided is not None:  # planned again (another action of the batch, a MERGE's plans):
            return list(decided)  # the same shards, whatever happened to a tenure since
        planned, under = self._held_again(offset, store.skipped(*key))
        for sid in planned:
            if sid not in under:
                log.warning("kinesis-kcl: batch %d leaves shard %s out: its lease moved",
                            offset.batch, sid)  # fmt: skip
                store.mark_skipped(*key, sid)
        self._read_under = {key: under}
        return [sid for sid in planned if sid in under]

    def _plans(
        self, offset: SourceOffset, skipped: Collection[str]
    ) -> tuple[dict[str, ShardPlan], dict[str, str]]:
        """The shards the batch ``offset`` planned under a tenure (not skipped), and those of
        them an earlier run planned (shard -> that run's worker id)."""
        planned = {sid: offset.shards[sid] for sid in offset.read_shards()
                   if sid not in skipped and offset.shards[sid].tenure is not None}  # fmt: skip
        me = self.worker().worker_id
        earlier = {sid: owner for sid, p in planned.items()
                   if (owner := owner_of(str(p.tenure))) != me}  # fmt: skip
        return planned, earlier

    def _held_again(
        self, offset: SourceOffset, skipped: Collection[str]
    ) -> tuple[list[str], dict[str, str]]:
        """The shards the batch ``offset`` planned (not skipped), and the tenure under which
        this worker holds each lease at the batch's start: the planned one for a batch of this
        run (while it lasts); for a batch an earlier run planned, the one held again, once all
        its leases were waited for."""
        planned, earlier = self._plans(offset, skipped)
        if earlier:  # a batch an earlier run planned: wait for its leases
            self._wait(earlier)
        readable = self.worker().leases.readable()
        under = {}
        for sid, plan in planned.items():
            held = readable.get(sid)
            if sid not in earlier and held is not None and held.tenure != plan.tenure:
                held = None  # this run's tenure ended since it planned the batch
            if held is not None and resume_start(plan.start, held.start) == plan.start:
                under[sid] = held.tenure
        return list(planned), under

    def _wait(self, earlier: Mapping[str, str]) -> None:
        """Leases an earlier run held (shard -> its worker id): wait until each is this
        worker's, or another worker's (not the earlier run's), or its shard ended."""
        worker = self.worker()

        def settled() -> bool:
            readable = worker.leases.readable()
            waiting = [sid for sid in earlier if sid not in readable]
            if not waiting:
                return True
            leases = {lease.lease_key: lease for lease in worker.store.list_leases()}
            for sid in waiting:
                lease = leases.get(sid)
                if lease is None or lease.checkpoint.is_shard_end:
                    continue
                if lease.lease_owner in (None, earlier[sid], worker.worker_id):
                    return False
            return True

        worker.leases.wait(settled, self.replay_wait)

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()
