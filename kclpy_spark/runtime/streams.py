"""The streams one application consumes: one (the usual case) or several (multi-stream mode).

In multi-stream mode every lease key carries its stream in the KCL's multi-stream format,
``account:streamName:creationEpoch:shardId``, so several streams share one lease table, and a
stream deleted and re-created under the same name (a new creation epoch) never inherits the old
one's checkpoints.
"""

from __future__ import annotations

import logging
from typing import Any

from checkpoint.base.errors import map_aws_error
from checkpoint.lease import Lease
from checkpoint.port import LeaseTable
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import StreamSpec
from shard_sync.cleanup import LeaderMaintenance
from shard_sync.discovery import KinesisShardLister
from shard_sync.syncer import ShardSyncer, lease_in_stream

log = logging.getLogger(__name__)


def stream_identity(kinesis_sync: Any, spec: StreamSpec) -> str:
    """``account:streamName:creationEpoch``, the KCL's multi-stream identifier, from
    DescribeStreamSummary."""
    try:
        summary = kinesis_sync.describe_stream_summary(**spec.request)["StreamDescriptionSummary"]
    except Exception as exc:
        raise map_aws_error(exc, f"DescribeStreamSummary on stream {spec.label!r}") from exc
    arn = str(summary["StreamARN"])
    account = arn.split(":")[4]
    name = str(summary["StreamName"])
    epoch = int(summary["StreamCreationTimestamp"].timestamp())
    return f"{account}:{name}:{epoch}"


class StreamContext:
    """What a worker keeps per stream: how to name it in requests, its lease-key prefix, and the
    shard sync that creates its leases."""

    def __init__(
        self,
        spec: StreamSpec,
        *,
        stream_key: str | None,
        initial_position: InitialPosition,
        kinesis_sync: Any,
        table: LeaseTable,
        ignore_unexpected_child_shards: bool,
        counters: Any,
    ) -> None:
        self.spec = spec
        self.stream_key = stream_key
        self.initial_position = initial_position
        self.lister = KinesisShardLister(
            kinesis_sync, stream_name=spec.stream_name, stream_arn=spec.stream_arn
        )
        syncer = ShardSyncer(
            self.lister,
            table,
            initial_position,
            ignore_unexpected_child_shards=ignore_unexpected_child_shards,
            counters=counters,
            stream_key=stream_key,
        )
        self.maintenance = LeaderMaintenance(syncer, table, lister=self.lister)

    @property
    def label(self) -> str:
        return self.spec.label

    def owns(self, lease: Lease) -> bool:
        return lease_in_stream(lease.lease_key, self.stream_key)
