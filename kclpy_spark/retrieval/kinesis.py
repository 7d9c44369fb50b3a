"""The configured record source for a lease: polling or enhanced fan-out over one stream, with
KPL deaggregation when it is on (a ``SourceFactory``)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checkpoint.lease import HashKeyRange
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.retrieval.fanout import FanOutFetcher
from kclpy_spark.retrieval.kpl import Deaggregator
from kclpy_spark.retrieval.polling import PollingFetcher
from kclpy_spark.retrieval.source import FetchedBatch, FetchProgress, RecordSource


@dataclass(frozen=True)
class SourceSettings:
    """What the configured sources need (a slice of WorkerConfig)."""

    retrieval_mode: str = "polling"
    max_records: int = 10_000
    idle_time_between_reads: float = 1.0
    max_read_bytes_per_second: int = 2 * 1024 * 1024
    kpl_deaggregation: bool = True
    consumer_name: str = "kclpy-spark"


class KinesisSources:
    """The configured RecordSource (polling or fan-out) over one stream, per lease."""

    def __init__(
        self,
        client: Any,
        stream: dict[str, str],
        settings: SourceSettings,
        rng: random.Random | None = None,
        on_out_of_range: Callable[[str, int], None] | None = None,
    ) -> None:
        self._client = client
        self._stream = stream
        self._settings = settings
        self._rng = rng or random.Random()
        # Told (shard id, count) of KPL sub-records left out for lying outside the shard's range.
        self._on_out_of_range = on_out_of_range

    def __call__(
        self,
        shard_id: str,
        start: ExtendedSequenceNumber,
        position: InitialPosition,
        hash_range: HashKeyRange | None,
        queue: asyncio.Queue[FetchedBatch],
        progress: FetchProgress,
    ) -> RecordSource:
        s = self._settings
        deaggregator = None
        if s.kpl_deaggregation:
            report = self._on_out_of_range
            deaggregator = Deaggregator(
                hash_range,
                shard_id=shard_id,
                on_out_of_range=None if report is None else lambda n: report(shard_id, n),
            )
        if s.retrieval_mode == "fanout":
            return FanOutFetcher(
                self._client,
                self._stream,
                shard_id,
                start,
                position,
                queue,
                consumer_name=s.consumer_name,
                rng=self._rng,
                deaggregator=deaggregator,
                progress=progress,
            )
        return PollingFetcher(
            self._client,
            self._stream,
            shard_id,
            start,
            position,
            queue,
            max_records=s.max_records,
            idle_time=s.idle_time_between_reads,
            read_rate=s.max_read_bytes_per_second,
            rng=self._rng,
            deaggregator=deaggregator,
            progress=progress,
        )
