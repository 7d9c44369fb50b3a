r"""Which leases must exist for a stream's shards: the KCL's HierarchicalShardSyncer rules, pure.

Nothing here does I/O or reads a clock; the caller lists shards, reads the lease table, and writes
the leases these functions name (each with a create-if-not-exists, so a crash part-way is harmless).

**Shard sync** (:func:`leases_to_create`, at startup and every sync interval)

*Empty lease table.* Every shard in the listing gets a lease at the initial position. The caller
lists with the ShardFilter that matches the position (AT_LATEST, AT_TRIM_HORIZON, AT_TIMESTAMP),
so the listing holds exactly the shards open at that point; any closed ones among them are read to
their end, and their children are then found through GetRecords' ChildShards (rule below).

*Non-empty lease table.* Start from every open shard that has no lease and walk towards its
parents (a parent missing from the listing has aged out of retention and is ignored, unless it
still has a lease: the listing lagged or lost a page, and the parent covers its children). A
shard is *covered* (the KCL says "descendant") when it has a lease, or when one of its parents is
covered or is marked to be read from the start. With TRIM_HORIZON or AT_TIMESTAMP, a shard
reached by the walk that is not covered is marked to be read from the start; with LATEST nothing
is marked.
When a shard is covered, each of its parents that has no lease and is not covered itself is the
oldest un-leased ancestor on that line: it gets a lease, so the hash range it held is not skipped.
An open shard that is covered gets no lease now (its parents' SHARD_END will create it, after they
are read); an open shard that is not covered gets a lease of its own. The walk is memoized and uses
an explicit stack, so deep reshard histories cost one visit per shard and no Python recursion.

Each created lease starts at the initial position. The KCL words the parent case as "TRIM_HORIZON
if the parent is a descendant, unless the position is AT_TIMESTAMP", but a parent only ever gets a
lease when it is not covered, and then it counts as a descendant exactly when it is marked, which
happens only under TRIM_HORIZON or AT_TIMESTAMP; so the checkpoint is always the initial position.
Under LATEST this means an uncovered parent of a merge whose other parent is covered starts at
LATEST (the KCL documents this).

*Inconsistent listing.* A shard whose parent is still open cannot exist in a consistent listing
(the listing raced a reshard). Both table rules raise :class:`InconsistentShardGraphError` then,
unless ``ignore_unexpected_child_shards``: the non-empty rule then skips those shards; the
empty rule, like the KCL's, still gives every listed shard a lease.

Leases come back sorted by starting sequence number (as a number), then shard id: created in that
order, an interrupted sync leaves ancestors leased before descendants.

Example (sequence numbers double as time; 6 = merge(0, 1), 7 = merge(2, 3), 8 = merge(6, 7),
9 and 10 = split(5)); with leases for 4, 5 and 7::

    0 1 2 3 4   5     shards till 102      LATEST        -> 6 at LATEST
    \ / \ / |   |                          TRIM_HORIZON  -> 0, 1 at TRIM_HORIZON
     6   7  4   5     103 - 205            AT_TIMESTAMP  -> 0, 1 at AT_TIMESTAMP
     \  /   |  / \
       8    4 9  10   206 on, open

**Shard end** (:func:`child_leases_at_shard_end`, the KCL's ShutdownTask): when a consumer reaches
SHARD_END, each child named in GetRecords' ChildShards gets a lease at TRIM_HORIZON unless it has
one. A merge child (the only child) must name exactly two parents, else InvalidStateError; it is
created only when both parents' leases are present or both absent. If just one is present, the
table is caught mid-change (the other parent's lease is not created yet, or was just removed), and
the call raises :class:`BlockedOnParentShardError` rather than create a child that the missing
parent's history should precede (retriable; the KCL then sleeps and retries with the lease kept,
or one time in 30 drops the lease so another worker takes over).

**Audit** (:func:`lease_hash_range_holes`, the KCL's leader-only auditor): the parts of the hash
key space that no lease short of SHARD_END covers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, ClassVar

from checkpoint.base.errors import InvalidStateError, KclpySparkError
from checkpoint.lease import HashKeyRange, Lease, lease_key_of, sibling_key
from checkpoint.sequence import (
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
    Position,
    Sentinel,
)
from shard_sync.shards import ChildShard, Shard, find_hash_range_holes

# Error messages list at most this many shard ids: a sync over 100k shards must not log megabytes.
_MAX_IDS_IN_MESSAGE = 20


def _name_ids(ids: Sequence[str]) -> str:
    shown = " ".join(ids[:_MAX_IDS_IN_MESSAGE])
    more = len(ids) - _MAX_IDS_IN_MESSAGE
    return f"{shown} ... and {more} more" if more > 0 else shown


class InconsistentShardGraphError(KclpySparkError):
    """The listing shows children of a still-open parent: it raced a reshard. List again."""

    retriable: ClassVar[bool] = True

    def __init__(self, shard_ids: Iterable[str]) -> None:
        self.shard_ids = tuple(sorted(shard_ids))
        super().__init__(
            f"{len(self.shard_ids)} shard(s) whose parent is still open: "
            f"{_name_ids(self.shard_ids)}; the shard listing raced a reshard, list again"
        )


class BlockedOnParentShardError(KclpySparkError):
    """A merge child's lease must wait: only one of its two parents has a lease yet."""

    retriable: ClassVar[bool] = True

    def __init__(self, child_shard_id: str, missing_parent_ids: Iterable[str]) -> None:
        self.child_shard_id = child_shard_id
        self.missing_parent_ids = tuple(sorted(missing_parent_ids))
        super().__init__(
            f"merge child {child_shard_id}: parent lease(s) {' '.join(self.missing_parent_ids)} "
            "not in the lease table (only the other parent's is); deferring its lease"
        )


