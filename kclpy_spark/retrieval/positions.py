"""Where a shard's reading starts: GetShardIterator arguments from a checkpoint (pure)."""

from __future__ import annotations

from typing import Any

from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition, Sentinel


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
        if initial_position.timestamp is None:
            raise ValueError(
                "the lease is checkpointed at AT_TIMESTAMP but no AT_TIMESTAMP initial position "
                "(with its time) is configured"
            )
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": initial_position.timestamp}
    # Always AT, as the KCL does: the checkpointed record may be a KPL aggregate whose later
    # sub-records were not processed yet (a checkpoint at (seq, 0) covers only its first one).
    # The fetchers drop every record at or before the checkpoint.
    return {
        "ShardIteratorType": "AT_SEQUENCE_NUMBER",
        "StartingSequenceNumber": checkpoint.sequence_number,
    }
