"""Shard discovery and the KCL's lease hierarchy rules."""

from shard_sync.hierarchy import (
    BlockedOnParentShardError,
    InconsistentShardGraphError,
    NewLease,
    child_leases_at_shard_end,
    leases_to_create,
)
from shard_sync.shards import Shard

__all__ = [
    "BlockedOnParentShardError",
    "InconsistentShardGraphError",
    "NewLease",
    "Shard",
    "child_leases_at_shard_end",
    "leases_to_create",
]