@dataclass(frozen=True)
class NewLease:
    """A lease the rules say must exist: what to write with create-if-not-exists.

    ``starting_sequence_number`` is the shard's, when known (None for leases made from ChildShards,
    which carry no sequence numbers). ``parent_shard_ids`` keeps every parent the service named,
    including ones already trimmed from the listing, as the KCL stores them.
    """

    shard_id: str
    checkpoint: ExtendedSequenceNumber
    parent_shard_ids: frozenset[str]
    hash_key_range: HashKeyRange
    starting_sequence_number: str | None = None

    def to_lease(
        self, stream_key: str | None = None, *, start_timestamp: float | None = None
    ) -> Lease:
        """The unowned lease row (counter 0). ``stream_key`` gives the multi-stream key format
        ``<stream_key>:<shard_id>`` (e.g. ``account:stream:creationEpoch``). ``start_timestamp``
        is stored with an AT_TIMESTAMP checkpoint (and ignored with any other)."""
        at_timestamp = self.checkpoint.sentinel is Sentinel.AT_TIMESTAMP
        return Lease(
            lease_key=lease_key_of(stream_key, self.shard_id),
            checkpoint=self.checkpoint,
            lease_owner=None,
            lease_counter=0,
            parent_shard_ids=self.parent_shard_ids,
            hash_key_range=self.hash_key_range,
            start_timestamp=start_timestamp if at_timestamp else None,
        )


def leases_to_create(
    shards: Sequence[Shard],
    leased_shard_ids: Collection[str],
    initial_position: InitialPosition,
    *,
    ignore_unexpected_child_shards: bool = False,
    unfinished_ranges: Mapping[str, HashKeyRange] | None = None,
) -> list[NewLease]:
    """The leases a shard sync must create, sorted by starting sequence number then shard id.

    ``leased_shard_ids`` are the shard ids (not multi-stream lease keys) of the stream's current
    leases. Empty means the empty-table rule: pass the listing made with the ShardFilter for
    ``initial_position``. Otherwise pass the full listing. Raises InconsistentShardGraphError (see
    the module docstring) and ValueError for a listing that is not a graph (a shard id listed twice
    with different details, or a parent cycle). ``unfinished_ranges``: the hash ranges of the
    stream's leases not at SHARD_END, by shard id (``_AncestryWalk.read_above``).
    """
    if leased_shard_ids:
        return non_empty_table_leases(
            shards,
            leased_shard_ids,
            initial_position,
            ignore_unexpected_child_shards=ignore_unexpected_child_shards,
            unfinished_ranges=unfinished_ranges,
        )
    return empty_table_leases(
        shards, initial_position, ignore_unexpected_child_shards=ignore_unexpected_child_shards
    )


