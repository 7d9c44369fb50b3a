"""Where a shard's reading starts: GetShardIterator arguments from a checkpoint (pure)."""

from __future__ import annotations

from typing import Any

from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition, Sentinel


def iterator_args(
    checkpoint: ExtendedSequenceNumber, initial_position: InitialPosition
) -> dict[str, Any]:
    """GetShardIterator keyword arguments (without the stream and shard) that resume after
    ``checkpoint``.

    A checkpoint inside a KPL aggregate (sub-sequence > 0) re-reads that aggregate
    (AT_SEQUENCE_NUMBER) so its later sub-records can be delivered; the caller skips the sub-records
    at or before the checkpoint. SHARD_END has no iterator: ValueError.
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
    if checkpoint.sub_sequence_number > 0:
        return {
            "ShardIteratorType": "AT_SEQUENCE_NUMBER",
            "StartingSequenceNumber": checkpoint.sequence_number,
        }
    return {
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "StartingSequenceNumber": checkpoint.sequence_number,
    }
