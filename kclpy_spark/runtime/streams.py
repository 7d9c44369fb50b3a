"""The streams one application consumes: one (the usual case) or several (multi-stream mode).

In multi-stream mode every lease key carries its stream in the KCL's multi-stream format,
``account:streamName:creationEpoch:shardId``, so several streams share one lease table, and a
stream deleted and re-created under the same name (a new creation epoch) never inherits the old
one's checkpoints.

``StreamSet`` keeps a worker's ``StreamContext`` per configured stream in line with the
configuration (streams added or removed while running are picked up) and watches that each one
still exists: ``gone_since`` tells the worker's health how long a stream has been missing. In
single-stream mode it also remembers when the stream was created (a coordination record): a
stream deleted and re-created under the same name is refused at start-up, and seen as gone while
running, instead of having the old checkpoints applied to its new records.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from checkpoint import coordination
from checkpoint.base.clock import Clock
from checkpoint.base.errors import (
    ConfigError,
    KclpySparkError,
    ResourceNotFoundError,
    error_code,
    map_aws_error,
)
from checkpoint.base.threads import RetiringThreadPool
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import Lease, in_stream, lease_key_of
from checkpoint.port import LeaseTable
from checkpoint.sequence import InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.retrieval.kinesis import KinesisSources, SourceSettings
from kclpy_spark.retrieval.source import KinesisShardProbe, SourceFactory
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.stream_spec import StreamSpec
from shard_sync.cleanup import LeaderMaintenance
from shard_sync.discovery import KinesisShardLister
from shard_sync.syncer import LeaderOnlyWrites, ShardSyncer

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


# Where a stream's records come from instead of this worker's own Kinesis reads (given the stream
# and its key in multi-stream mode): the Spark sink reading on the executors relays them.
RecordSourcesFor = Callable[[StreamSpec, str | None], SourceFactory]


class StreamRecreatedError(ConfigError):
    """The stream was deleted and re-created since the application's leases were written."""


def recreated_message(label: str, known: float, created: float) -> str:
    def when(t: float) -> str:
        return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="seconds")

    return (
        f"stream {label} was deleted and re-created (now created {when(created)}; this "
        f"application's leases belong to the one created {when(known)}): its checkpoints name "
        "records of the old stream. Start over with `kclpy-spark reset --to TRIM_HORIZON` (or "
        "LATEST), which also records the new stream"
    )


def source_settings(cfg: WorkerConfig) -> SourceSettings:
    return SourceSettings(
        retrieval_mode=cfg.retrieval_mode,
        max_records=cfg.max_records,
        idle_time_between_reads=cfg.idle_time_between_reads,
        max_read_bytes_per_second=cfg.max_read_bytes_per_second,
        kpl_deaggregation=cfg.kpl_deaggregation,
        consumer_name=cfg.consumer_name or cfg.application_name,
    )


class StreamContext:
    """What a worker keeps per stream: how to name it in requests, its lease-key prefix, the shard
    sync that creates its leases, and where its records come from."""

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
        kinesis_async: Any = None,
        settings: SourceSettings | None = None,
        rng: random.Random | None = None,
        on_out_of_range: Callable[[str, int], None] | None = None,
        record_sources: RecordSourcesFor | None = None,
        still_leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.spec = spec
        self.stream_key = stream_key
        self.initial_position = initial_position
        self.lister = KinesisShardLister(
            kinesis_sync, stream_name=spec.stream_name, stream_arn=spec.stream_arn
        )
        writes = LeaderOnlyWrites(table, still_leading)  # a round's writes, while it leads
        syncer = ShardSyncer(
            self.lister,
            writes,
            initial_position,
            ignore_unexpected_child_shards=ignore_unexpected_child_shards,
            counters=counters,
            stream_key=stream_key,
        )
        self.maintenance = LeaderMaintenance(
            syncer, writes, lister=self.lister,
            shard_gone=lambda lease: self.lister.shard_gone(lease.shard_id),
        )  # fmt: skip
        report = on_out_of_range
        self.sources: SourceFactory = (
            record_sources(spec, stream_key)
            if record_sources is not None
            else KinesisSources(
                kinesis_async,
                spec.request,
                settings or SourceSettings(),
                rng,
                # Metrics name the lease (stream-qualified in multi-stream mode), not the shard.
                None
                if report is None
                else lambda shard, n: report(lease_key_of(stream_key, shard), n),
            )
        )
        self.probe = KinesisShardProbe(kinesis_async, spec.request)
        self.gone_since: float | None = None  # monotonic: when it was first found missing
        self.checked_at: float | None = None  # monotonic: when it was last asked whether it exists
        self.created: float | None = None  # creation time of the stream the leases belong to
        self.recreated = False  # several streams: a new stream of its name (reopened afresh)

    @property
    def label(self) -> str:
        return self.spec.label

    def owns(self, lease: Lease) -> bool:
        return in_stream(lease.lease_key, self.stream_key)