def empty_table_leases(
    shards: Sequence[Shard],
    initial_position: InitialPosition,
    *,
    ignore_unexpected_child_shards: bool = False,
) -> list[NewLease]:
    """The KCL's EmptyLeaseTableSynchronizer: a lease for every listed shard, at the position."""
    by_id = index_shards(shards)
    _check_consistent(by_id, ignore_unexpected_child_shards)
    return new_leases(by_id, by_id.keys(), initial_position.checkpoint)


def non_empty_table_leases(
    shards: Sequence[Shard],
    leased_shard_ids: Collection[str],
    initial_position: InitialPosition,
    *,
    ignore_unexpected_child_shards: bool = False,
    unfinished_ranges: Mapping[str, HashKeyRange] | None = None,
) -> list[NewLease]:
    """The KCL's NonEmptyLeaseTableSynchronizer, whatever the size of ``leased_shard_ids``.

    :func:`leases_to_create` calls this when the table has leases; it is public because the KCL's
    own tests also run this rule against an empty table, and ours compare with them.
    """
    by_id = index_shards(shards)
    inconsistent = _check_consistent(by_id, ignore_unexpected_child_shards)
    leased = leased_shard_ids if isinstance(leased_shard_ids, Set) else frozenset(leased_shard_ids)
    walk = _AncestryWalk(by_id, leased, initial_position.position, unfinished_ranges)
    chosen: set[str] = set()
    for shard in by_id.values():
        sid = shard.shard_id
        if not shard.is_open or sid in leased or sid in inconsistent:
            continue
        if not walk.is_covered(sid):
            chosen.add(sid)
    chosen |= walk.ancestors_to_lease
    return new_leases(by_id, chosen, initial_position.checkpoint)


