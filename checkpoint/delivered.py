"""Which records a lease delivered since its last checkpoint: so a checkpoint can be refused when
it names a sequence number that lies inside the delivered range but is no record of this lease
(one of another shard, a typo). The KCL checks only the range; a wrong value that passes that check
is stored, and the lease then fails on restart ("older than retention") until a manual reset.

Kept per delivered batch, in order: its first and last position and its sequence numbers (the
strings the records already hold, so about 8 bytes per record outstanding). Batches a checkpoint
covers are dropped. A processor that delivers without checkpointing for long would grow it, so at
most ``max_records`` positions are kept: older batches are forgotten, and for positions inside
forgotten batches only the range is checked (as the KCL does).

Pure; the checkpointer calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from checkpoint.sequence import ExtendedSequenceNumber

# About 8 MB of references at most per lease.
MAX_RECORDS = 1_000_000


@dataclass
class _Batch:
    first: ExtendedSequenceNumber
    last: ExtendedSequenceNumber
    sequence_numbers: Sequence[str]
    _lookup: frozenset[str] | None = field(default=None, repr=False)

    def holds(self, sequence_number: str) -> bool:
        if self._lookup is None:
            self._lookup = frozenset(self.sequence_numbers)
        return sequence_number in self._lookup


class DeliveredRecords:
    def __init__(self, max_records: int = MAX_RECORDS) -> None:
        self._batches: deque[_Batch] = deque()
        self._records = 0
        self._max = max_records
        self._forgotten: ExtendedSequenceNumber | None = None  # last position forgotten
        self._covered: ExtendedSequenceNumber | None = None  # the last checkpoint made
        self.tracking = False  # False until a batch with its sequence numbers was delivered

    def delivered(self, sequence_numbers: Sequence[str], last: ExtendedSequenceNumber) -> None:
        """A batch whose records have these sequence numbers (in order) ends at ``last``."""
        if not sequence_numbers:
            return
        self.tracking = True
        first = ExtendedSequenceNumber(sequence_numbers[0])
        self._batches.append(_Batch(first, last, sequence_numbers))
        self._records += len(sequence_numbers)
        while self._records > self._max and len(self._batches) > 1:
            dropped = self._batches.popleft()
            self._records -= len(dropped.sequence_numbers)
            self._forgotten = dropped.last

    def undo_after(self, position: ExtendedSequenceNumber) -> None:
        """Batches after ``position`` were not processed after all (process_records raised)."""
        while self._batches and position < self._batches[-1].last:
            self._records -= len(self._batches.pop().sequence_numbers)

    def checkpointed(self, position: ExtendedSequenceNumber) -> None:
        """Forget the batches a checkpoint at ``position`` covers."""
        if self._covered is None or self._covered < position:
            self._covered = position
        while self._batches and self._batches[0].last <= position:
            self._records -= len(self._batches.popleft().sequence_numbers)

    def names_a_record(self, position: ExtendedSequenceNumber) -> bool:
        """Whether ``position`` (a sequence number, not a sentinel) is a record delivered since
        the last checkpoint; True when nothing is tracked or its batch was forgotten."""
        if not self.tracking or position.is_sentinel:
            return True
        for bound in (self._forgotten, self._covered):
            if bound is not None and not bound < position:
                return True  # forgotten, or at/below the last checkpoint (checked elsewhere)
        for batch in self._batches:
            if batch.first <= position <= batch.last:
                return batch.holds(position.sequence_number)
        return False
