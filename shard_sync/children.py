"""Creating a finished shard's child leases, at its SHARD_END (the KCL's ShutdownTask step).

``create_child_leases`` applies ``hierarchy.child_leases_at_shard_end`` to a fresh scan of the
table and creates what it names (create-if-absent, so two parents of a merge, or a retry, never
create twice). A merge child whose other parent has no lease yet is *blocked*: nothing is created
and the result says which parent is missing; the caller keeps its lease, waits and tries again
(shard sync creates the missing parent's lease in the meantime), and must not checkpoint SHARD_END
before the children exist, or the child's hash range is never read. A missing parent that no
longer exists in the stream (aged out) is passed as ``gone_parents`` and no longer blocks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from checkpoint.lease import Lease
from checkpoint.port import LeaseTable
from shard_sync.hierarchy import BlockedOnParentShardError, child_leases_at_shard_end

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
    existing = {lease.lease_key: lease for lease in table.list_leases()}
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