class _AncestryWalk:
    """The memoized parent walk behind the non-empty rule (the KCL's MemoizationContext plus
    checkIfDescendantAndAddNewLeasesForAncestors), with an explicit stack instead of recursion."""

    def __init__(
        self,
        by_id: Mapping[str, Shard],
        leased: Set[str],
        position: Position,
        unfinished_ranges: Mapping[str, HashKeyRange] | None = None,
    ) -> None:
        self._by_id = by_id
        self._leased = leased
        self._unfinished = dict(unfinished_ranges or {})
        self._marks_uncovered = position in (Position.TRIM_HORIZON, Position.AT_TIMESTAMP)
        self._covered: dict[str, bool] = {}  # the KCL's isDescendant memo
        self._from_start: set[str] = set()  # the KCL's shouldCreateLease marks
        self.ancestors_to_lease: set[str] = set()

    def _listed_parents(self, sid: str) -> tuple[str, ...]:
        # Parents outside the listing have aged out of retention: the walk ignores them. A parent
        # with a lease is kept though (the KCL drops it too): a listing can lag or lose a page, and
        # the child of a leased parent is leased at that parent's shard end, from its start; a
        # lease made now, at LATEST, would then stand and skip what came before.
        by_id, leased = self._by_id, self._leased
        parents = by_id[sid].parent_ids
        for parent_id in parents:
            if parent_id not in by_id and parent_id not in leased:
                return tuple(p for p in parents if p in by_id or p in leased)
        return parents

    def read_above(self, sid: str) -> bool:
        """Whether a shard whose parents are all gone from the listing and the table (the KCL
        takes it for a root) lies under an unfinished lease: in its hash range, of a shard that
        aged out (not listed) or that began before it. Hash ranges overlap only along a line of
        descent, and an ancestor ages out first, so that lease's shard is its ancestor, its line
        read above it. It waits, as a child of a leased parent does: leased now as a root, at
        LATEST, it would skip what it holds (its lease comes from the shard ends between, or
        from garbage cleanup at TRIM_HORIZON when that lease's shard aged out unfinished). A
        lease of a listed shard that began after it is of its descendants (a sync that leased
        one child and not its sibling): not above it."""
        shard = self._by_id[sid]
        if not shard.parent_ids:
            return False
        mine, began = shard.hash_key_range, shard.starting_sequence_int
        for lease_shard, held in self._unfinished.items():
            listed = self._by_id.get(lease_shard)
            if mine.overlaps(held) and (listed is None or listed.starting_sequence_int < began):
                return True
        return False

    def is_covered(self, start: str) -> bool:
        covered, leased, from_start = self._covered, self._leased, self._from_start
        stack = [start]
        expanding: set[str] = set()  # on the current path: seeing one again means a cycle
        while stack:
            sid = stack[-1]
            if sid in covered:
                stack.pop()
                continue
            if sid in leased:
                covered[sid] = True
                stack.pop()
                continue
            parents = self._listed_parents(sid)
            if sid not in expanding:
                expanding.add(sid)
                pending = [p for p in parents if p not in covered]
                if pending:
                    for parent_id in pending:
                        if parent_id in expanding:
                            raise ValueError(
                                f"shard {sid}: parent {parent_id} is also its descendant"
                            )
                    stack.extend(pending)
                    continue
            # Every parent is settled: settle this shard.
            stack.pop()
            expanding.discard(sid)
            is_covered = False
            for parent_id in parents:
                if covered[parent_id] or parent_id in from_start:
                    is_covered = True
                    break
            if not parents and self.read_above(sid):
                is_covered = True
            covered[sid] = is_covered
            if is_covered:
                # An uncovered, unleased parent is the oldest shard on its line that nothing
                # reads yet; its lease closes the gap in this shard's hash range.
                for parent_id in parents:
                    if not covered[parent_id] and parent_id not in leased:
                        self.ancestors_to_lease.add(parent_id)
            elif self._marks_uncovered:
                from_start.add(sid)
        return covered[start]


def parents_gone(shard: Shard, listed: Mapping[str, Shard], leased: Collection[str]) -> bool:
    """Whether ``shard`` names parents and every one is gone from the listing and the table
    (aged out, or a listing that lost a page): the KCL takes it for a root."""
    parents = shard.parent_ids
    return bool(parents) and not any(p in listed or p in leased for p in parents)


def index_shards(shards: Iterable[Shard]) -> dict[str, Shard]:
    """Shards by id, in listing order. An id listed twice must carry the same details (pages of
    a retried listing may repeat a shard); otherwise ValueError naming it."""
    by_id: dict[str, Shard] = {}
    for shard in shards:
        seen = by_id.setdefault(shard.shard_id, shard)
        if seen is not shard and seen != shard:
            raise ValueError(f"shard {shard.shard_id} is listed twice with different details")
    return by_id


def children_by_parent(shards: Iterable[Shard]) -> dict[str, list[str]]:
    """The listed children of each shard id named as a parent, in listing order."""
    children: dict[str, list[str]] = {}
    for shard in shards:
        for parent in shard.parent_ids:
            children.setdefault(parent, []).append(shard.shard_id)
    return children


def find_inconsistent_shard_ids(by_id: Mapping[str, Shard]) -> set[str]:
    """Listed shards that have a listed parent which is still open (the KCL's inconsistent ids)."""
    inconsistent: set[str] = set()
    for sid, shard in by_id.items():
        for parent_id in shard.parent_ids:
            parent = by_id.get(parent_id)
            if parent is not None and parent.ending_sequence_number is None:
                inconsistent.add(sid)
    return inconsistent


