"""Lease cleanup and the hash-range auditor: which leases may go, and when a sync is due.

Pure decisions over a lease-table scan (and, for garbage, a shard listing), plus a small manager
the leader ticks. Deletes are conditional on the counter seen in the scan, so a lease that changed
since is left alone until the next round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import Lease, stream_key_parts
from checkpoint.sequence import TRIM_HORIZON
from shard_sync.discovery import ShardLister
from shard_sync.hierarchy import (
    children_by_parent,
    index_shards,
    lease_hash_range_holes,
    new_leases,
    parents_gone,
)
from shard_sync.shards import Shard
from shard_sync.syncer import LeadershipLapsed, ShardSyncer, ShardSyncTable, SyncResult

log = logging.getLogger(__name__)


def completed_leases_to_delete(leases: Iterable[Lease]) -> list[Lease]:
    """SHARD_END leases that may be deleted (the KCL's LeaseCleanupManager rule).

    A finished lease goes once every child it recorded has a lease that has started (its
    checkpoint is past TRIM_HORIZON / AT_TIMESTAMP), and no lease of its own parents remains
    (so parents always leave before their children, and a child's wait on its parents ends).
    A lease that recorded no children stays: without them we cannot tell its children started.
    """
    by_key = {lease.lease_key: lease for lease in leases}
    deletable: list[Lease] = []
    for lease in by_key.values():
        if not lease.checkpoint.is_shard_end or not lease.child_shard_ids:
            continue
        children = [by_key.get(lease.sibling_key(child)) for child in lease.child_shard_ids]
        if any(child is None or not child.started for child in children):
            continue
        if any(lease.sibling_key(parent) in by_key for parent in lease.parent_shard_ids):
            continue
        deletable.append(lease)
    return sorted(deletable, key=lambda lease: lease.lease_key)


def garbage_leases(leases: Iterable[Lease], listed_shard_ids: Collection[str]) -> list[Lease]:
    """Leases whose shard no longer exists in a complete listing of the stream.

    The listing must have been taken *after* ``leases`` were read: a lease created after the
    listing (a child leased at its parent's SHARD_END, just after a reshard) is missing from it
    without being garbage, and deleting it would strand its hash range for good (the finished
    parent never recreates it, and the sync rule leaves an open child of a leased parent to that
    parent). Like the KCL, a lease whose parent shard is still listed is never garbage either:
    shards expire oldest first, so a listed parent means the listing is older than its child.
    A listing is only a hint: ``LeaderMaintenance.delete_garbage`` deletes a candidate only once
    Kinesis says its very shard is not found.
    """
    return sorted(
        (
            lease
            for lease in leases
            if lease.shard_id not in listed_shard_ids
            and not any(parent in listed_shard_ids for parent in lease.parent_shard_ids)
        ),
        key=lambda lease: lease.lease_key,
    )


def former_stream_leases(leases: Iterable[Lease], stream_key: str | None) -> list[Lease]:
    """Multi-stream leases of an earlier stream of the same account and name as ``stream_key``
    (``account:name:creationEpoch``): that stream was deleted and made again, so nothing can
    read them, and no other cleanup looks at them (each looks at its own stream's key)."""
    mine = stream_key_parts(stream_key)
    if mine is None or not mine[2].isdigit():
        return []

    def earlier(lease: Lease) -> bool:
        theirs = stream_key_parts(lease.stream_key)
        return (
            theirs is not None
            and theirs[:2] == mine[:2]
            and theirs[2].isdigit()
            and int(theirs[2]) < int(mine[2])
        )

    return sorted(filter(earlier, leases), key=lambda lease: lease.lease_key)


@dataclass(frozen=True)
class AuditResult:
    holes: int
    consecutive: int
    synced: SyncResult | None
    deleted: tuple[str, ...]


class LeaderMaintenance:
    """What the shard-sync leader does each round: audit hash-range coverage, sync when leases
    have left a hole for ``hole_threshold`` consecutive rounds (the KCL's lease-recovery auditor;
    holes appear briefly during every reshard, hence the confidence threshold) or when the table
    is empty, and delete finished leases."""

    def __init__(
        self,
        syncer: ShardSyncer,
        table: ShardSyncTable,
        *,
        hole_threshold: int = 3,
        lister: ShardLister | None = None,
        shard_gone: Callable[[Lease], bool] | None = None,
        garbage_every: int = 10,
        max_garbage_probes: int = 25,
    ) -> None:
        if hole_threshold < 1 or garbage_every < 1:
            raise ValueError("hole_threshold and garbage_every must be >= 1")
        self._syncer = syncer
        self._table = table
        self._threshold = hole_threshold
        self._consecutive = 0
        # Garbage needs a full ListShards, so it runs only every ``garbage_every`` rounds (the KCL
        # checks for garbage every 30 minutes, completed leases every 5).
        self._lister = lister
        self._garbage_every = garbage_every
        # Whether Kinesis says a lease's very shard is not found (the KCL deletes a garbage lease
        # only on ResourceNotFound from its shard): one listing that leaves shards out (a page
        # lost, an empty answer) must not delete the leases and checkpoints of live shards. At
        # most ``max_garbage_probes`` are asked a round (a round is one call each); the rest wait
        # for the next garbage round.
        self._shard_gone = shard_gone
        self._max_probes = max_garbage_probes
        self._probe_from = 0  # where the next round's probes start among the candidates
        # Missing parents of an aged-out lease's descendants, probed this garbage round.
        self._parents_seen_gone: dict[str, bool] = {}
        self._rounds = 0
        # Why the last shard sync failed (None: it succeeded, or none ran yet). A sync has retried
        # ListShards for about a minute before it fails; other steps of a round do not count.
        self.sync_failure: str | None = None

    def run_once(self) -> AuditResult:
        scanned = self._table.list_leases()
        leases = [lease for lease in scanned if self._syncer.owns(lease)]
        synced: SyncResult | None = None
        audited = self._with_known_ranges(leases)
        active = [lease for lease in audited if not lease.checkpoint.is_shard_end]
        holes = lease_hash_range_holes(audited)
        unknown_range = any(lease.hash_key_range is None for lease in active)
        sync_error: KclpySparkError | None = None
        if not leases:
            synced, sync_error = self._sync(leases)
            self._consecutive = 0
        elif holes or unknown_range:
            self._consecutive += 1
            log.info(
                "lease audit: %d hash-range hole(s)%s (%d of %d rounds before a sync)",
                len(holes),
                ", leases without a hash range" if unknown_range else "",
                self._consecutive,
                self._threshold,
            )
            if self._consecutive >= self._threshold:
                synced, sync_error = self._sync(leases)
                if sync_error is None:
                    self._consecutive = 0
        else:
            self._consecutive = 0
            self.sync_failure = None  # covered again (by a shard end, another leader's sync)
        deleted = self._clean_up(leases, scanned)
        if sync_error is not None:  # after the cleanup: a sync that keeps failing stops no delete
            raise sync_error
        return AuditResult(len(holes), self._consecutive, synced, tuple(deleted))

    def _clean_up(self, leases: list[Lease], scanned: list[Lease]) -> list[str]:
        """Delete finished leases, and every ``garbage_every`` rounds those of shards gone and
        those of an earlier stream of this one's name."""
        deleted = []
        for lease in completed_leases_to_delete(leases):
            if self._table.delete_lease(lease):
                deleted.append(lease.lease_key)
                log.info("deleted finished lease %s: its children have started", lease.lease_key)
        self._rounds += 1
        garbage_due = self._rounds % self._garbage_every == 0
        if garbage_due:
            for lease in former_stream_leases(scanned, self._syncer.stream_key):
                if self._table.delete_lease(lease):
                    deleted.append(lease.lease_key)
                    log.warning("deleted lease %s: its stream was deleted and made again",
                                lease.lease_key)  # fmt: skip
        if self._lister is not None and self._shard_gone is not None and garbage_due:
            gone = set(deleted)
            deleted.extend(
                self.delete_garbage(
                    [lease for lease in leases if lease.lease_key not in gone], self._lister
                )
            )
        return deleted

    def _with_known_ranges(self, leases: list[Lease]) -> list[Lease]:
        """``leases``, those without a hash range given the one the last listing showed."""
        known = self._syncer.known_ranges
        if not known:
            return leases
        return [
            lease
            if lease.hash_key_range is not None or lease.shard_id not in known
            else replace(lease, hash_key_range=known[lease.shard_id])
            for lease in leases
        ]

    def _sync(self, leases: list[Lease]) -> tuple[SyncResult | None, KclpySparkError | None]:
        try:
            result = self._syncer.sync(leases)
        except LeadershipLapsed:
            raise  # no failure of the sync's: another leader's round goes on
        except KclpySparkError as exc:
            self.sync_failure = str(exc)
            return None, exc
        self.sync_failure = None
        return result, None

    def delete_garbage(self, scanned_before: Iterable[Lease], lister: ShardLister) -> list[str]:
        """Delete the leases of shards that no longer exist; returns the deleted lease keys.

        ``scanned_before`` is a scan of the table taken before this call: only its leases can be
        garbage, because the full listing made here is newer than each of them (see
        garbage_leases). A candidate is deleted only when ``shard_gone`` confirms it, as read
        again after the listing (fresh counters, so an active holder's renewal since the first
        scan does not defeat the conditional delete). An empty listing deletes nothing: a stream
        always has an open shard, so it is a wrong answer, not an empty stream.
        """
        candidates = {lease.lease_key for lease in scanned_before}
        self._parents_seen_gone = {}
        shards = index_shards(lister.list_shards())
        listed = set(shards)
        if not listed:
            log.warning("garbage cleanup: ListShards answered no shard at all; deleting nothing")
            return []
        deleted = []
        owned = [lease for lease in self._table.list_leases() if self._syncer.owns(lease)]
        fresh = [lease for lease in owned if lease.lease_key in candidates]
        leased = {lease.shard_id for lease in owned}
        for lease in self._to_probe(garbage_leases(fresh, listed)):
            if not self._confirmed_gone(lease):
                continue
            if not self._lease_children_first(lease, shards, leased):
                continue
            if self._table.delete_lease(lease):
                deleted.append(lease.lease_key)
                log.warning("deleted lease %s: its shard no longer exists", lease.lease_key)
        return deleted

    def _lease_children_first(
        self, lease: Lease, shards: Mapping[str, Shard], leased: Collection[str]
    ) -> bool:
        """Before the lease of a shard that aged out unfinished goes (workers down longer than
        the retention, across a reshard): lease its oldest listed descendants at TRIM_HORIZON,
        as its shard end would have made its children (``oldest_descendants``). Deleted
        without, they were leased as roots at the initial position by the next sync: at LATEST,
        all they still held was skipped. False when that failed (the lease then stays until a
        later round)."""
        if lease.checkpoint.is_shard_end:
            return True
        children = oldest_descendants(lease, shards, leased)
        if not self._parents_confirmed_gone(lease, shards, children):
            return False
        try:
            for spec in new_leases(shards, children, TRIM_HORIZON):
                if self._table.create_lease_if_absent(spec.to_lease(lease.stream_key)):
                    log.warning("lease %s: its shard aged out unfinished; its child %s leased "
                                "at TRIM_HORIZON", lease.lease_key, spec.shard_id)  # fmt: skip
        except LeadershipLapsed:
            raise
        except KclpySparkError as exc:
            log.warning(
                "lease %s: its children could not be leased (%s); kept", lease.lease_key, exc
            )
            return False
        return True

    def _parents_confirmed_gone(
        self, lease: Lease, shards: Mapping[str, Shard], descendants: list[str]
    ) -> bool:
        """Whether the parents of ``descendants`` that the listing left out (besides ``lease``'s
        own shard) are gone from the stream, each confirmed as ``lease``'s was: a listing that
        lost a page left out a child still in retention, and its children, leased in its stead,
        were read before it while it never was."""
        missing = {p for sid in descendants for p in shards[sid].parent_ids if p not in shards}
        missing.discard(lease.shard_id)
        for parent in sorted(missing):
            key = lease.sibling_key(parent)
            if key not in self._parents_seen_gone:  # asked once a round (merges share them)
                probe = replace(lease, lease_key=key)
                self._parents_seen_gone[key] = self._confirmed_gone(probe)
            if not self._parents_seen_gone[key]:
                return False
        return True

    def _to_probe(self, candidates: list[Lease]) -> list[Lease]:
        """At most ``max_garbage_probes`` of ``candidates``, taking turns round by round (so
        candidates whose shard exists never keep the others from being asked)."""
        if len(candidates) <= self._max_probes:
            return candidates
        start = self._probe_from % len(candidates)
        self._probe_from = start + self._max_probes
        return (candidates[start:] + candidates[:start])[: self._max_probes]

    def _confirmed_gone(self, lease: Lease) -> bool:
        assert self._shard_gone is not None
        try:
            gone = self._shard_gone(lease)
        except KclpySparkError as exc:
            log.info("lease %s: not in the listing; whether its shard exists is unknown (%s), "
                     "so it stays", lease.lease_key, exc)  # fmt: skip
            return False
        if not gone:
            log.info("lease %s: its shard is missing from the listing but exists; kept",
                     lease.lease_key)  # fmt: skip
        return gone


def oldest_descendants(
    lease: Lease, shards: Mapping[str, Shard], leased: Collection[str]
) -> list[str]:
    """The listed shards that are the oldest left of the aged-out ``lease``'s descendants: its
    children, and, where children aged out too, the listed shards none of whose parents is
    listed or leased, within its hash range (a shard in it, listed while it is not, came after
    it: the key space's open shards never overlap, and an ancestor ages out first). The KCL
    leaves those to the sync, as roots at the initial position. A shard with a leased
    descendant is left out: it was read to its end and its lease deleted (leased again by a
    later round for another aged-out lease of the same range, it was read twice, after its
    children)."""
    mine = lease.hash_key_range
    found = []
    for sid, shard in shards.items():
        if lease.shard_id in shard.parent_ids or (
            mine is not None
            and parents_gone(shard, shards, leased)
            and mine.overlaps(shard.hash_key_range)
        ):
            found.append(sid)
    if not found:
        return found
    children = children_by_parent(shards.values())
    return [sid for sid in found if not _descendant_leased(sid, children, leased)]


def _descendant_leased(
    shard_id: str, children: Mapping[str, list[str]], leased: Collection[str]
) -> bool:
    """Whether a listed descendant of ``shard_id`` (a child, a child's child...) has a lease."""
    todo, seen = list(children.get(shard_id, ())), set()
    while todo:
        sid = todo.pop()
        if sid in leased:
            return True
        if sid not in seen:
            seen.add(sid)
            todo.extend(children.get(sid, ()))
    return False
