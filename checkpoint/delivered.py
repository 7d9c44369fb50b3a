"""Which records a lease delivered since its last checkpoint: so a checkpoint can be refused when
it names a sequence number that lies inside the delivered range but is no record of this lease
(one of another shard, a typo). The KCL checks only the range; a wrong value that passes that check
is stored, and the lease then fails on restart ("older than retention") until a manual reset.

Kept per delivered batch, in order: its first and last position and a 64-bit hash of each
record's sequence number (8 bytes per record outstanding, in an array: the records' own strings
are not kept alive). A lookup scans one batch's hashes (a false match needs a 64-bit collision
inside the batch's range). Batches a checkpoint covers are dropped. A processor that delivers
without checkpointing for long would grow it, so at most ``max_records`` are kept, a batch
counting as its records and ``BATCH_WEIGHT`` more (its own objects: about 500 bytes, as much as
64 records' hashes), so about 2 MB per lease however small the batches: older batches are
forgotten, and for positions inside forgotten batches only the range is checked (as the KCL
does).

Pure; the checkpointer calls it under its lock.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from checkpoint.sequence import ExtendedSequenceNumber

# 8 bytes per record: 2 MB at most per lease.
MAX_RECORDS = 250_000
BATCH_WEIGHT = 64  # a batch's own objects (~500 bytes), in records' hashes


@dataclass
class _Batch:
    first: ExtendedSequenceNumber
    last: ExtendedSequenceNumber
    hashes: array[int]

    def holds(self, sequence_number: str) -> bool:
        return hash(sequence_number) in self.hashes


class DeliveredRecords:
    def __init__(
        self, max_records: int = MAX_RECORDS, *, start: ExtendedSequenceNumber | None = None
    ) -> None:
        """``start``: where delivery began, the lease's checkpoint then (a checkpoint there again
        is allowed, as the KCL allows one at the last checkpoint)."""
        self._batches: deque[_Batch] = deque()
        self._records = 0
        self._max = max_records
        self._start = start
        self._forgotten: ExtendedSequenceNumber | None = None  # last position forgotten
        self._covered: ExtendedSequenceNumber | None = None  # the last checkpoint made
        self.tracking = False  # False until a batch with its sequence numbers was delivered

    def delivered(self, sequence_numbers: Sequence[str], last: ExtendedSequenceNumber) -> None:
        """A batch whose records have these sequence numbers (in order) ends at ``last``."""
        if not sequence_numbers:
            return
        self.tracking = True
        first = ExtendedSequenceNumber(sequence_numbers[0])
        self._batches.append(_Batch(first, last, array("q", map(hash, sequence_numbers))))
        self._records += len(sequence_numbers) + BATCH_WEIGHT
        while self._records > self._max and len(self._batches) > 1:
            dropped = self._batches.popleft()
            self._records -= len(dropped.hashes) + BATCH_WEIGHT
            self._forgotten = dropped.last

    def undo_after(self, position: ExtendedSequenceNumber) -> None:
        """Batches after ``position`` were not processed after all (process_records raised)."""
        while self._batches and position < self._batches[-1].last:
            self._records -= len(self._batches.pop().hashes) + BATCH_WEIGHT

    def checkpointed(self, position: ExtendedSequenceNumber) -> None:
        """Forget the batches a checkpoint at ``position`` covers."""
        if self._covered is None or self._covered < position:
            self._covered = position
        while self._batches and self._batches[0].last <= position:
            self._records -= len(self._batches.popleft().hashes) + BATCH_WEIGHT

    def names_a_record(self, position: ExtendedSequenceNumber) -> bool:
        """Whether ``position`` (a sequence number, not a sentinel) is a record delivered since
        the last checkpoint; True when nothing is tracked or its batch was forgotten."""
        if not self.tracking or position.is_sentinel or position == self._start:
            return True
        for bound in (self._forgotten, self._covered):
            if bound is not None and not bound < position:
                return True  # forgotten, or at/below the last checkpoint (checked elsewhere)
        seq = position.sequence_number
        for batch in self._batches:
            if batch.first <= position <= batch.last:
                ends = (batch.first.sequence_number, batch.last.sequence_number)
                return seq in ends or batch.holds(seq)
        return False