def _check_consistent(by_id: Mapping[str, Shard], ignore_unexpected: bool) -> set[str]:
    inconsistent = find_inconsistent_shard_ids(by_id)
    if inconsistent and not ignore_unexpected:
        raise InconsistentShardGraphError(inconsistent)
    return inconsistent


def new_leases(
    by_id: Mapping[str, Shard], shard_ids: Iterable[str], checkpoint: ExtendedSequenceNumber
) -> list[NewLease]:
    ordered = sorted(shard_ids, key=lambda sid: (by_id[sid].starting_sequence_int, sid))
    return [
        NewLease(
            shard_id=sid,
            checkpoint=checkpoint,
            parent_shard_ids=frozenset(by_id[sid].parent_ids),
            hash_key_range=by_id[sid].hash_key_range,
            starting_sequence_number=by_id[sid].starting_sequence_number,
        )
        for sid in ordered
    ]


def child_leases_at_shard_end(
    parent_lease_key: str,
    child_shards: Sequence[Mapping[str, Any]],
    existing: Mapping[str, Lease],
    *,
    gone_parents: Set[str] = frozenset(),
) -> list[NewLease]:
    """The child leases to create when the lease ``parent_lease_key`` reaches SHARD_END.

    ``child_shards`` is GetRecords' ``ChildShards`` list (boto3 shape). ``existing`` maps lease
    keys to the leases now in the table; it must hold at least the children's and the merge
    parents' leases, if any (a full table snapshot will do). Multi-stream keys work: the children's
    and parents' keys reuse the stream part of ``parent_lease_key``; pass the same stream key to
    :meth:`NewLease.to_lease`. Children already leased are left out; the rest come back in the
    order the service listed them, at TRIM_HORIZON.

    Raises ValueError for a malformed entry, InvalidStateError for a child without parents or a
    lone child that does not name two parents, BlockedOnParentShardError when a merge child has
    one parent lease but not the other (see the module docstring; not once the child is leased:
    its own wait for its parents keeps the order, and blocked, a parent whose sibling's finished
    lease was deleted by hand waited until that shard aged out), unless the other parent is in
    ``gone_parents``: shards known to have aged out of the stream, whose records nobody can read
    any more, so the child need not wait for a lease of theirs.
    """
    children = [ChildShard.from_api(entry) for entry in child_shards]

    def key_of(shard_id: str) -> str:
        return sibling_key(parent_lease_key, shard_id)

    if len(children) == 1:
        merged = children[0]
        if len(merged.parent_shard_ids) != 2:
            raise InvalidStateError(
                f"lease {parent_lease_key}: its only child {merged.shard_id} does not name two "
                f"parents (got {list(merged.parent_shard_ids)})"
            )
        if key_of(merged.shard_id) in existing:  # nothing to create: no wait (module doc)
            return []
        parents = merged.parent_shard_ids
        present = [p for p in parents if key_of(p) in existing]
        missing = [p for p in parents if key_of(p) not in existing and p not in gone_parents]
        if present and missing:
            raise BlockedOnParentShardError(merged.shard_id, missing)
    new: list[NewLease] = []
    for child in children:
        if key_of(child.shard_id) in existing:
            continue
        if not child.parent_shard_ids:
            raise InvalidStateError(
                f"child shard {child.shard_id} of {parent_lease_key} names no parent shards"
            )
        new.append(
            NewLease(
                shard_id=child.shard_id,
                checkpoint=TRIM_HORIZON,
                parent_shard_ids=frozenset(child.parent_shard_ids),
                hash_key_range=child.hash_key_range,
            )
        )
    return new


def lease_hash_range_holes(leases: Iterable[Lease]) -> list[HashKeyRange]:
    """Hash key ranges no active lease covers (the KCL's auditor check), in order.

    Leases at SHARD_END are finished and do not count; leases without a stored hash range are
    skipped (the KCL first fills those in from a listing; the caller may do the same).
    """
    return find_hash_range_holes(
        lease.hash_key_range
        for lease in leases
        if lease.hash_key_range is not None and not lease.checkpoint.is_shard_end
    )
