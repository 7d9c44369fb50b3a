"""``spark.readStream.format("kinesis-kcl")``: a Structured Streaming source on PySpark's Python
Data Source API, reading on the executors with the daemon's range reader.

The driver side (Spark runs it in a Python process of its own) plans: it lists the shards, keeps
the parent/child order and names, per batch, each shard's start (``offsets.py``). Each shard of
a batch is one Spark partition; its task reads the range on an executor exactly as
``read_on = "executors"`` does (``cluster_read``: paced GetRecords, KPL aggregates split, the
child's hash keys applied), and the first read of a range pins what it found (``pins.py``), so a
batch Spark replays after a failure or a restart reads the same records. Spark's own checkpoint
(``checkpointLocation``) keeps the offsets; this source acknowledges nothing on its own.

With ``leaseStore`` the query is also a KCL worker of its application (``lease_driver.py``): it
reads only the shards whose leases it holds and checkpoints each completed batch in the lease
table. The daemon's ``value_schema`` is ``spark.values.with_values`` on the stream. A per-trigger
limit is Spark's read limit (``getDefaultReadLimit``), shared over a batch's shards.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.readstream.lease_driver import LeaseDriver
from kclpy_spark.readstream.leased import children_in
from kclpy_spark.readstream.offsets import (
    Pin,
    SourceOffset,
    first_offset,
    next_offset,
    within_limit,
)
from kclpy_spark.readstream.options import SourceOptions
from kclpy_spark.readstream.pins import DirectoryPins
from kclpy_spark.retrieval.polling import MAX_READ_PAUSE
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN
from kclpy_spark.spark.ranges import PINNED_TIME_FACTOR, Pinned, RangeEnd, ReadRange, aged_out

log = logging.getLogger(__name__)

SCHEMA = (
    "stream string, shard_id string, sequence_number string, sub_sequence_number bigint, "
    "partition_key string, approximate_arrival_timestamp timestamp, data binary"
)
READ_SECONDS = 30.0  # a range's time budget on the executor (it stops early at the tip)
IDLE_SECONDS = 1.0  # after a batch that found nothing, the next is planned no sooner


class KinesisKclDataSource(DataSource):
    """The ``kinesis-kcl`` data source (streaming reads only)."""

    @classmethod
    def name(cls) -> str:
        return "kinesis-kcl"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.source_options = SourceOptions.parse(options)  # a bad option fails load()

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> KinesisKclStreamReader:
        return KinesisKclStreamReader(self.source_options)


class RangePartition(InputPartition):
    """One shard's range in one batch: the range and where its pin lives, as JSON."""

    def __init__(self, value: str) -> None:
        super().__init__(value)


class KinesisKclStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._until_ms: int | None = None
        self._lister: Any = None  # the driver side's, made on first use (never pickled)
        self._leases: LeaseDriver | None = None  # with a lease store: the driver side's worker
        self._checked = False  # the pin folder was checked
        self._planned_at = float("-inf")  # monotonic: when the last batch was planned
        self._nothing = False  # the last planning found nothing to read (no batch)
        # The last batch this process planned (run, batch): any other Spark gives partitions()
        # is a replay of a batch planned before a restart.
        self._planned_here: tuple[str, int] | None = None
        # the pins of the last batch asked about (they do not change once it ran)
        self._found: tuple[tuple[str, int] | None, dict[str, Pin]] = (None, {})

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lister": None, "_leases": None}

    # --- the driver side ---------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        """A new query's first offset. LATEST's moment is a margin before this host's clock
        says now (arrival times are the service's clock): records that came at the start may
        come twice with a later start from there, none is skipped."""
        began = time.time() - LATEST_RESTART_MARGIN
        return first_offset(uuid.uuid4().hex, int(began * 1000)).to_json()

    def getDefaultReadLimit(self) -> Any:
        """``maxRecordsPerTrigger`` / ``maxBytesPerTrigger`` as Spark's read limit (Spark passes
        it back to ``latestOffset``, or ReadAllAvailable when a trigger wants everything)."""
        from pyspark.sql.streaming.datasource import (
            ReadAllAvailable,
            ReadMaxBytes,
            ReadMaxRows,
        )

        if self._options.max_records_per_trigger is not None:
            return ReadMaxRows(self._options.max_records_per_trigger)
        if self._options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read what arrived until now, then stop (offsets.py)."""
        self._until_ms = int(time.time() * 1000)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        previous = SourceOffset.from_json(start)
        pins = self._pins()
        if not self._checked:
            pins.check()  # one line if the folder cannot hold pins (not writable, no links)
            self._checked = True
        key = (previous.run, previous.batch)
        if self._found[0] != key:  # Spark asks again and again while a query is idle
            self._found = (key, self._pins_of(previous, pins))
        found = self._found[1]
        leases = self._lease_driver()
        listing: list[Any] = []
        listing_lock = threading.Lock()  # acknowledgments run side by side (acknowledge_all)

        def listed() -> list[Any]:  # at most one listing per call
            with listing_lock:
                if not listing:
                    listing.append(self._list(previous))
                return list(listing[0])

        if leases is not None:  # the batch ending at ``start`` is complete: acknowledge it
            leases.acknowledge(previous, found, pins, lambda sid: children_in(listed(), sid))
        idle = self._nothing or (
            bool(found) and all(p.rows == 0 and p.caught_up for p in found.values())
        )
        if (idle and self._until_ms is None
                and time.monotonic() - self._planned_at < IDLE_SECONDS):  # fmt: skip
            return start  # every shard was dry: no new batch (nor a listing) more than 1/s
        if leases is not None:
            skipped = pins.skipped(previous.run, previous.batch)
            following = leases.plan(previous, found, listed(), self._until_ms, skipped)
        else:
            following = next_offset(previous, found, listed(), self._options.initial_position,
                                    self._until_ms)  # fmt: skip
        if following is not previous:
            following = within_limit(following, *_limits(limit))
        if following.batch > previous.batch >= 1:  # a replay needs this batch's and the last's
            pins.forget_before(previous.run, previous.batch)
        self._planned_at = time.monotonic()
        self._nothing = following is previous  # leases: nothing held to read
        self._planned_here = (following.run, following.batch)
        return following.to_json()

    def _pins_of(self, offset: SourceOffset, pins: DirectoryPins) -> dict[str, Pin]:
        """The pins of a batch that ran. A shard whose task never ran (a foreachBatch that read
        only some partitions) gets an empty pin: read again from the same start next time."""
        found: dict[str, Pin] = {}
        for sid in offset.read_shards() if offset.batch >= 0 else []:
            pin = pins.get(offset.run, offset.batch, sid)
            if pin is None:
                if not pins.planned(offset.run, offset.batch):
                    raise KclpySparkError(
                        f"kinesis-kcl: the pins of batch {offset.batch} are not in "
                        f"{self._options.pin_location} (pinLocation changed, or not a folder "
                        "the driver and the executors share)"
                    )
                empty = Pin(None, None, 0, next_iterator=offset.shards[sid].iterator)
                pin = pins.put_first(offset.run, offset.batch, sid, empty)
            found[sid] = pin
        return found

    def _check_pins_kept(self, offset: SourceOffset, pins: DirectoryPins) -> None:
        """A batch Spark replays after a restart (not planned by this process) needs the pins
        of the run: the batch's own, or at least its predecessor's (kept while the batch after
        it is planned). Neither there: the folder is not the one the query ran with (a new
        working folder, pod or ``pinLocation``); read afresh, the replay would read other
        records than the batch it replaces (a sink keeping the first write of a batch id then
        skips or doubles the difference)."""
        run, batch = offset.run, offset.batch
        if (run, batch) == self._planned_here or batch < 1 or pins.planned(run, batch):
            return
        if not pins.planned(run, batch - 1):
            raise KclpySparkError(
                f"kinesis-kcl: batch {batch} of run {run} is replayed, but the pins of its run "
                f"are not in {self._options.pin_location} (pinLocation changed, or a relative "
                "one under another working folder: give the query's pinLocation, an absolute "
                "folder the driver and the executors share)"
            )

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[RangePartition]:
        """The batch's ranges, ``shardsPerTask`` to a partition: a task reads its ranges side by
        side (each paced by its shard's limits, so one shard alone leaves a core waiting)."""
        offset = SourceOffset.from_json(end)
        o = self._options
        pins = self._pins()
        self._check_pins_kept(offset, pins)
        pins.mark_planned(offset.run, offset.batch)
        leases = self._lease_driver()
        if leases is not None:
            shards = leases.replay_reads(offset, pins)
        elif (offset.run, offset.batch) != self._planned_here:
            shards = self._still_listed(offset, offset.read_shards())
        else:
            shards = offset.read_shards()
        ranges = []
        pauses = self._pauses(offset)
        for sid in shards:
            plan = offset.shards[sid]
            ranges.append(ReadRange(
                lease_key=sid, stream=o.stream, stream_arg=o.stream_arg, shard_id=sid,
                after=plan.start.after,
                max_records=min(o.max_records, plan.max_records or o.max_records),
                max_bytes=min(o.max_bytes, plan.max_bytes or o.max_bytes),
                max_seconds=READ_SECONDS, read_rate=o.read_rate or 1e12, kpl=o.kpl,
                hash_range=plan.hash_range,
                timestamp=None if plan.start.at_ms is None else plan.start.at_ms / 1000,
                until_millis=offset.until_ms, iterator=plan.iterator,
                delay=pauses.get(sid, 0.0),
            ).to_json())  # fmt: skip
        step = o.shards_per_task
        parts = []
        for i in range(0, len(ranges), step):
            value = {"ranges": ranges[i : i + step], "run": offset.run, "batch": offset.batch}
            parts.append(RangePartition(json.dumps(value)))
        return parts

    def _pauses(self, offset: SourceOffset) -> dict[str, float]:
        """How long each shard's read in the batch planned here waits first: what is left of
        the pause its read in the batch before asked (5 calls and 2 MiB a second; read at once,
        a read after a big page was throttled and gave way, an empty batch for the shard)."""
        before, found = self._found  # the pins of the batch this one follows
        planned_here = (offset.run, offset.batch) == self._planned_here
        if not planned_here or before is None or before[0] != offset.run:
            return {}  # a replay: its reads wait only for what Kinesis says
        now = time.time()
        return {sid: min(MAX_READ_PAUSE, pin.pause_left(now)) for sid, pin in found.items()}

    def _still_listed(self, offset: SourceOffset, shards: Sequence[str]) -> list[str]:
        """A batch planned before a restart, replayed: the shards of it the stream still
        lists. One that aged out past the retention since (a query down that long across a
        reshard) failed every task of the replay, and the restarted query with it, for good;
        left out, it gets an empty pin, and the next plan finds it gone (its children start at
        their start). A listing that fails leaves the batch as planned."""
        try:
            listed = {s.shard_id for s in self._list(offset)}
        except KclpySparkError as exc:
            log.warning("kinesis-kcl: could not list the shards for the replay of batch %d: %s",
                        offset.batch, exc)  # fmt: skip
            return list(shards)
        gone = [sid for sid in shards if sid not in listed]
        if gone:
            log.warning("kinesis-kcl: replaying batch %d without shard(s) %s, no longer in the "
                        "stream (past its retention)", offset.batch, ", ".join(gone))  # fmt: skip
        return [sid for sid in shards if sid in listed]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets (and it calls this one batch
        late, never for the last batch: no place to acknowledge anything; with leases, the
        next ``latestOffset`` acknowledges)."""

    def stop(self) -> None:
        """Hand the leases over when the reader is stopped. PySpark 4.3 kills the source's Python
        process when a query stops (pyspark's daemon: SIGKILL), so this rarely runs: the leases
        of a stopped query move after ``failoverTime``, as a crashed worker's do."""
        if self._leases is not None:
            self._leases.stop()

    def _lease_driver(self) -> LeaseDriver | None:
        if self._options.lease_store is None:
            return None
        if self._leases is None:
            self._leases = LeaseDriver(self._options)
        return self._leases

    def _pins(self) -> DirectoryPins:
        return DirectoryPins(self._options.pin_location)

    def _list(self, previous: SourceOffset) -> list[Any]:
        from shard_sync.discovery import KinesisShardLister, shard_filter_for

        if self._lister is None:
            self._lister = KinesisShardLister(
                _kinesis_client(self._options), stream_name=self._options.stream_name,
                stream_arn=self._options.stream_arn,
            )  # fmt: skip
        if previous.shards or previous.ended:
            return list(self._lister.list_shards())
        # the first listing: the empty-table rule wants the shards open at the initial position
        return list(self._lister.list_shards(shard_filter_for(self._options.initial_position)))

    # --- on the executors --------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """A partition's ranges read side by side; a range read the first time is pinned, and
        one another attempt pinned first is read again to that pin (its records, no others)."""
        value = json.loads(partition.value)
        run, batch = str(value["run"]), int(value["batch"])
        pins = self._pins()
        if not pins.planned(run, batch):  # the driver marks a batch before any of its tasks runs
            raise KclpySparkError(
                f"kinesis-kcl: pinLocation {self._options.pin_location} is not a folder the "
                "driver and the executors share (the driver's mark of this batch is not there)"
            )
        ranges = []
        for text in value["ranges"]:
            rng = ReadRange.from_json(text)
            stored = pins.get(run, batch, rng.shard_id)
            ranges.append(rng if stored is None else _pinned(rng, stored))
        for rng, (chunks, end) in self._reads(ranges):
            if rng.pinned is not None and aged_out(rng.pinned, end):
                log.warning(
                    "kinesis-kcl: shard %s: batch %d read again found %d of its %s records: "
                    "the rest aged out of the stream's retention before it was written",
                    rng.shard_id, batch, end.rows, rng.pinned.rows,
                )  # fmt: skip
            if rng.pinned is None:
                pin = Pin(end.first, end.last, end.rows, end.shard_ended,
                          caught_up=end.bounded
                          or (end.millis_behind_latest == 0 and not end.left_behind),
                          bounded=end.bounded, next_iterator=end.next_iterator,
                          children=tuple(end.child_shards), **_pacing(end))  # fmt: skip
                winner = pins.put_first(run, batch, rng.shard_id, pin)
                if not winner.same_records(pin):  # another attempt pinned first: its records
                    ((_, (chunks, _)),) = self._reads([_pinned(rng, winner)])
            for chunk in chunks:
                yield _as_output(chunk)

    def _reads(
        self, ranges: list[ReadRange]
    ) -> list[tuple[ReadRange, tuple[list[pa.RecordBatch], RangeEnd]]]:
        from kclpy_spark.spark.range_tasks import AwsTarget, one_line, task_reads

        aws = AwsTarget(self._options.region, self._options.endpoint_url)
        done = []
        for rng, outcome in task_reads().reads(ranges, aws):
            if isinstance(outcome, BaseException):  # one line per failed task, not its stack
                raise KclpySparkError(
                    f"kinesis-kcl: shard {rng.shard_id}: {one_line(outcome)}"
                ) from None
            done.append((rng, outcome))
        return done


def _limits(limit: Any) -> tuple[int | None, int | None]:
    """The rows and bytes a Spark read limit allows a batch (None: no limit of that kind);
    the limits a Python source cannot honour (minimum rows, files) read all available."""
    rows, size = getattr(limit, "max_rows", None), getattr(limit, "max_bytes", None)
    return (None if rows is None else int(rows)), (None if size is None else int(size))


def _pacing(end: RangeEnd) -> dict[str, float | None]:
    """A read's pause, relative, and when it ended, both on this executor's clock."""
    if end.next_call_at is None:
        return {}
    now = time.time()
    return {"pause": max(0.0, end.next_call_at - now), "ended_at": now}


def _pinned(rng: ReadRange, pin: Pin) -> ReadRange:
    """``rng`` read again to ``pin`` exactly (more time: what it must read may have taken the
    first read all of its budget)."""
    # what retention left of it, if it aged out meanwhile (one line, data_source.read)
    pinned = Pinned(pin.first, pin.last, pin.rows, pin.ended, aged_out_ok=True)
    return replace(rng, pinned=pinned, until_millis=None, iterator=None,
                   max_seconds=rng.max_seconds * PINNED_TIME_FACTOR)  # fmt: skip


def _as_output(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A chunk of the record columns as Spark holds them."""
    from kclpy_spark.spark.range_tasks import spark_columns

    return pa.RecordBatch.from_arrays(spark_columns(batch), names=batch.schema.names)


def _kinesis_client(options: SourceOptions) -> Any:
    import boto3

    from kclpy_spark.aws import botocore_config, endpoint_kwargs

    return boto3.session.Session().client(
        "kinesis", config=botocore_config(),
        **endpoint_kwargs(options.region, options.endpoint_url),
    )  # fmt: skip
