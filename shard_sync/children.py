"""Creating a finished shard's child leases, at its SHARD_END (the KCL's ShutdownTask step).

``create_child_leases`` applies ``hierarchy.child_leases_at_shard_end`` to a fresh scan of the
table and creates what it names (create-if-absent, so two parents of a merge, or a retry, never
create twice). A merge child whose other parent has no lease yet is *blocked*: nothing is created
and the result says which parent is missing; the caller keeps its lease, waits and tries again
(shard sync creates the missing parent's lease in the meantime), and must not checkpoint SHARD_END
before the children exist, or the child's hash range is never read. A missing parent that no
longer exists in the stream (aged out) is passed as ``gone_parents`` and no longer blocks.

``children_of_finished_parents`` names the children whose leases went missing after that step
(the leader's shard sync creates them again).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from checkpoint.lease import Lease, sibling_key
from checkpoint.port import LeaseTable
from checkpoint.sequence import TRIM_HORIZON
from shard_sync.hierarchy import (
    BlockedOnParentShardError,
    NewLease,
    child_leases_at_shard_end,
    children_by_parent,
    index_shards,
    new_leases,
)
from shard_sync.shards import Shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChildLeases:
    """What one attempt did: the children's shard ids, those whose leases it created, and the
    merge parents whose missing leases blocked it (empty when it was not blocked)."""

    children: frozenset[str]
    created: tuple[str, ...] = ()
    blocked_on: tuple[str, ...] = ()

    @property
    def blocked(self) -> bool:
        return bool(self.blocked_on)


def create_child_leases(
    table: LeaseTable,
    parent: Lease,
    child_shards: Sequence[Mapping[str, Any]],
    *,
    gone_parents: Set[str] = frozenset(),
) -> ChildLeases:
    """Create the leases ``parent``'s children need (GetRecords' ``ChildShards``). Raises
    ValueError / InvalidStateError for malformed child shards, table errors as the table does."""
    children = frozenset(str(c["ShardId"]) for c in child_shards if "ShardId" in c)
    if not child_shards:
        return ChildLeases(children)
    existing = _leases_named(table, parent.lease_key, child_shards)
    try:
        new = child_leases_at_shard_end(
            parent.lease_key, child_shards, existing, gone_parents=gone_parents
        )
    except BlockedOnParentShardError as exc:
        return ChildLeases(children, blocked_on=exc.missing_parent_ids)
    created = []
    for spec in new:
        if table.create_lease_if_absent(spec.to_lease(parent.stream_key)):
            created.append(spec.shard_id)
            log.info("shard %s: created child lease %s", parent.shard_id, spec.shard_id)
    return ChildLeases(children, tuple(created))


def _leases_named(
    table: LeaseTable, parent_key: str, child_shards: Sequence[Mapping[str, Any]]
) -> dict[str, Lease]:
    """The leases of the children and of their parents, each read by its key (a scan of the
    whole table at every shard end cost a reshard of N shards N scans of ~2N items)."""
    ids: set[str] = set()
    for entry in child_shards:
        ids.update(x for x in [entry.get("ShardId")] if isinstance(x, str))
        parents = entry.get("ParentShards")
        if isinstance(parents, list):
            ids.update(p for p in parents if isinstance(p, str))
    found = (table.get_lease(sibling_key(parent_key, sid)) for sid in sorted(ids))
    return {lease.lease_key: lease for lease in found if lease is not None}


def children_of_finished_parents(
    shards: Sequence[Shard], leased: Collection[str], finished: Collection[str]
) -> list[NewLease]:
    """Leases (at TRIM_HORIZON) for listed shards that have none though their parents are done:
    every parent's lease is at SHARD_END (``finished``) or gone with its shard (neither leased
    nor listed), at least one is leased, and none of the shard's listed children has a lease.

    A child is leased at its parent's shard end; if that lease goes missing later (deleted by
    an operator while unowned, or a shard end that named no children), nothing makes it again:
    the sync rule counts a leased parent as covering its children, and the parent's shard end
    has passed. The hole audit then synced every third round for ever, and the child's range was
    never read. (The KCL has the same gap.)"""
    by_id = index_shards(shards)
    children = children_by_parent(by_id.values())
    chosen = []
    for shard in by_id.values():
        sid, parents = shard.shard_id, shard.parent_ids
        if sid in leased or not parents or not any(p in finished for p in parents):
            continue
        if not all(p in finished or (p not in leased and p not in by_id) for p in parents):
            continue
        if any(child in leased for child in children.get(sid, ())):
            continue
        chosen.append(sid)
    return new_leases(by_id, chosen, TRIM_HORIZON)
