"""A SHARD_END checkpoint on a shard that is still open (a false end), and what replaces it.

A lease checkpointed at SHARD_END is finished: no worker reads its shard again. If the shard is in
fact open (ListShards gives it no ending sequence number), every record written to it from then on
is never delivered. Older versions of this project could write such a checkpoint after a malformed
GetRecords answer (a 200 without a next iterator), and an operator or another program can too.

The rule: a SHARD_END is not honoured for a shard a listing shows open, unless something says it
did end and the listing is the doubtful one: a listed shard names it as a parent, the lease
recorded children (from the service's ChildShards), or another lease names it as a parent. Such a
lease is reopened at TRIM_HORIZON, the one position that loses nothing: the checkpoint it replaced
is gone, so every record the shard still holds is delivered again (at least once, as after any
lost checkpoint). ``kclpy-spark reset --shard`` moves it elsewhere afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable

from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from shard_sync.shards import Shard


def false_shard_ends(leases: Iterable[Lease], shards: Iterable[Shard]) -> list[Lease]:
    """The leases at SHARD_END whose shard ``shards`` (a complete listing, taken after the
    leases were read) lists as open, that recorded no children, and that no listed shard and no
    other lease names as a parent; by lease key."""
    listed, known = list(shards), list(leases)
    parents = {p for s in listed for p in (s.parent_shard_id, s.adjacent_parent_shard_id) if p}
    parents |= {p for lease in known for p in lease.parent_shard_ids}
    open_ids = {s.shard_id for s in listed if s.ending_sequence_number is None}
    return sorted(
        (
            lease
            for lease in known
            if lease.checkpoint.is_shard_end
            and not lease.child_shard_ids
            and lease.shard_id in open_ids
            and lease.shard_id not in parents
        ),
        key=lambda lease: lease.lease_key,
    )


def reopened(lease: Lease) -> Lease:
    """``lease`` with its false SHARD_END replaced by TRIM_HORIZON (for ``update_lease``: the
    owner is left as stored, so the write's condition holds for an unowned finished lease)."""
    return lease.checkpointed(TRIM_HORIZON)
