"""Where a shard's reading starts: GetShardIterator arguments from a checkpoint (pure)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition, Sentinel

# How much earlier than a LATEST read began a read started again from there begins (the host's
# clock against the service's arrival times): duplicates of records just before are possible, a
# gap is not.
LATEST_RESTART_MARGIN = 5.0


def iterator_args(
    checkpoint: ExtendedSequenceNumber, initial_position: InitialPosition
) -> dict[str, Any]:
    """GetShardIterator keyword arguments (without the stream and shard) that resume after
    ``checkpoint``.

    A sequence-number checkpoint re-reads its record (AT_SEQUENCE_NUMBER) so the later sub-records
    of a KPL aggregate can be delivered; the caller skips every record and sub-record at or before
    the checkpoint. SHARD_END has no iterator: ValueError.
    """
    sentinel = checkpoint.sentinel
    if sentinel is Sentinel.SHARD_END:
        raise ValueError("a shard checkpointed at SHARD_END has nothing left to read")
    if sentinel is Sentinel.TRIM_HORIZON:
        return {"ShardIteratorType": "TRIM_HORIZON"}
    if sentinel is Sentinel.LATEST:
        return {"ShardIteratorType": "LATEST"}
    if sentinel is Sentinel.AT_TIMESTAMP:
        if initial_position.timestamp is None:  # a Java KCL's lease keeps no time
            raise no_time_of_its_own()
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": initial_position.timestamp}
    # Always AT, as the KCL does: the checkpointed record may be a KPL aggregate whose later
    # sub-records were not processed yet (a checkpoint at (seq, 0) covers only its first one).
    # The fetchers drop every record at or before the checkpoint.
    return {
        "ShardIteratorType": "AT_SEQUENCE_NUMBER",
        "StartingSequenceNumber": checkpoint.sequence_number,
    }


class StartArgs:
    """GetShardIterator arguments for a read's start (``iterator_args``), asked again each time
    an iterator is replaced before the read's first record came (it expired unused, or a
    subscription ended early). LATEST is the one start that moves: the first ask is LATEST, and
    every later one AT_TIMESTAMP from when the first was made (``LATEST_RESTART_MARGIN``
    earlier); a second LATEST skipped what arrived in between. A first ask made more than the
    margin after these arguments were made (their read began: an enhanced fan-out consumer's
    registration took that long) is AT_TIMESTAMP from then too: the lease was pinned there, and
    what arrived meanwhile was read only if the read was started again."""

    def __init__(
        self,
        checkpoint: ExtendedSequenceNumber,
        initial_position: InitialPosition,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._checkpoint = checkpoint
        self._initial = initial_position
        self._wall = wall
        self._began = wall()
        self._latest_since: float | None = None

    def __call__(self) -> dict[str, Any]:
        args = iterator_args(self._checkpoint, self._initial)
        if args["ShardIteratorType"] != "LATEST":
            return args
        if self._latest_since is None:
            self._latest_since, late = first_latest_ask(self._began, self._wall())
            if not late:
                return args
        since = datetime.fromtimestamp(self._latest_since, tz=UTC)
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": since}


def first_latest_ask(began: float, now: float) -> tuple[float, bool]:
    """A read that began at ``began`` (wall clock) asks for its first LATEST iterator ``now``:
    the time every later ask goes AT_TIMESTAMP from (``LATEST_RESTART_MARGIN`` before this
    ask), and False; or, asked later than the margin after the read began, the margin before
    its beginning, and True: this ask goes AT_TIMESTAMP from there too."""
    late = now - began > LATEST_RESTART_MARGIN
    return (began if late else now) - LATEST_RESTART_MARGIN, late


def no_time_of_its_own() -> ConfigError:
    """An AT_TIMESTAMP lease (a Java KCL's keeps no time) under no AT_TIMESTAMP position."""
    return ConfigError(
        "the lease is checkpointed at AT_TIMESTAMP without a time of its own, and no "
        "AT_TIMESTAMP initial position (with its time) is configured: set one, or "
        "`kclpy-spark reset` the lease"
    )
