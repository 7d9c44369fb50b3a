"""The lease-table port: every store (memory, SQLite, DynamoDB) implements these methods.

Every state change is a conditional write on the lease counter (and, where the KCL requires it, the
owner). A write that loses its condition returns ``None`` (or ``False``): losing a race is a result,
never an exception. Methods raise only for infrastructure failures (``DependencyError``, retriable),
missing tables (``ResourceNotFoundError``) and corrupt items (``CorruptLeaseError``).

A won write returns the lease as now stored (counter incremented): callers never guess it.

"Owner" in a condition means the lease's *actual* owner (``Lease.actual_owner``): the
``checkpoint_owner`` while a graceful handoff is pending (the old owner keeps renewing and
checkpointing until it completes the handoff), else the ``lease_owner``. The graceful handoff (the
KCL 3.x protocol, same attributes, so tables stay compatible):

1. ``initiate_handoff``: lease_owner := new owner, checkpoint_owner := old owner; counter unchanged
   (the old owner's renewals go on undisturbed);
2. the old owner sees it in its next renewal, lets its processor checkpoint
   (``shutdown_requested``), then ``complete_handoff``: checkpoint_owner removed, counter + 1, so
   nothing of the old tenure can write any more;
3. the new owner takes the lease (``take_lease``) once no handoff is pending. If the old owner
   dies first, its renewals stop and the lease expires like any other: ``take_lease`` clears the
   checkpoint owner.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from checkpoint.lease import Lease
from checkpoint.sequence import ExtendedSequenceNumber

if TYPE_CHECKING:
    from checkpoint.stores.capacity import CapacityMeter


@dataclass(frozen=True)
class CoordinationRecord:
    """A small per-application record (e.g. the shard-sync leader) kept in the lease store.

    ``version`` plays the lease counter's role: writes are conditional on it and increment it.
    """

    key: str
    owner: str | None
    version: int
    expires_at: float  # wall-clock seconds; only the owner's own renewals move it
    data: str = "{}"  # JSON text, free for the record's user


def record_data(data: Mapping[str, object]) -> str:
    """A coordination record's ``data`` as JSON without spaces: every Scan of a lease table that
    holds these records reads them, and a table over 4 KB costs a Scan a read unit instead of
    half of one."""
    return json.dumps(data, separators=(",", ":"))


class LeaseTable(Protocol):
    def ensure_table(self) -> None:
        """Create the table if missing (unless creation is disabled) and check its key schema.

        Raises ResourceNotFoundError if it is missing and creation is disabled, InvalidStateError if
        it exists with the wrong key schema.
        """
        ...

    def list_leases(self) -> list[Lease]:
        """Every lease (eventually consistent on DynamoDB: a write of the last moment may be
        missing; decide with conditional writes). Raises CorruptLeaseError naming a bad item."""
        ...

    def get_lease(self, lease_key: str) -> Lease | None:
        """One lease, or None if absent (consistent read)."""
        ...

    def is_empty(self) -> bool:
        """True when the table holds no lease."""
        ...

    def create_lease_if_absent(self, lease: Lease) -> bool:
        """Store ``lease`` as given if no lease has its key. True if it was created."""
        ...

    def renew_lease(self, lease: Lease) -> Lease | None:
        """Condition: counter == lease.lease_counter and owner == lease.actual_owner.
        Change: counter + 1, and throughput_kbps and figures := the lease's, each unless None.
        Returns the renewed lease as stored (a handoff begun meanwhile shows in its lease_owner
        and checkpoint_owner), or None if the condition failed."""
        ...

    def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        """Condition: counter == lease.lease_counter. Change: owner := ``owner``, counter + 1,
        owner_switches_since_checkpoint + 1 if it had another owner (not when it was unowned: the
        KCL's rule), checkpoint_owner removed."""
        ...

    def evict_lease(self, lease: Lease) -> Lease | None:
        """Release: condition counter == lease.lease_counter and owner == lease.actual_owner.
        Change: owner removed, counter + 1; during a handoff only the checkpoint owner is removed
        (the lease goes to the new owner at once, as the KCL evicts a lease mid-handoff)."""
        ...

    def initiate_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        """Begin a graceful handoff to ``new_owner``. Condition: lease_owner ==
        lease.lease_owner (not None) and no handoff pending. Change: lease_owner := new_owner,
        checkpoint_owner := the old lease_owner; the counter is NOT incremented (the KCL's
        initiateGracefulLeaseHandoff)."""
        ...

    def complete_handoff(self, lease: Lease) -> Lease | None:
        """End a graceful handoff (by the old owner, once its processor has checkpointed or the
        handoff timed out). Condition: counter == lease.lease_counter, lease_owner ==
        lease.lease_owner and checkpoint_owner == lease.checkpoint_owner (not None). Change:
        checkpoint_owner removed, counter + 1, owner_switches_since_checkpoint + 1 (the KCL's
        assignLease to the pending owner)."""
        ...

    def update_lease(self, lease: Lease) -> Lease | None:
        """Write ``lease``'s progress fields (checkpoint, pending checkpoint, owner switches, child
        shard ids, parking fields, start timestamp). Condition: the stored counter ==
        lease.lease_counter and the stored owner == lease.actual_owner. Change: those fields,
        counter + 1."""
        ...

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        """Condition as update_lease, and the stored checkpoint is ``lease.checkpoint``.
        Change: ``lease.checkpointed(checkpoint, pending)`` (checkpoint, pending checkpoint,
        owner_switches_since_checkpoint := 0), counter + 1. Raises CheckpointRegressionError,
        writing nothing, if ``checkpoint`` is before ``lease.checkpoint``: a checkpoint never moves
        backwards by this method (a reset uses update_lease)."""
        ...

    def delete_lease(self, lease: Lease) -> bool:
        """Delete if the counter still equals lease.lease_counter. True if deleted."""
        ...


@dataclass(frozen=True)
class KclWorkerSighting:
    """A KCL 3.x worker's metrics entity found in the lease table (``entityType`` =
    ``WORKER_METRIC_STATS``, KCL 3.5's single-table format): its id and ``lut``, when it last
    wrote it (epoch seconds, by its clock). A Java KCL 3.x worker writes it every 30 s."""

    worker_id: str
    updated_at: float


@dataclass(frozen=True)
class TableScan:
    """The whole lease table as one read saw it: every lease, the coordination records whose key
    starts with the prefix asked for, and the KCL 3.x workers' metrics entities (DynamoDB only:
    the other stores hold no KCL worker)."""

    leases: tuple[Lease, ...]
    records: tuple[CoordinationRecord, ...]
    kcl_workers: tuple[KclWorkerSighting, ...] = ()
    # The KCL 3.x fleet's client version (its "Migration3.0" item's ``cv``; None: none found).
    kcl_client_version: str | None = None


class TableReader(Protocol):
    """Reads that serve the shard-sync leader's assignment and the other workers' discovery."""

    def scan_table(self, record_prefix: str) -> TableScan:
        """Every lease and every coordination record whose key starts with ``record_prefix``,
        in one read (DynamoDB: list_leases' eventually consistent Scan of the lease table, and one
        of the small coordination table beside it)."""
        ...

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        """The keys of the leases whose ``lease_owner`` is ``owner`` (DynamoDB: a Query of the
        KCL's owner index, eventually consistent: a lease assigned a moment ago may be missing)."""
        ...


class CoordinationStore(Protocol):
    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        """The record, or None. ``consistent=False``: DynamoDB's eventually consistent read (half
        the read units; may miss a write of the last second or so), for looks whose decisions a
        conditional write guards anyway."""
        ...

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        """Write ``record`` if the stored version equals ``expected_version`` (None: if absent).
        The stored version becomes ``record.version``. True if it won."""
        ...

    def delete_record(self, key: str, expected_version: int) -> bool:
        """Delete the record if its stored version equals ``expected_version``. True if it won
        (a record written since, or already gone, is a loss)."""
        ...


@runtime_checkable
class MetersCapacity(Protocol):
    """A store that counts the read and write units its calls consumed (the DynamoDB store)."""

    @property
    def capacity(self) -> CapacityMeter: ...


@runtime_checkable
class CountsConnections(Protocol):
    """A store that holds a pool of open connections (the SQLite store)."""

    @property
    def open_connections(self) -> int: ...
