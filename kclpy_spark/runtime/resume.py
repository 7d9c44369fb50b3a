"""Where a shard consumer's next read starts: pure bookkeeping over the lease's checkpoint.

A read resumes after the last record delivered; before the first delivery, at the lease's
checkpoint: a sequence number, TRIM_HORIZON, AT_TIMESTAMP (the lease's own start time when it has
one, else the configured one) or LATEST. LATEST is the one position that moves: a second read at
LATEST skips what was written between the two. So the first LATEST read's start is pinned
(``begin`` returns the time to store in the lease beside its LATEST checkpoint,
``LATEST_RESTART_MARGIN`` earlier for the host's clock against the service's) and every later
read starts there, AT_TIMESTAMP: duplicates of records just before the start are possible, a gap
is not.
"""

from __future__ import annotations

import logging

from checkpoint.sequence import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN

log = logging.getLogger(__name__)


def start_position(lease_start: float | None, configured: InitialPosition) -> InitialPosition:
    """Where a lease checkpointed at AT_TIMESTAMP starts: its own start time (a reset, its
    creation or its first LATEST read stored it in the lease), else the configured position."""
    return configured if lease_start is None else InitialPosition.at_timestamp(lease_start)


class ReadStart:
    def __init__(
        self,
        shard_id: str,
        checkpoint: ExtendedSequenceNumber,
        lease_start: float | None,
        configured: InitialPosition,
    ) -> None:
        self._shard_id = shard_id
        self.checkpoint = checkpoint  # where the next read resumes (after it, for a record)
        self._configured = configured
        self.position = start_position(lease_start, configured)
        if checkpoint == LATEST and lease_start is not None:  # pinned by an earlier first read
            self.checkpoint = AT_TIMESTAMP
        self._latest_since: float | None = None  # wall time the first LATEST read began
        self._initial = self.checkpoint  # where the tenure began (rewound to it)

    def begin(self, wall_now: float) -> float | None:
        """A read starts now. Returns the wall time to pin in the lease (the first read at
        LATEST), else None; a later read that would be at LATEST goes AT_TIMESTAMP instead."""
        if self.checkpoint != LATEST:
            return None
        if self._latest_since is None:
            self._latest_since = wall_now - LATEST_RESTART_MARGIN
            return self._latest_since
        self.checkpoint = AT_TIMESTAMP
        self.position = InitialPosition.at_timestamp(self._latest_since)
        log.info(
            "shard %s: reading again from where the first LATEST read began (%s)",
            self._shard_id,
            self.position.timestamp,
        )
        return None

    def source_made(self, wall_now: float) -> None:
        """The first LATEST read's source is made at ``wall_now``: later than the margin after
        that read began (its pin's write was retried), it reads AT_TIMESTAMP from the pin, as a
        read started again does; its first ask at LATEST skipped what arrived since the pin,
        which the lease says the read covers."""
        since = self._latest_since
        if self.checkpoint != LATEST or since is None:
            return
        if wall_now - (since + LATEST_RESTART_MARGIN) <= LATEST_RESTART_MARGIN:
            return
        self.checkpoint = AT_TIMESTAMP
        self.position = InitialPosition.at_timestamp(since)
        log.info("shard %s: its LATEST read's reader came %.0f s after the read began; reading "
                 "from the pin (%s)", self._shard_id, wall_now - since - LATEST_RESTART_MARGIN,
                 self.position.timestamp)  # fmt: skip

    def arrived(self, first_millis: int) -> float | None:
        """The first records of a pinned LATEST read arrived (Kinesis's clock) at
        ``first_millis``: if that is before the pin (this host's clock runs more than the margin
        ahead), the earlier time to pin instead, else None. A pin after them would skip them
        on a restart before the first checkpoint."""
        if self._latest_since is None or self.checkpoint != LATEST or first_millis <= 0:
            return None
        arrived = first_millis / 1000.0
        if arrived >= self._latest_since:
            return None
        log.warning(
            "shard %s: its first records arrived %.1f s before where this host's clock put the "
            "start of its LATEST read (the clock runs ahead of Kinesis's by more than %.0f s?); "
            "pinned at their arrival instead",
            self._shard_id,
            self._latest_since - arrived,
            LATEST_RESTART_MARGIN,
        )
        self._latest_since = arrived
        return arrived

    def delivered(self, last: ExtendedSequenceNumber) -> None:
        self.checkpoint = last

    def rewound(self, checkpoint: ExtendedSequenceNumber) -> None:
        """The processor lost what it was given after ``checkpoint`` (the lease's): the next read
        starts after it again, or, at a position (nothing checkpointed yet), where this tenure's
        first read began (a LATEST one at its pin)."""
        self.checkpoint = self._initial if checkpoint.is_sentinel else checkpoint

    def restarted(self, target: ExtendedSequenceNumber) -> None:
        """The checkpoint was reset (the aged-checkpoint policy); the lease's own start time
        went with it."""
        self.checkpoint = self._initial = target
        self.position = self._configured
        self._latest_since = None
