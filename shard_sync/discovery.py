"""Shard discovery: the one adapter over Kinesis ListShards / DescribeStreamSummary.

Single attempts inside, retries outside (checkpoint.base.retry): LimitExceeded and ResourceInUse are
retriable; a missing stream is a clear ResourceNotFoundError; a stream that is CREATING is waited
for. An UPDATING stream (a reshard or UpdateShardCount under way, which on AWS can last minutes) is
listed at once, as the KCL lists "Active or Updating" streams: a listing that races the reshard
shows children of still-open parents, and the sync rule rejects it (InconsistentShardGraphError)
rather than trust it; the leader's next round lists again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from checkpoint.base.errors import (
    DependencyError,
    KclpySparkError,
    MalformedAnswerError,
    ResourceNotFoundError,
    map_aws_error,
)
from checkpoint.base.retry import RetryPolicy, call_with_retry
from checkpoint.sequence import InitialPosition, Position
from shard_sync.shards import Shard

log = logging.getLogger(__name__)

# The KCL backs ListShards off 1.5 s and tries up to 50 times; a shorter, jittered policy of the
# same total patience (about a minute) keeps a worker responsive to SIGTERM between attempts.
LIST_SHARDS_POLICY = RetryPolicy(base_delay=0.5, max_delay=5.0, max_attempts=15, max_elapsed=60.0)


class StreamNotReadyError(DependencyError):
    """The stream is CREATING; a later attempt will find it ACTIVE."""


# A listing longer than this many pages is taken as a service fault (a NextToken that never ends),
# not listed on for ever: a page holds up to 1,000 shards, and a stream holds far fewer, closed
# ones within the retention period included.
MAX_LIST_PAGES = 500

# Stream states in which ListShards and GetRecords work (the KCL's "Active or Updating").
USABLE_STATUSES = frozenset({"ACTIVE", "UPDATING"})


class ShardLister(Protocol):
    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        """Every shard of the stream (all pages), optionally with a ListShards ShardFilter."""
        ...


def shard_filter_for(position: InitialPosition) -> dict[str, Any]:
    """The ShardFilter the KCL uses for an empty lease table at ``position``."""
    if position.position is Position.LATEST:
        return {"Type": "AT_LATEST"}
    if position.position is Position.TRIM_HORIZON:
        return {"Type": "AT_TRIM_HORIZON"}
    return {"Type": "AT_TIMESTAMP", "Timestamp": position.timestamp}


class KinesisShardLister:
    """ListShards over a boto3 Kinesis client, by stream name or ARN (the ARN wins if both)."""

    def __init__(
        self,
        client: Any,
        *,
        stream_name: str | None = None,
        stream_arn: str | None = None,
        policy: RetryPolicy = LIST_SHARDS_POLICY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not stream_name and not stream_arn:
            raise ValueError("a stream name or ARN is required")
        self._client = client
        self._stream: dict[str, str] = (
            {"StreamARN": stream_arn} if stream_arn else {"StreamName": str(stream_name)}
        )
        self._label = stream_arn or str(stream_name)
        self._policy = policy
        self._sleep = sleep

    @property
    def stream(self) -> str:
        return self._label

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = getattr(self._client, operation)(**kwargs)
        except KclpySparkError:
            raise
        except Exception as exc:  # botocore raises many unrelated classes; map them in one place
            mapped = map_aws_error(exc, f"{operation} on stream {self._label!r}")
            if isinstance(mapped, ResourceNotFoundError):
                raise ResourceNotFoundError(
                    f"Kinesis stream {self._label!r} does not exist (or is not visible with these "
                    f"credentials and region)"
                ) from exc
            raise mapped from exc
        return result

    def stream_status(self) -> str:
        return self.describe()[0]

    def describe(self) -> tuple[str, float | None]:
        """(status, creation time in epoch seconds) from DescribeStreamSummary."""
        answer = self._call("describe_stream_summary", **self._stream)
        summary = answer.get("StreamDescriptionSummary")
        if not isinstance(summary, dict) or not isinstance(summary.get("StreamStatus"), str):
            raise MalformedAnswerError(
                f"DescribeStreamSummary on stream {self._label!r}: an answer without the stream's "
                "status"
            )
        created = summary.get("StreamCreationTimestamp")
        when = created.timestamp() if isinstance(created, datetime) else None
        return summary["StreamStatus"], when

    def _wait_until_active_once(self) -> None:
        status = self.stream_status()
        if status == "DELETING":
            raise ResourceNotFoundError(f"Kinesis stream {self._label!r} is being deleted")
        if status not in USABLE_STATUSES:
            raise StreamNotReadyError(f"Kinesis stream {self._label!r} is {status}")

    def wait_until_active(self) -> None:
        """Return once the stream is ACTIVE or UPDATING (usable: only CREATING is waited out).

        Raises ResourceNotFoundError for a missing or DELETING stream, StreamNotReadyError if it
        is still CREATING when the retry policy runs out."""
        call_with_retry(
            self._wait_until_active_once,
            what=f"waiting for stream {self._label!r}",
            policy=self._policy,
            sleep=self._sleep,
        )

    def _list_once(self, shard_filter: dict[str, Any] | None) -> list[Shard]:
        shards: dict[str, Shard] = {}
        kwargs: dict[str, Any] = dict(self._stream)
        if shard_filter is not None:
            kwargs["ShardFilter"] = shard_filter
        tokens: set[str] = set()
        for _ in range(MAX_LIST_PAGES):
            page = self._call("list_shards", **kwargs)
            entries = page.get("Shards")
            if not isinstance(entries, list):  # a stream always has shards: {} is no listing
                raise self._malformed("an answer without a Shards list")
            for entry in entries:
                shard = self._shard_of(entry)
                if shards.setdefault(shard.shard_id, shard) != shard:
                    raise self._malformed(f"shard {shard.shard_id} listed twice, differently")
            token = page.get("NextToken")
            if not token:
                return list(shards.values())
            if token in tokens:
                raise self._malformed("a NextToken given twice (the listing would never end)")
            tokens.add(token)
            # With NextToken, ListShards forbids the stream name and the filter.
            kwargs = {"NextToken": token}
        raise self._malformed(f"more than {MAX_LIST_PAGES} pages")

    def _shard_of(self, entry: Any) -> Shard:
        try:
            return Shard.from_api(entry)
        except ValueError as exc:  # from_api names the shard and what is wrong
            raise self._malformed(f"a shard it cannot read ({exc})") from None

    def _malformed(self, what: str) -> MalformedAnswerError:
        return MalformedAnswerError(f"ListShards on stream {self._label!r}: {what}")

    def shard_gone(self, shard_id: str) -> bool:
        """Whether Kinesis says ``shard_id`` is not found (one GetShardIterator at TRIM_HORIZON;
        the KCL deletes a garbage lease only on that answer). Any other error is raised."""
        try:
            self._client.get_shard_iterator(
                **self._stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
            )
        except Exception as exc:
            mapped = map_aws_error(exc, f"GetShardIterator on shard {shard_id} of {self._label!r}")
            if isinstance(mapped, ResourceNotFoundError):
                return True
            raise mapped from exc
        return False

    def list_shards(self, shard_filter: dict[str, Any] | None = None) -> list[Shard]:
        self.wait_until_active()
        return call_with_retry(
            lambda: self._list_once(shard_filter),
            what=f"ListShards on stream {self._label!r}",
            policy=self._policy,
            sleep=self._sleep,
        )
