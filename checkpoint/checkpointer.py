"""The record processor's checkpointer, with amazon-kclpy's API and the KCL's semantics.

``checkpoint(sequence_number=None, sub_sequence_number=None)`` records progress for one lease.
``None`` means "everything delivered so far": the worker keeps the largest permitted position
current with ``set_largest_permitted`` after each delivery and ``mark_shard_end`` when a shard is
closed, after which the largest permitted position is SHARD_END and a checkpoint at the shard's last
sequence number is stored as SHARD_END (KCL #211).

Failures raise ``CheckpointError`` whose ``value`` is the Java exception name kclpy programs test:

* ``IllegalArgumentException``: not a sequence number, a negative sub-sequence number, a value
  outside ``[last checkpoint, largest permitted]``, or one inside it that names no record this
  lease delivered (``checkpoint.delivered``).
* ``ShutdownException``: the lease is lost (not held, expired locally, taken again under a new
  concurrency token, or the conditional write lost). Nothing is written.
* ``ThrottlingException``: the lease table kept throttling after a few retries.
* ``KinesisClientLibDependencyException``: the lease table failed otherwise (not retried here: the
  write's outcome is unknown, and retrying a conditional write that did land would look lost).
* ``InvalidStateException``: stored state is corrupt or the table is missing.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from checkpoint.base.errors import (
    DependencyError,
    InvalidStateError,
    KclpySparkError,
    ResourceNotFoundError,
    ThrottledError,
)
from checkpoint.base.retry import RetryPolicy, call_with_retry
from checkpoint.delivered import DeliveredRecords
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.sequence import (
    MAX_SUB_SEQUENCE,
    SHARD_END,
    ExtendedSequenceNumber,
    parse_sequence_number,
)

ILLEGAL_ARGUMENT = "IllegalArgumentException"
SHUTDOWN = "ShutdownException"
THROTTLING = "ThrottlingException"
DEPENDENCY = "KinesisClientLibDependencyException"
INVALID_STATE = "InvalidStateException"

# A checkpoint blocks the processor, and kclpy programs already retry ThrottlingException in their
# own loop (the sample app: 5 tries, 5 s apart), so retry briefly here: at most ~0.7 s of backoff.
CHECKPOINT_RETRY = RetryPolicy(base_delay=0.1, max_delay=1.0, max_attempts=4, max_elapsed=10.0)


class CheckpointError(KclpySparkError):
    """A failed checkpoint. ``value`` is the Java exception name, as in amazon_kclpy.kcl."""

    def __init__(self, value: str, detail: str = "") -> None:
        super().__init__(f"{value}: {detail}" if detail else value)
        self.value = value
        self.detail = detail

    @property
    def retry_may_help(self) -> bool:
        """True for throttling and dependency failures; False once the lease is lost."""
        return self.value in {THROTTLING, DEPENDENCY}


def _illegal(detail: str) -> CheckpointError:
    return CheckpointError(ILLEGAL_ARGUMENT, detail)


def _parse_position(sequence_number: object, sub_sequence_number: object) -> ExtendedSequenceNumber:
    if not isinstance(sequence_number, str):
        raise _illegal(f"sequence number must be a str, got {sequence_number!r}")
    try:
        parse_sequence_number(sequence_number)
    except ValueError as exc:
        raise _illegal(str(exc)) from None
    sub = 0 if sub_sequence_number is None else sub_sequence_number
    if isinstance(sub, bool) or not isinstance(sub, int):
        raise _illegal(f"sub-sequence number must be an int, got {sub_sequence_number!r}")
    if sub < 0:
        raise _illegal(f"could not checkpoint at invalid, negative sub-sequence number {sub}")
    if sub > MAX_SUB_SEQUENCE:
        raise _illegal(f"sub-sequence number {sub} is past a Java long ({MAX_SUB_SEQUENCE})")
    return ExtendedSequenceNumber(sequence_number, sub)


def _check_state(state: object) -> None:
    """Bytes or None: the stores differed on anything else (a ``str`` was kept by the memory
    store, refused by SQLite as a corrupt lease, given back as bytes by DynamoDB). Its size is
    the store's to refuse: DynamoDB caps the whole item at 400 KB."""
    if state is not None and not isinstance(state, bytes):
        raise _illegal(f"application state must be bytes, got {type(state).__name__}")


