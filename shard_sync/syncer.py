"""One shard sync: list shards, compare with the lease table, create the missing leases.

The glue between the discovery adapter, the pure rules (hierarchy.leases_to_create,
false_ends.false_shard_ends) and the lease table. Creation is create-if-absent and ordered by
starting sequence number, so a crash halfway leaves a prefix of the leases and the next sync
completes it. A lease at SHARD_END whose shard the listing shows open is reopened at TRIM_HORIZON
(false_ends.py), with a write conditional on the counter seen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from checkpoint.base.errors import DependencyError, KclpySparkError, MalformedAnswerError
from checkpoint.counters import CoordinationCounters, Counter
from checkpoint.lease import HashKeyRange, Lease, in_stream
from checkpoint.sequence import InitialPosition, Position
from shard_sync.children import children_of_finished_parents
from shard_sync.discovery import ShardLister, shard_filter_for
from shard_sync.false_ends import false_shard_ends, reopened
from shard_sync.hierarchy import leases_to_create
from shard_sync.shards import Shard, find_hash_range_holes, find_hash_range_overlaps

log = logging.getLogger(__name__)

# The KCL lists an empty table's shards up to 3 times until they cover the whole hash range
# (a listing taken mid-reshard can miss a range). The KCL also rejects overlaps; we reject them
# at LATEST only: an AT_TRIM_HORIZON listing holds every shard (parents and children overlap,
# LocalStack's as Kinesis's), and from TRIM_HORIZON or a timestamp overlapping leases are safe,
# children wait for their parents. At LATEST open shards that overlap come from a listing whose
# pages straddle a split (the parent open on one page, its children on the next): leased
# together, the children waited at LATEST behind their parent, and what came to them before
# their first read, after the parent's end, was skipped.
EMPTY_TABLE_LIST_ATTEMPTS = 3
EMPTY_TABLE_LIST_DELAY = 1.0


@dataclass(frozen=True)
class SyncResult:
    shards_listed: int
    created: tuple[str, ...]
    table_was_empty: bool
    reopened: tuple[str, ...] = ()  # lease keys whose false SHARD_END was replaced


class LeadershipLapsed(KclpySparkError):
    """The worker stopped leading during a shard-sync round; the next leader's round goes on."""

    retriable = True


class ShardSyncTable(Protocol):
    """What shard sync and the leader's cleanup use of the lease table."""

    def list_leases(self) -> list[Lease]: ...
    def create_lease_if_absent(self, lease: Lease) -> bool: ...
    def update_lease(self, lease: Lease) -> Lease | None: ...
    def delete_lease(self, lease: Lease) -> bool: ...


@dataclass(frozen=True)
class LeaderOnlyWrites:
    """The lease table as a shard-sync round writes it: each write first checks that this worker
    still leads (else LeadershipLapsed). A round's writes come from a scan made up to minutes
    before (ListShards retried, the stream waited for): a leader that stalled meanwhile created,
    from its old scan, the lease of a parent the new leader had leased, its children finished
    and deleted again (all its records delivered a second time, after its children's)."""

    table: ShardSyncTable
    still_leading: Callable[[], bool]

    def _check(self) -> None:
        if not self.still_leading():
            raise LeadershipLapsed("no longer the shard-sync leader: the round's writes stop")

    def list_leases(self) -> list[Lease]:
        return self.table.list_leases()

    def create_lease_if_absent(self, lease: Lease) -> bool:
        self._check()
        return self.table.create_lease_if_absent(lease)

    def update_lease(self, lease: Lease) -> Lease | None:
        self._check()
        return self.table.update_lease(lease)

    def delete_lease(self, lease: Lease) -> bool:
        self._check()
        return self.table.delete_lease(lease)


