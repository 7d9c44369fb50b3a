"""End-to-end acknowledgments for one lease, after OpenSearch Data Prepper's acknowledgment sets.

The worker registers each batch it delivers (its first and last position, in delivery order) and
hands the sinks one ``AckHandle`` each. The checkpoint may move only over the contiguous prefix of
batches that every sink acknowledged: a batch acknowledged early waits for the ones before it.

A negative acknowledgment, or a batch not acknowledged within ``timeout`` seconds (on the injected
monotonic clock), fails the batch: the checkpointable position stops before it, and everything
from the first unacknowledged batch on must be delivered again (``redelivery_from``). The worker
then calls ``rewind`` and reads again from that position; handles of the discarded batches go
stale, and their late answers are ignored (``ack()`` returns False) rather than counted.

Each handle answers once: a second ``ack``/``nack`` on the same handle is a bug in a sink and raises
``AckError``, so a sink that acknowledges twice can never stand in for one that has not answered.

Pure and thread-safe (sinks answer from their own threads); no I/O.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from checkpoint.base.clock import Clock
from checkpoint.base.errors import KclpySparkError
from checkpoint.sequence import ExtendedSequenceNumber


class AckError(KclpySparkError):
    """An acknowledgment handle was answered twice."""


@dataclass(frozen=True)
class AckRange:
    """The positions of one delivered batch, both ends included."""

    first: ExtendedSequenceNumber
    last: ExtendedSequenceNumber

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise ValueError(f"bad range: last {self.last} is before first {self.first}")


class _State(enum.Enum):
    PENDING = "PENDING"  # some sink has not answered
    ACKED = "ACKED"  # every sink acknowledged
    FAILED = "FAILED"  # a sink said no, or the time ran out: to be delivered again
    DISCARDED = "DISCARDED"  # dropped by rewind; late answers are ignored


@dataclass(eq=False)
class _Batch:
    range: AckRange
    waiting: int  # sinks that have not acknowledged yet
    deadline: float  # monotonic seconds
    state: _State = _State.PENDING


class AckHandle:
    """One sink's acknowledgment of one batch. Answer exactly once, from any thread."""

    __slots__ = ("_answered", "_batch", "_tracker", "sink")

    def __init__(self, tracker: AckTracker, batch: _Batch, sink: str) -> None:
        self._tracker = tracker
        self._batch = batch
        self._answered = False
        self.sink = sink

    def __repr__(self) -> str:
        rng = self._batch.range
        return f"AckHandle(sink={self.sink!r}, range={rng.first}..{rng.last})"

    @property
    def range(self) -> AckRange:
        return self._batch.range

    def ack(self) -> bool:
        """The sink wrote the batch. True if counted; False if the batch was already given up
        (failed, expired, or discarded by a rewind). Raises AckError if already answered."""
        return self._tracker._answer(self, positive=True)

    def nack(self) -> bool:
        """The sink could not write the batch: it will be delivered again. True if this failed the
        batch; False if it was already given up. Raises AckError if already answered."""
        return self._tracker._answer(self, positive=False)