# DescribeStreamSummary allows 20 calls a second per account, shared by every worker and
# application: each worker asks each of its streams whether it still exists at most once a
# minute, and often enough that a deleted stream is noticed within a fifth of
# missing_dependency_timeout (50 workers on 4 streams: 3.3 calls a second, not 20).
PRESENCE_CHECK_MAX_INTERVAL = 60.0
PRESENCE_CHECKS_PER_TIMEOUT = 5


def presence_interval(missing_dependency_timeout: float) -> float:
    """Seconds between two checks that a stream still exists."""
    return min(
        PRESENCE_CHECK_MAX_INTERVAL, missing_dependency_timeout / PRESENCE_CHECKS_PER_TIMEOUT
    )


class StreamSet:
    """A worker's stream contexts, kept in line with ``tracker()`` (the configured streams)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        tracker: Callable[[], tuple[StreamSpec, ...]],
        *,
        table: LeaseStore,
        kinesis_sync: Any,
        kinesis_async: Any,
        counters: CoordinationCounters,
        clock: Clock,
        rng: random.Random,
        on_out_of_range: Callable[[str, int], None] | None = None,
        record_sources: RecordSourcesFor | None = None,
        still_leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self._cfg = cfg
        self._still_leading = still_leading  # checked before each write of a shard-sync round
        self._tracker = tracker
        self._table = table
        self._kinesis_sync = kinesis_sync
        self._kinesis_async = kinesis_async
        self._counters = counters
        self._clock = clock
        self._rng = rng
        self._on_out_of_range = on_out_of_range
        self._record_sources = record_sources  # where records come from instead of Kinesis reads
        self.contexts: dict[str, StreamContext] = {}
        # Whether a vanished lease's shard exists is asked under the lease's lock: a bounded
        # wait, on threads of its own (a call that outlives it ends by the client's limits).
        self._probes = RetiringThreadPool(2, "kclpy-spark-shard-probe")
        self.probe_timeout = min(5.0, cfg.failover_time / 4)
        # Configured streams that could not be opened, with when that was first seen (monotonic):
        # they count as gone for readiness and missing_dependency_timeout.
        self.unopened: dict[str, float] = {}

    def context_of(self, lease: Lease) -> StreamContext | None:
        for context in self.contexts.values():
            if context.owns(lease):
                return context
        return None

    async def refresh(self, *, first: bool = False) -> tuple[list[StreamContext], bool]:
        """Bring the contexts in line with the tracker. Returns the contexts removed (their
        leases must be handed back) and whether a stream was added. The first refresh of a
        single-stream worker raises what keeps its stream from being consumed."""
        multi = bool(self._cfg.streams)
        specs = {spec.label: spec for spec in self._tracker()}
        removed = [self.contexts.pop(label) for label, context in list(self.contexts.items())
                   if label not in specs or context.recreated]  # fmt: skip
        self.unopened = {k: v for k, v in self.unopened.items() if k in specs}
        for context in removed:
            why = "was re-created" if context.recreated else "is no longer configured"
            log.warning("stream %s %s: handing its leases back", context.label, why)
        added = False
        for label, spec in specs.items():
            if label in self.contexts:
                continue
            try:
                context = await self._open(spec, multi)
            except KclpySparkError as exc:
                if first and not multi:
                    raise
                log.error("stream %s cannot be consumed now (will retry): %s", label, exc)
                if isinstance(exc, ResourceNotFoundError) or not exc.retriable:
                    # Gone, or refused for good (AccessDenied: IAM covers the other streams
                    # only): counted as missing, for readiness and missing_dependency_timeout;
                    # else a worker none of whose streams opened looked ready for ever.
                    self.unopened.setdefault(label, self._clock.monotonic())
                continue
            self.unopened.pop(label, None)
            self.contexts[label] = context
            if not first:
                log.info("now consuming stream %s", label)
                added = True
        return removed, added

    async def _open(self, spec: StreamSpec, multi: bool) -> StreamContext:
        lister = KinesisShardLister(
            self._kinesis_sync, stream_name=spec.stream_name, stream_arn=spec.stream_arn
        )
        await asyncio.to_thread(lister.wait_until_active)
        stream_key = None
        created = None
        if multi:
            stream_key = await asyncio.to_thread(stream_identity, self._kinesis_sync, spec)
            created = float(stream_key.rsplit(":", 1)[1])  # whole seconds: within the 1 s leeway
        else:
            created = await asyncio.to_thread(self._check_identity, lister, spec)
        cfg = self._cfg
        context = StreamContext(
            spec,
            stream_key=stream_key,
            initial_position=spec.initial_position or cfg.initial_position,
            kinesis_sync=self._kinesis_sync,
            table=self._table,
            ignore_unexpected_child_shards=cfg.ignore_unexpected_child_shards,
            counters=self._counters,
            kinesis_async=self._kinesis_async,
            settings=source_settings(cfg),
            rng=self._rng,
            on_out_of_range=self._on_out_of_range,
            record_sources=self._record_sources,
            still_leading=self._still_leading,
        )
        context.created = created
        return context

    def _check_identity(self, lister: KinesisShardLister, spec: StreamSpec) -> float | None:
        """The stream's creation time; raises StreamRecreatedError if the leases belong to an
        earlier stream of that name. The record is the spec's label's (its ARN, else its name);
        one under its name written since (a `reset` whose config names the stream by name, the
        workers' by ARN) that knows this stream is as good."""
        _, created = lister.describe()
        if created is None:
            return None
        label = spec.label
        known = coordination.stream_created(self._table, label)
        if known is not None and abs(known - created) > 1.0:
            by_name = (
                coordination.stream_created(self._table, spec.name) if spec.stream_arn else None
            )
            if by_name is None or abs(by_name - created) > 1.0:
                raise StreamRecreatedError(recreated_message(label, known, created))
            known = None  # this stream by its name's record: the label's record follows it
        if known is None:
            coordination.set_stream_created(
                self._table, label, created, now_wall=self._clock.wall()
            )
        return created

    def close(self) -> None:
        """The worker stopped: a probe still waiting for Kinesis is not waited for at exit."""
        self._probes.abandon(0.0)

    def shard_exists(self, lease: Lease) -> bool:
        """Whether ``lease``'s shard is still in its stream (one GetShardIterator); True when
        the answer is anything but "not found" (a vanished lease is put back only then), or
        when none comes within ``probe_timeout``: it is asked under the lease's lock, which the
        Kinesis client's own limits (30 s a try, three tries) would hold far past the lease."""
        context = self.context_of(lease)
        if context is None:
            return False  # its stream is no longer consumed here
        asked = self._probes.submit(
            self._kinesis_sync.get_shard_iterator,
            **context.spec.request, ShardId=lease.shard_id, ShardIteratorType="TRIM_HORIZON",
        )  # fmt: skip
        try:
            asked.result(timeout=self.probe_timeout)
        except concurrent.futures.TimeoutError:
            log.info("shard %s: no answer whether it exists within %.1f s; taken as yes",
                     lease.shard_id, self.probe_timeout)  # fmt: skip
            return True
        except Exception as exc:
            return error_code(exc) != "ResourceNotFoundException"
        return True

    def failing_syncs(self) -> list[str]:
        """Each stream whose last shard sync by this worker (the leader) failed, with why."""
        failed = [(c.label, c.maintenance.sync_failure) for c in self.contexts.values()]
        return [f"{label} ({why})" for label, why in failed if why]

    def configured(self) -> int:
        """How many streams this worker is to consume (opened or not, whatever kept one from
        opening)."""
        return len(self._tracker())

    def gone(self) -> dict[str, float]:
        """Each configured stream missing now (deleted, or never opened), with the monotonic
        time it was first missed."""
        gone = {c.label: c.gone_since for c in self.contexts.values()}
        return {**self.unopened, **{k: v for k, v in gone.items() if v is not None}}

    async def check_present(
        self, io: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None
    ) -> list[StreamContext]:
        """Ask each stream whether it still exists (DescribeStreamSummary), each at most every
        ``presence_interval``; returns the ones missing, each with ``gone_since`` set. Other
        errors leave the state as it was. ``io``: where the calls run (the worker's own threads,
        never behind processor calls; default: the loop's default executor)."""
        missing = []
        every = presence_interval(self._cfg.missing_dependency_timeout)
        for context in list(self.contexts.values()):
            now = self._clock.monotonic()
            if context.checked_at is not None and now - context.checked_at < every:
                if context.gone_since is not None:
                    missing.append(context)
                continue
            context.checked_at = now
            try:
                describe = context.lister.describe
                status, created = await (io(describe) if io else asyncio.to_thread(describe))
                gone = status == "DELETING"
                known = context.created
                if not gone and known is not None and created is not None:
                    renewed = abs(created - known) > 1.0  # a new stream of that name
                    if renewed and context.stream_key is not None:
                        # Several streams: each lease key names its stream's creation, so the
                        # new stream is opened afresh by the next refresh, under its own key.
                        if not context.recreated:
                            log.warning("stream %s was re-created: it is consumed afresh (the "
                                        "leader deletes the old stream's leases)",
                                        context.label)  # fmt: skip
                        context.recreated = True
                    elif renewed:
                        gone = True
                        if context.gone_since is None:
                            log.error(recreated_message(context.label, known, created))
            except ResourceNotFoundError:
                gone = True
            except KclpySparkError as exc:
                log.warning("checking stream %s failed: %s", context.label, exc)
                continue
            if gone:
                if context.gone_since is None:
                    context.gone_since = self._clock.monotonic()
                    log.error("stream %s no longer exists", context.label)
                missing.append(context)
            elif context.gone_since is not None:
                log.warning("stream %s exists again", context.label)
                context.gone_since = None
        return missing