class ShardSyncer:
    def __init__(
        self,
        lister: ShardLister,
        table: ShardSyncTable,
        initial_position: InitialPosition,
        *,
        ignore_unexpected_child_shards: bool = False,
        counters: CoordinationCounters | None = None,
        sleep: Callable[[float], None] = time.sleep,
        stream_key: str | None = None,
    ) -> None:
        # Multi-stream applications share one table: each stream's syncer sees only the leases
        # whose keys start with its ``account:stream:creationEpoch`` identity, and writes keys so.
        self.stream_key = stream_key
        self._lister = lister
        self._table = table
        self._position = initial_position
        self._ignore = ignore_unexpected_child_shards
        self._counters = counters or CoordinationCounters()
        self._sleep = sleep
        # The hash ranges of leased shards whose leases carry none (written by KCL 1.x), from
        # the last listing: the audit reads them here (the KCL writes them into the leases once;
        # without them every audit saw a hole and listed the stream again, for ever).
        self.known_ranges: dict[str, HashKeyRange] = {}

    def _list_for_empty_table(self) -> list[Shard]:
        shard_filter = shard_filter_for(self._position)
        shards: list[Shard] = []
        for attempt in range(1, EMPTY_TABLE_LIST_ATTEMPTS + 1):
            shards = self._lister.list_shards(shard_filter)
            holes = find_hash_range_holes(s.hash_key_range for s in shards)
            if self._position.position is Position.LATEST:
                holes += find_hash_range_overlaps(s.hash_key_range for s in shards if s.is_open)
            if not holes:
                return shards
            log.warning(
                "shard listing (attempt %d) leaves %d hash-range hole(s) or overlap(s); "
                "listing again",
                attempt,
                len(holes),
            )
            if attempt < EMPTY_TABLE_LIST_ATTEMPTS:
                self._sleep(EMPTY_TABLE_LIST_DELAY)
        # As the KCL: nothing is created from a listing with holes. Leasing its shards now would
        # leave a missing shard to the hole audit, rounds later, at the initial position (with
        # LATEST, what it got in between is never read); the leader's next round lists again.
        raise DependencyError(
            f"the shards listed for an empty lease table leave {len(holes)} hash-range hole(s) "
            "or overlap(s) "
            f"after {EMPTY_TABLE_LIST_ATTEMPTS} listings; no lease created (the next shard sync "
            "lists again)"
        )

    def owns(self, lease: Lease) -> bool:
        """True for the leases of this syncer's stream (all leases in single-stream mode)."""
        return in_stream(lease.lease_key, self.stream_key)

    def _unfinished_ranges(self, leases: list[Lease]) -> dict[str, HashKeyRange]:
        """The hash ranges of ``leases`` not at SHARD_END, by shard id (from the listing for a
        lease without one; unknown, it is left out)."""
        ranges = {}
        for lease in leases:
            if not lease.checkpoint.is_shard_end:
                known = lease.hash_key_range or self.known_ranges.get(lease.shard_id)
                if known is not None:
                    ranges[lease.shard_id] = known
        return ranges

    def sync(self, leases: list[Lease] | None = None) -> SyncResult:
        """Run one sync; ``leases`` may pass a fresh scan of the table to save a read."""
        scanned = self._table.list_leases() if leases is None else leases
        current = [lease for lease in scanned if self.owns(lease)]
        empty = not current
        shards = self._list_for_empty_table() if empty else self._lister.list_shards()
        leased = {lease.shard_id for lease in current}
        no_range = {lease.shard_id for lease in current if lease.hash_key_range is None}
        self.known_ranges = {
            shard.shard_id: shard.hash_key_range for shard in shards if shard.shard_id in no_range
        }
        try:
            new = leases_to_create(
                shards, leased, self._position, ignore_unexpected_child_shards=self._ignore,
                unfinished_ranges=self._unfinished_ranges(current),
            )  # fmt: skip
            finished = {x.shard_id for x in current if x.checkpoint.is_shard_end}
            orphans = children_of_finished_parents(shards, leased, finished) if current else []
        except ValueError as exc:  # a shard graph no stream can have (a cycle, say)
            raise MalformedAnswerError(f"the shard listing: {exc}") from None
        planned = {spec.shard_id for spec in new}
        for orphan in orphans:
            if orphan.shard_id not in planned:
                log.warning("shard %s has no lease though its parents finished (its lease was "
                            "deleted?); leasing it from its start", orphan.shard_id)  # fmt: skip
                new.append(orphan)
        created: list[str] = []
        when = self._position.timestamp
        start = None if when is None else when.timestamp()
        for spec in new:
            lease = spec.to_lease(self.stream_key, start_timestamp=start)
            if self._table.create_lease_if_absent(lease):
                created.append(spec.shard_id)
                self._counters.increment(Counter.PARTITIONS_CREATED)
        if created:
            log.info(
                "shard sync created %d lease(s) from %d shard(s): %s",
                len(created),
                len(shards),
                ", ".join(created),
            )
        else:
            log.debug("shard sync: %d shard(s), no lease to create", len(shards))
        return SyncResult(len(shards), tuple(created), empty, self._reopen(current, shards))

    def _reopen(self, leases: list[Lease], shards: list[Shard]) -> tuple[str, ...]:
        """Reopen the false shard ends among ``leases`` (read before ``shards`` were listed)."""
        done = []
        for lease in false_shard_ends(leases, shards):
            key = lease.lease_key
            log.error(
                "lease %s is checkpointed at SHARD_END but ListShards shows shard %s open: that "
                "end is false and would leave the shard unread for good. Reopening it at "
                "TRIM_HORIZON (what the shard holds is delivered again; `kclpy-spark reset "
                "--shard %s --to ...` starts it elsewhere)",
                key,
                lease.shard_id,
                lease.shard_id,
            )
            if self._table.update_lease(reopened(lease)) is not None:
                done.append(key)
            else:
                log.warning("lease %s changed meanwhile; the next sync looks again", key)
        return tuple(done)
