"""An in-memory lease table: the port's reference semantics, for tests and single processes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.lease import Lease, WriteStamp, refuse_regression
from checkpoint.port import CoordinationRecord, TableScan
from checkpoint.sequence import ExtendedSequenceNumber


class MemoryLeaseTable:
    """Implements LeaseTable and CoordinationStore in a dict guarded by a lock. Writes that move
    a lease counter are stamped with ``clock``'s wall time (see ``WriteStamp``)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._leases: dict[str, Lease] = {}
        self._records: dict[str, CoordinationRecord] = {}
        self._lock = threading.RLock()

    def ensure_table(self) -> None:
        return None

    def list_leases(self) -> list[Lease]:
        with self._lock:
            return list(self._leases.values())

    def get_lease(self, lease_key: str) -> Lease | None:
        with self._lock:
            return self._leases.get(lease_key)

    def scan_table(self, record_prefix: str) -> TableScan:
        with self._lock:
            records = (r for k, r in self._records.items() if k.startswith(record_prefix))
            return TableScan(tuple(self._leases.values()), tuple(records))

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        with self._lock:
            return [k for k, lease in self._leases.items() if lease.lease_owner == owner]

    def is_empty(self) -> bool:
        with self._lock:
            return not self._leases

    def create_lease_if_absent(self, lease: Lease) -> bool:
        with self._lock:
            if lease.lease_key in self._leases:
                return False
            self._leases[lease.lease_key] = lease
            return True

    def _swap(
        self,
        expected: Lease,
        build: Callable[[Lease], Lease],
        *,
        check_owner: bool,
        check_handoff: bool = False,
    ) -> Lease | None:
        """Store ``build(current)`` if the stored lease meets the condition; read, check and
        write under one lock (a handoff begun between a read and a write must not be undone)."""
        with self._lock:
            current = self._leases.get(expected.lease_key)
            if current is None or current.lease_counter != expected.lease_counter:
                return None
            if check_owner and current.actual_owner != expected.actual_owner:
                return None
            if check_handoff and (
                current.lease_owner != expected.lease_owner
                or current.checkpoint_owner != expected.checkpoint_owner
            ):
                return None
            return self._store(build(current))

    def _store(self, new: Lease) -> Lease:
        """Store ``new`` (its counter moved), stamped with the time of this write."""
        new = replace(new, written=WriteStamp(new.lease_counter, self._clock.wall()))
        self._leases[new.lease_key] = new
        return new

    def renew_lease(self, lease: Lease) -> Lease | None:
        if lease.actual_owner is None:
            return None
        measured = lease.renewal_figures()

        def renewed(current: Lease) -> Lease:
            return current.bumped(**measured)  # type: ignore[arg-type]

        return self._swap(lease, renewed, check_owner=True)

    def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        # From the caller's view, as the KCL's takeLease and the DynamoDB store count; only from
        # one owner to another, not from unowned.
        switched = lease.lease_owner is not None and lease.lease_owner != owner
        switches = lease.owner_switches_since_checkpoint + switched

        def taken(current: Lease) -> Lease:
            return current.bumped(
                lease_owner=owner, owner_switches_since_checkpoint=switches, checkpoint_owner=None
            )

        return self._swap(lease, taken, check_owner=False)

    def evict_lease(self, lease: Lease) -> Lease | None:
        # Mid-handoff only the checkpoint owner goes: the lease passes to the new owner at once.
        gone = {"checkpoint_owner" if lease.handoff_pending else "lease_owner": None}
        return self._swap(
            lease, lambda current: current.bumped(**gone), check_owner=True, check_handoff=True
        )

    def initiate_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        with self._lock:
            current = self._leases.get(lease.lease_key)
            if (
                lease.lease_owner is None
                or current is None
                or current.lease_owner != lease.lease_owner
                or current.handoff_pending
            ):
                return None
            new = replace(current, lease_owner=new_owner, checkpoint_owner=current.lease_owner)
            self._leases[lease.lease_key] = new
            return new

    def complete_handoff(self, lease: Lease) -> Lease | None:
        with self._lock:
            current = self._leases.get(lease.lease_key)
            if (
                lease.checkpoint_owner is None
                or current is None
                or current.lease_counter != lease.lease_counter
                or current.lease_owner != lease.lease_owner
                or current.checkpoint_owner != lease.checkpoint_owner
            ):
                return None
            return self._store(
                current.bumped(
                    checkpoint_owner=None,
                    owner_switches_since_checkpoint=current.owner_switches_since_checkpoint + 1,
                )
            )

    def update_lease(self, lease: Lease) -> Lease | None:
        return self._update(lease)

    def _update(self, lease: Lease) -> Lease | None:
        def updated(current: Lease) -> Lease:
            return current.bumped(
                checkpoint=lease.checkpoint,
                pending_checkpoint=lease.pending_checkpoint,
                pending_checkpoint_state=lease.pending_checkpoint_state,
                owner_switches_since_checkpoint=lease.owner_switches_since_checkpoint,
                child_shard_ids=lease.child_shard_ids,
                closed_until=lease.closed_until,
                closed_count=lease.closed_count,
                start_timestamp=lease.start_timestamp,
            )

        return self._swap(lease, updated, check_owner=True)

    def update_checkpoint(
        self,
        lease: Lease,
        checkpoint: ExtendedSequenceNumber,
        pending: ExtendedSequenceNumber | None = None,
    ) -> Lease | None:
        refuse_regression(lease, checkpoint)
        with self._lock:  # re-entrant: the check and the write see one state
            current = self._leases.get(lease.lease_key)
            if current is None or current.checkpoint != lease.checkpoint:
                return None
            return self._update(lease.checkpointed(checkpoint, pending))

    def delete_lease(self, lease: Lease) -> bool:
        with self._lock:
            current = self._leases.get(lease.lease_key)
            if current is None or current.lease_counter != lease.lease_counter:
                return False
            del self._leases[lease.lease_key]
            return True

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        with self._lock:
            return self._records.get(key)

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        with self._lock:
            current = self._records.get(record.key)
            stored_version = None if current is None else current.version
            if stored_version != expected_version:
                return False
            self._records[record.key] = record
            return True

    def delete_record(self, key: str, expected_version: int) -> bool:
        with self._lock:
            current = self._records.get(key)
            if current is None or current.version != expected_version:
                return False
            del self._records[key]
            return True