def covered(stored: ExtendedSequenceNumber, target: ExtendedSequenceNumber) -> bool:
    """Whether ``target`` is ``(S, 0)`` under a stored ``(S, k > 0)``: a KPL aggregate given whole
    after a checkpoint part way through it (``kpl_deaggregation`` off, ``kpl.skip_through``),
    whose own position is below what is stored. A checkpoint (or pending one) at it writes
    nothing: refusing it as going back stalled the lease on it."""
    return (
        not target.is_sentinel
        and not stored.is_sentinel
        and target.sequence_number == stored.sequence_number
        and target.sub_sequence_number == 0 < stored.sub_sequence_number
    )


class PreparedCheckpoint:
    """A pending checkpoint written by ``prepare_checkpoint``; ``checkpoint()`` commits it."""

    def __init__(self, checkpointer: Checkpointer | None, pending: ExtendedSequenceNumber) -> None:
        self._checkpointer = checkpointer
        self.pending = pending

    def checkpoint(self) -> None:
        """Commit: checkpoint := the pending value, pending cleared. Raises CheckpointError."""
        if self._checkpointer is not None:
            self._checkpointer._commit(self.pending)


class Checkpointer:
    """Checkpoints one lease held by ``holder`` under concurrency token ``token``.

    ``sleep`` is injected so tests of throttling do not wait.
    """

    def __init__(
        self,
        holder: LeaseHolder,
        lease_key: str,
        token: uuid.UUID,
        largest_permitted: ExtendedSequenceNumber,
        *,
        retry_policy: RetryPolicy = CHECKPOINT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        on_write: Callable[[float], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_write = on_write  # told the seconds each successful checkpoint write took
        self._holder = holder
        self.lease_key = lease_key
        self._token = token
        self._largest_permitted = largest_permitted
        self._at_shard_end: ExtendedSequenceNumber | None = None
        self._delivered = DeliveredRecords(start=largest_permitted)
        self._written: ExtendedSequenceNumber | None = None  # the last checkpoint this one wrote
        self.shard_end_written = False  # this one checkpointed SHARD_END
        self._retry_policy = retry_policy
        self._sleep = sleep
        self._monotonic = monotonic  # times each write for ``on_write``
        self._lock = threading.Lock()

    # --- what the worker tells the checkpointer ---------------------------------------------------

    @property
    def largest_permitted(self) -> ExtendedSequenceNumber:
        with self._lock:
            return self._largest_permitted

    @property
    def written(self) -> ExtendedSequenceNumber | None:
        """The last sequence number this checkpointer wrote (None: none yet)."""
        with self._lock:
            return self._written

    def set_largest_permitted(
        self, position: ExtendedSequenceNumber, sequence_numbers: Sequence[str] = ()
    ) -> None:
        """The last record delivered to the processor: the position ``checkpoint()`` records.
        ``sequence_numbers``: those of the batch just delivered, so that a checkpoint naming no
        record of this lease can be refused. Moving back (a batch that was not processed after
        all) forgets the batches after ``position``."""
        with self._lock:
            if self._written is not None and position < self._written:
                # A batch that raised after checkpointing part of itself: what it checkpointed
                # stays checkpointed, so checkpoint() must not aim below it.
                position = self._written
            self._delivered.undo_after(position)
            self._delivered.delivered(sequence_numbers, position)
            self._largest_permitted = position

    def rewind(self, position: ExtendedSequenceNumber) -> None:
        """The processor gets the records after ``position`` again (it lost what it held):
        ``set_largest_permitted(position)``, and a shard end marked before is no more."""
        with self._lock:
            self._at_shard_end = None
        self.set_largest_permitted(position)

    def mark_shard_end(self, last_sequence: ExtendedSequenceNumber | None = None) -> None:
        """The shard is closed and every record was delivered (``last_sequence``: its last record,
        by default the largest permitted position). From now on ``checkpoint()`` records SHARD_END,
        and so does a checkpoint at ``last_sequence``."""
        with self._lock:
            self._at_shard_end = self._largest_permitted if last_sequence is None else last_sequence
            self._largest_permitted = SHARD_END

    def worker_holds(self, lease_key: str) -> bool:
        """Whether this checkpointer's worker holds the lease ``lease_key`` now (the sink asks
        it about the other leases of a batch it re-forms)."""
        return self._holder.get_if_held(lease_key) is not None

    @property
    def pending_checkpoint(self) -> tuple[ExtendedSequenceNumber, bytes | None] | None:
        """The pending checkpoint and its application state in the held lease (as the last
        ``prepare_checkpoint`` of any tenure left them), or None. It writes nothing: it lets a
        processor that starts on a lease re-form exactly the range (checkpoint, pending] it was
        writing. Raises ``CheckpointError`` (``ShutdownException``) if the lease is no longer
        held (one expired locally ends its tenure then, as a refused write does)."""
        lease = self._held_or_raise()
        if lease.pending_checkpoint is None:
            return None
        return lease.pending_checkpoint, lease.pending_checkpoint_state

    # --- the kclpy API ---------------------------------------------------------------------------

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        """Record progress at the given position, or at the last record delivered if None.

        As with kclpy's daemon, ``sub_sequence_number`` is ignored when ``sequence_number`` is None.
        """
        target = self._target(sequence_number, sub_sequence_number)
        self._run(lambda: self._try_checkpoint(target))
        self._checkpointed(target)

    def checkpoint_keeping_pending(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        """``checkpoint``, but a pending checkpoint stored beyond the new position stays (with its
        state): pipelined writers commit one batch while later ones are still being written."""
        target = self._target(sequence_number, sub_sequence_number)
        self._run(lambda: self._try_checkpoint(target, keep_later_pending=True))
        self._checkpointed(target)

    async def acheckpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        """``checkpoint`` for ``async def`` processors: the table write runs in a thread, so
        the event loop (every other shard's consumer) does not wait for it."""
        await asyncio.to_thread(self.checkpoint, sequence_number, sub_sequence_number)

    def prepare_checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int | None = None,
        application_state: bytes | None = None,
    ) -> PreparedCheckpoint:
        """Write a pending checkpoint (and optional application state, bytes); commit it later
        with the returned object's ``checkpoint()``. Validated like ``checkpoint``."""
        _check_state(application_state)
        target = self._target(sequence_number, sub_sequence_number)
        held = self._held_or_raise()
        # Nothing to prepare at the checkpoint itself, unless another pending checkpoint (or
        # state) is stored: it is replaced, as the KCL's prepareCheckpoint writes the pending one.
        stored = held.pending_checkpoint in (None, target) and held.pending_checkpoint_state is None
        if target == held.checkpoint and application_state is None and stored:
            return PreparedCheckpoint(None, target)
        self._run(lambda: self._try_prepare(target, application_state))
        return PreparedCheckpoint(self, target)

    # --- inside ----------------------------------------------------------------------------------

    def _held_or_raise(self) -> Lease:
        held = self._holder.held_to_write(self.lease_key, self._token)
        if held is None:
            raise CheckpointError(
                SHUTDOWN,
                f"can't update checkpoint: this worker doesn't hold the lease for {self.lease_key}",
            )
        return held.lease

    def _target(
        self, sequence_number: str | None, sub_sequence_number: int | None
    ) -> ExtendedSequenceNumber:
        """The position to record (SHARD_END at a closed shard's last record). Raises
        ShutdownException if the lease is already lost, IllegalArgumentException if the value is
        malformed or beyond the last record delivered. The lower bound, the last checkpoint, is
        checked by the write itself, under the lease's lock (``_checked``)."""
        self._held_or_raise()
        with self._lock:
            largest, at_end = self._largest_permitted, self._at_shard_end
        if sequence_number == SHARD_END.sequence_number and at_end is not None:
            return SHARD_END  # the KCL takes the sentinel's own name at a closed shard's end
        if sequence_number is None:
            target = largest
        else:
            target = _parse_position(sequence_number, sub_sequence_number)
        # At a closed shard's end the largest position is SHARD_END; its last record delivered
        # (the checkpoint, when this tenure delivered none) still bounds a sequence number.
        bound = at_end if at_end is not None and not target.is_sentinel else largest
        if not target <= bound:
            raise _illegal(
                f"could not checkpoint at {target}: it is beyond the largest position delivered "
                f"{bound}"
            )
        with self._lock:
            known = sequence_number is None or self._delivered.names_a_record(target)
        if not known:
            raise _illegal(
                f"could not checkpoint at {target}: no record this lease delivered since the "
                "last checkpoint has that sequence number (one of another shard?)"
            )
        if at_end is not None and target == at_end:
            return SHARD_END
        return target

    def _checked(self, lease: Lease, target: ExtendedSequenceNumber) -> None:
        """Raise IllegalArgumentException unless ``lease.checkpoint <= target <= largest``.

        Called inside the holder's write, with ``lease`` as stored and the lease's lock held: two
        concurrent checkpoints are checked and written one after the other, so the later one can
        never write a smaller value over a larger one (nor move a parent off SHARD_END)."""
        with self._lock:
            largest = self._largest_permitted
        if not lease.checkpoint <= target <= largest:
            raise _illegal(
                f"could not checkpoint at {target}: it is outside the range between the last "
                f"checkpoint {lease.checkpoint} and the largest position delivered {largest}"
            )

    def _commit(self, target: ExtendedSequenceNumber) -> None:
        """A prepared checkpoint committed: SHARD_END when it is a closed shard's last record
        (as ``checkpoint()`` there; stored as that record, the shard-end step never finished)."""
        self._held_or_raise()
        with self._lock:
            if self._at_shard_end is not None and target == self._at_shard_end:
                target = SHARD_END
        self._run(lambda: self._try_checkpoint(target))
        self._checkpointed(target)

    def _checkpointed(self, target: ExtendedSequenceNumber) -> None:
        with self._lock:
            self.shard_end_written = self.shard_end_written or target.is_shard_end
            self._delivered.checkpointed(target)
            if not target.is_sentinel and (self._written is None or self._written < target):
                self._written = target

    def _run(self, attempt: Callable[[], None]) -> None:
        """The retry loop outside; maps what is left to kclpy's CheckpointError values."""
        started = self._monotonic()
        try:
            call_with_retry(
                attempt,
                what=f"checkpoint of lease {self.lease_key}",
                policy=self._retry_policy,
                sleep=self._sleep,
            )
        except CheckpointError:
            raise
        except ThrottledError as exc:
            raise CheckpointError(THROTTLING, str(exc)) from exc
        except (InvalidStateError, ResourceNotFoundError) as exc:
            raise CheckpointError(INVALID_STATE, str(exc)) from exc
        except KclpySparkError as exc:
            raise CheckpointError(DEPENDENCY, str(exc)) from exc
        if self._on_write is not None:
            self._on_write(self._monotonic() - started)

    def _write(self, write: Callable[[Lease], Lease | None]) -> None:
        """One conditional write through the holder; a refusal or a lost write is a lost lease.

        Only throttling may be retried: it means the write was refused. Any other dependency error
        leaves the outcome unknown, so it is turned into a non-retriable CheckpointError here.
        """
        try:
            result = self._holder.update(self.lease_key, self._token, write)
        except ThrottledError:
            raise
        except DependencyError as exc:
            raise CheckpointError(DEPENDENCY, str(exc)) from exc
        if not result.won:
            reason = result.loss.value if result.loss is not None else "unknown"
            raise CheckpointError(
                SHUTDOWN,
                f"can't update checkpoint: this worker doesn't hold the lease for "
                f"{self.lease_key} ({reason})",
            )

    def _try_checkpoint(
        self, target: ExtendedSequenceNumber, *, keep_later_pending: bool = False
    ) -> None:
        def write(lease: Lease) -> Lease | None:
            if covered(lease.checkpoint, target):
                return lease
            self._checked(lease, target)
            pending = lease.pending_checkpoint
            if not (keep_later_pending and pending is not None and target < pending):
                pending = None
            if lease.checkpoint == target and lease.pending_checkpoint == pending:
                return lease  # already stored: the KCL skips a checkpoint it already made
            return self._holder.table.update_checkpoint(lease, target, pending)

        self._write(write)

    def _try_prepare(self, target: ExtendedSequenceNumber, state: bytes | None) -> None:
        def write(lease: Lease) -> Lease | None:
            if covered(lease.checkpoint, target):
                return lease
            self._checked(lease, target)
            pending = replace(lease, pending_checkpoint=target, pending_checkpoint_state=state)
            return self._holder.table.update_lease(pending)

        self._write(write)


class LeaseLostCheckpointer:
    """The checkpointer given once the lease is lost: every call raises ShutdownException."""

    _DETAIL = "checkpointing is not allowed when the lease is lost"

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        raise CheckpointError(SHUTDOWN, self._DETAIL)

    def prepare_checkpoint(
        self,
        sequence_number: str | None = None,
        sub_sequence_number: int | None = None,
        application_state: bytes | None = None,
    ) -> PreparedCheckpoint:
        raise CheckpointError(SHUTDOWN, self._DETAIL)