class AckTracker:
    """Acknowledgment state of one lease. ``timeout``: seconds a batch may wait for its acks."""

    def __init__(self, clock: Clock, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self._clock = clock
        self._timeout = timeout
        self._lock = threading.Lock()
        # Batches not yet checkpointable, in delivery order; the acknowledged prefix is popped.
        self._batches: deque[_Batch] = deque()
        self._checkpointable: ExtendedSequenceNumber | None = None
        self._last_delivered: ExtendedSequenceNumber | None = None
        self._expired: list[AckRange] = []  # expired but not yet returned by poll_expired

    # --- delivery --------------------------------------------------------------------------------

    def deliver(self, first: ExtendedSequenceNumber, last: ExtendedSequenceNumber) -> AckHandle:
        """Register a batch delivered to one sink; returns its handle."""
        return self.deliver_to(first, last, ("default",))[0]

    def deliver_to(
        self,
        first: ExtendedSequenceNumber,
        last: ExtendedSequenceNumber,
        sinks: int | Sequence[str],
    ) -> tuple[AckHandle, ...]:
        """Register a batch routed to several sinks (a count, or their names); one handle each,
        in the given order. The batch is acknowledged when every handle acknowledged it.

        Batches must come in delivery order: ``first`` after the last position delivered (or
        after the rewind position). Raises ValueError otherwise.
        """
        names = [str(i) for i in range(sinks)] if isinstance(sinks, int) else list(sinks)
        if not names:
            raise ValueError("a batch needs at least one sink")
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be distinct: {names}")
        rng = AckRange(first, last)
        with self._lock:
            now = self._clock.monotonic()
            self._expire_locked(now)
            if self._last_delivered is not None and not self._last_delivered < first:
                raise ValueError(
                    f"batch {first}..{last} is not after the last delivered position "
                    f"{self._last_delivered}"
                )
            batch = _Batch(rng, waiting=len(names), deadline=now + self._timeout)
            self._batches.append(batch)
            self._last_delivered = last
        return tuple(AckHandle(self, batch, name) for name in names)

    # --- answers ---------------------------------------------------------------------------------

    def _answer(self, handle: AckHandle, *, positive: bool) -> bool:
        with self._lock:
            if handle._answered:
                raise AckError(
                    f"sink {handle.sink!r} already answered for {handle.range.first}.."
                    f"{handle.range.last}"
                )
            handle._answered = True
            self._expire_locked(self._clock.monotonic())
            batch = handle._batch
            if batch.state is not _State.PENDING:
                return False
            if not positive:
                batch.state = _State.FAILED
                return True
            batch.waiting -= 1
            if batch.waiting == 0:
                batch.state = _State.ACKED
                self._advance_locked()
            return True

    def _advance_locked(self) -> None:
        while self._batches and self._batches[0].state is _State.ACKED:
            self._checkpointable = self._batches.popleft().range.last

    def _expire_locked(self, now: float) -> None:
        for batch in self._batches:
            if batch.state is _State.PENDING and now > batch.deadline:
                batch.state = _State.FAILED
                self._expired.append(batch.range)

    # --- queries ---------------------------------------------------------------------------------

    def checkpointable(self) -> ExtendedSequenceNumber | None:
        """The highest position such that it and everything delivered before it was acknowledged
        by every sink; None if no batch has been completely acknowledged yet."""
        with self._lock:
            self._expire_locked(self._clock.monotonic())
            return self._checkpointable

    def poll_expired(self) -> list[AckRange]:
        """Batches whose time ran out since the last call (now failed, like a negative ack)."""
        with self._lock:
            self._expire_locked(self._clock.monotonic())
            expired, self._expired = self._expired, []
            return expired

    def redelivery_from(self) -> ExtendedSequenceNumber | None:
        """Where to read again from (the first unacknowledged batch's first position) if any
        batch failed or expired; None while nothing must be delivered again."""
        with self._lock:
            self._expire_locked(self._clock.monotonic())
            if any(b.state is _State.FAILED for b in self._batches):
                return self._batches[0].range.first
            return None

    def rewind(self) -> ExtendedSequenceNumber | None:
        """Give up every batch not yet checkpointable (their handles go stale) and return the
        position to deliver again from, or None if nothing was outstanding. Deliveries may then
        start again at that position."""
        with self._lock:
            if not self._batches:
                return None
            start = self._batches[0].range.first
            for batch in self._batches:
                batch.state = _State.DISCARDED
            self._batches.clear()
            self._expired.clear()
            self._last_delivered = self._checkpointable
            return start

    def outstanding(self) -> list[AckRange]:
        """Batches delivered and not yet part of the checkpointable prefix, in delivery order."""
        with self._lock:
            return [b.range for b in self._batches]
