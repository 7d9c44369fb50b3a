"""The Spark job that reads planned ranges on the executors (``read_on = "executors"``).

The driver sends only range metadata (``ReadRange`` as JSON, one Spark partition per range);
each task reads its range with ``retrieval/range_reader.py`` and yields Arrow record batches of
the record columns (``pieces.SCHEMA``), then one row that holds the ``RangeEnd``. The result is
materialised on the executors with ``localCheckpoint`` by the one job that collects the end rows
(all the driver receives): the sinks' DataFrame is the stored rows, never a second read, and a
lost block fails the job instead of being re-read without the pin (the retried attempt reads the
pinned ranges, which give the same records or fail loudly). ``StoredReads`` frees a read's stored
rows once no batch holds it.

On an executor, one ``_ExecutorReads`` per Python worker process keeps an event loop thread and
up to ``MAX_CLIENTS`` Kinesis clients (by region and endpoint) across tasks. Credentials come
from the executor's own AWS chain: the driver sends a region and an endpoint, never a secret.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from kclpy_spark.spark.pieces import SCHEMA, records_to_chunk
from kclpy_spark.spark.ranges import RangeEnd, ReadRange
from kclpy_spark.spark.sql_text import sql_string

END_COLUMN = "kclpy_spark_range_end"
LEASE_COLUMN = "kclpy_spark_lease"  # which lease a record row belongs to (dropped before sinks)
MAX_CLIENTS = 4  # Kinesis clients one Python worker keeps (one per region and endpoint in use)
# The read's own columns beside a record's: its lease, and its end (null in a record's row).
# Whoever takes the records drops both in one call (a drop is several calls to the JVM).
READ_COLUMNS = (LEASE_COLUMN, END_COLUMN)
GRACE_SECONDS = 60.0  # beyond a range's own time budget, before its task gives up on the read
READS_AT_ONCE = 8  # ranges one task reads side by side (what it holds: that many ranges' records)

# What a task yields: the record columns as Spark holds them (microsecond timestamps), every
# column nullable (an end row has only the end), and the end.
OUTPUT_SCHEMA = pa.schema(
    [
        pa.field(f.name, pa.timestamp("us", tz="UTC") if f.name == "approximate_arrival_timestamp"
                 else f.type, nullable=True)
        for f in SCHEMA
    ]
    + [pa.field(LEASE_COLUMN, pa.string(), nullable=True),
       pa.field(END_COLUMN, pa.string(), nullable=True)]
)  # fmt: skip
OUTPUT_DDL = (
    "stream string, shard_id string, sequence_number string, sub_sequence_number bigint, "
    "partition_key string, approximate_arrival_timestamp timestamp, data binary, "
    f"{LEASE_COLUMN} string, {END_COLUMN} string"
)


@dataclass(frozen=True)
class AwsTarget:
    """Where executors reach Kinesis: a region and an optional endpoint (LocalStack)."""

    region: str
    endpoint_url: str | None = None


@dataclass(frozen=True)
class RangeRead:
    """One read of some ranges: the records (a DataFrame stored on the executors: the record
    columns and ``READ_COLUMNS``, which a user of the records drops) and each range's end, by
    lease key."""

    stored: Any
    ends: dict[str, RangeEnd]

    @property
    def records(self) -> Any:
        """The record columns of every range."""
        return without_read_columns(self.stored)

    def stored_of(self, lease_keys: Collection[str]) -> Any:
        """The stored rows of some ranges, ``READ_COLUMNS`` included (all of them: no filter).
        The filter is SQL text: one call to the JVM, where a column of literals was one call
        per lease (``sql_string``)."""
        if set(lease_keys) >= set(self.ends):
            return self.stored
        keys = ", ".join(sql_string(k) for k in sorted(lease_keys))
        return self.stored.where(f"{LEASE_COLUMN} IN ({keys})")


def without_read_columns(df: Any) -> Any:
    """``df`` without ``READ_COLUMNS``: one call to the driver's JVM a column. ``DataFrame.drop``
    of names first makes a Scala Seq of them in the JVM (five calls more; 4% of the daemon's
    samples at 24 shards reading on the executors, where each batch's frame drops them). Over
    Spark Connect (no JVM here), ``drop``."""
    try:
        jdf = df._jdf
    except Exception:
        return df.drop(*READ_COLUMNS)
    for name in READ_COLUMNS:
        jdf = jdf.drop(name)
    return type(df)(jdf, df.sparkSession)


class StoredReads:
    """Frees the executors' copy of each read no batch holds any more. Spark keeps a local
    checkpoint's blocks until the driver's JVM collects its RDD (a periodic GC, every 30 minutes
    by default), which at full speed would be gigabytes; here, once a ``RangeRead`` is garbage
    (its last ``RangeChunk`` went with its batch), its RDD is queued, and ``release`` (each read
    round) unpersists the queued ones. Over Spark Connect there is no RDD to reach: the client
    drops a local checkpoint when its DataFrame is garbage, but the server frees its blocks only
    at its JVM's next periodic GC (lower ``spark.cleaner.periodicGC.interval`` there)."""

    def __init__(self) -> None:
        self._gone: deque[Any] = deque()  # appended by finalizers (any thread), popped by release
        self.kept = 0  # reads whose stored rows are not released yet

    def track(self, read: RangeRead, jrdd: Any) -> None:
        self.kept += 1
        weakref.finalize(read, self._gone.append, jrdd)

    def release(self) -> int:
        """Unpersist the stored rows of the reads that are gone; returns how many."""
        released = 0
        while self._gone:
            jrdd = self._gone.popleft()
            released += 1
            with contextlib.suppress(Exception):  # the JVM may be gone at exit
                _unpersist(jrdd)
        self.kept -= released
        return released


def _unpersist(jrdd: Any) -> None:
    """Free a local checkpoint's blocks, asynchronously. ``RDD.unpersist`` logs a warning for
    every locally checkpointed RDD (its lineage is gone), which was a line per read job, several a
    second for as long as a daemon runs; the context's own call frees the same blocks silently.
    It is Spark-internal, so a Spark without it falls back to ``unpersist``."""
    try:
        jrdd.context().unpersistRDD(jrdd.id(), False)
    except Exception:
        jrdd.unpersist(False)


def _stored_level() -> Any:
    """How a read's rows are stored: serialized, in memory and spilled to disk. Spark's default
    for a local checkpoint keeps every row as a Java object; a worker holds the reads of the
    batches in flight, so the JVM's collector kept tracing hundreds of thousands of them (29% of
    the JVM's CPU at 16 shards). Serialized, they are a few large buffers (BENCHMARKS.md)."""
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK  # PySpark's MEMORY_AND_DISK is the serialized one


def _stored_rdd(stored: Any) -> Any:
    """The JVM RDD holding a local checkpoint's blocks (None over Spark Connect)."""
    try:
        return stored._jdf.queryExecution().logical().rdd()
    except Exception:
        return None


def read_ranges(
    session: Any,
    ranges: Sequence[ReadRange],
    aws: AwsTarget,
    *,
    description: str = "",
    stored_reads: StoredReads | None = None,
    partitions: int | None = None,
) -> RangeRead:
    """Run the Spark job that reads ``ranges`` (distinct leases) on the executors, in
    ``partitions`` tasks (default: one per core of the cluster, at most one per range; a task
    reads its ranges side by side); with ``stored_reads``, the read's stored rows are freed once
    the returned read is garbage."""
    keys = [r.lease_key for r in ranges]
    if not ranges or len(set(keys)) != len(keys):
        raise ValueError(f"one range per lease, at least one: {keys!r}")
    payload = tuple(r.to_json() for r in ranges)
    n = len(payload)
    reads = functools.partial(read_partition, payload, aws)
    sc = _spark_context(session)  # None over Spark Connect (no job descriptions, no job count)
    described = bool(description) and sc is not None
    if described:
        sc.setJobDescription(description)
    jrdd = None
    try:
        parts = max(1, min(n, partitions or cluster_cores(session) or n))
        # The ranges travel in the function's closure, so PySpark makes a Python UDF each round
        # (~30 calls to the JVM). Given as SQL literals to one UDF made once, they would stay in
        # each execution's plan description, which Spark keeps for its last 1,000 executions
        # (~450 KB each at 1,000 leases: a range is ~450 bytes of JSON); as job properties, in
        # every event log line of the job.
        planned = session.range(0, n, 1, parts).mapInArrow(reads, _output_type())
        # Classic: stored by the job that collects the ends (one job), which must then be the only
        # one: Spark computes again a partition whose block went missing before the job ended
        # (an executor lost), reading Kinesis again, and those rows could go past the ends.
        # Over Connect (no job count to ask): stored first, the ends read from what was stored.
        stored = planned.localCheckpoint(eager=sc is None, storageLevel=_stored_level())
        jrdd = _stored_rdd(stored)
        with _job_tag(sc) as tag:
            # SQL text, whole rows: each Column function or column list is more calls to the JVM.
            rows = stored.where(f"{END_COLUMN} IS NOT NULL").collect()
        if sc is not None and len(sc._jsc.sc().statusTracker().getJobIdsForTag(tag)) > 1:
            raise RuntimeError("a partition of the read was computed again (an executor lost?)")
        ends = {e.lease_key: e for e in (RangeEnd.from_json(row[END_COLUMN]) for row in rows)}
        if set(ends) != set(keys):
            raise RuntimeError(f"the read job returned ends for {sorted(ends)}, not {sorted(keys)}")
    except BaseException:
        if jrdd is not None:
            with contextlib.suppress(Exception):
                _unpersist(jrdd)
        raise
    finally:
        if described:
            sc.setJobDescription(None)
    read = RangeRead(stored.where(f"{END_COLUMN} IS NULL"), ends)
    if stored_reads is not None and jrdd is not None:
        stored_reads.track(read, jrdd)
    return read


@functools.cache
def _output_type() -> Any:
    """``OUTPUT_DDL`` as PySpark's type, made in Python: given as text, every read job would
    have the JVM parse it (three calls to the JVM)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(OUTPUT_SCHEMA)


def waves(ranges: int, tasks: int) -> int:
    """How many rounds of ``READS_AT_ONCE`` reads side by side the busiest of ``tasks`` tasks
    makes over ``ranges`` ranges (the job's ranges are split evenly over its tasks)."""
    share = -(-ranges // max(1, tasks))
    return -(-share // READS_AT_ONCE)


def default_parallelism(session: Any) -> int:
    """The cluster's cores (``cluster_cores``), else two."""
    return cluster_cores(session) or 2


def cluster_cores(session: Any) -> int | None:
    """The session's default parallelism (the cluster's cores); over Spark Connect (no
    SparkContext) the ``spark.default.parallelism`` setting, or None."""
    sc = _spark_context(session)
    if sc is not None:
        return max(1, int(sc.defaultParallelism))
    value = session.conf.get("spark.default.parallelism", None)
    return max(1, int(value)) if value and str(value).isdigit() else None


def _spark_context(session: Any) -> Any:
    try:
        return session.sparkContext
    except Exception:  # Spark Connect
        return None


@contextlib.contextmanager
def _job_tag(sc: Any) -> Iterator[str]:
    """A tag of its own on the jobs this thread starts inside the block (classic Spark)."""
    tag = f"kclpy-spark-range-read-{uuid.uuid4().hex}"
    if sc is None:
        yield tag
        return
    sc.addJobTag(tag)
    try:
        yield tag
    finally:
        sc.removeJobTag(tag)


# --- on the executors ----------------------------------------------------------------------------


def read_partition(
    payload: tuple[str, ...], aws: AwsTarget, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """mapInArrow's function: the ranges whose indexes the partition holds, read at once."""
    ranges = [
        ReadRange.from_json(payload[int(index)])
        for batch in batches
        for index in batch.column(0).to_pylist()
    ]
    if not ranges:
        return
    for rng, outcome in _executor_reads().reads(ranges, aws):
        if isinstance(outcome, BaseException):  # this range's failure, told to the driver
            yield _end_row(RangeEnd(rng.lease_key, None, None, 0, 0, error=one_line(outcome)))
            continue
        chunks, end = outcome
        for chunk in chunks:
            yield _as_output(chunk, rng.lease_key)
        yield _end_row(end)


def one_line(exc: BaseException) -> str:
    """A failure as one line (its type and the first line of its message)."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]


def spark_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """A chunk's record columns with the arrival time as Spark holds it (microseconds)."""
    return [
        col.cast(OUTPUT_SCHEMA.field(i).type) if i == 5 else col
        for i, col in enumerate(batch.columns)
    ]


def _as_output(batch: pa.RecordBatch, lease_key: str) -> pa.RecordBatch:
    columns = spark_columns(batch)
    columns.append(pa.repeat(pa.scalar(lease_key, pa.string()), batch.num_rows))
    columns.append(pa.nulls(batch.num_rows, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)


def _end_row(end: RangeEnd) -> pa.RecordBatch:
    columns = [pa.nulls(1, f.type) for f in OUTPUT_SCHEMA][:-1]
    columns.append(pa.array([end.to_json()], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)


Read = tuple[list[pa.RecordBatch], RangeEnd]  # one range's record batches and its end


class _ExecutorReads:
    """One Python worker's reading: an event loop thread and its Kinesis clients."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kclpy-spark-range-reads", daemon=True
        )
        self._thread.start()
        self._clients: OrderedDict[AwsTarget, tuple[Any, Any]] = OrderedDict()
        self._making = asyncio.Lock()  # one client per target, however many reads ask at once
        self._frozen = False

    def reads(
        self, ranges: Sequence[ReadRange], aws: AwsTarget
    ) -> Iterator[tuple[ReadRange, Read | BaseException]]:
        """Read ``ranges`` side by side on the event loop, at most ``READS_AT_ONCE`` at a time,
        each within its own time budget and the grace; each comes back as soon as it ends, with
        its records or its own failure (a task holds the records of the reads it has not given
        back yet, no more)."""
        from kclpy_spark.retrieval.range_reader import RangeReader

        gate = asyncio.Semaphore(READS_AT_ONCE)

        async def one(rng: ReadRange) -> Read:
            if rng.delay > 0:  # the shard's pacing (a lease planned just before it may be read)
                await asyncio.sleep(rng.delay)
            async with gate:
                chunks: list[pa.RecordBatch] = []
                client = await self._client(aws)

                def keep(records: list[Any]) -> None:
                    chunks.append(records_to_chunk(records, rng.stream, rng.shard_id).batch)

                limit = rng.max_seconds + GRACE_SECONDS
                return chunks, await asyncio.wait_for(RangeReader(client, rng).read(keep), limit)

        started = {asyncio.run_coroutine_threadsafe(one(r), self._loop): r for r in ranges}
        longest = max(r.max_seconds for r in ranges) + GRACE_SECONDS
        limit = max(r.delay for r in ranges) + waves(len(ranges), 1) * longest + GRACE_SECONDS
        given: set[concurrent.futures.Future[Read]] = set()
        try:
            for future in concurrent.futures.as_completed(started, timeout=limit):
                given.add(future)
                try:
                    outcome: Read | BaseException = future.result()
                except BaseException as exc:  # this range's failure, whatever it is
                    outcome = exc
                yield started[future], outcome
        except concurrent.futures.TimeoutError as exc:
            for future, rng in started.items():
                if future not in given:
                    yield rng, exc
        finally:
            for future in started:
                future.cancel()
        if not self._frozen:
            self._frozen = True
            _freeze_heap()

    async def _client(self, aws: AwsTarget) -> Any:
        async with self._making:
            return await self._client_for(aws)

    async def _client_for(self, aws: AwsTarget) -> Any:
        if aws in self._clients:
            self._clients.move_to_end(aws)
            return self._clients[aws][1]
        from aiobotocore.session import get_session

        from kclpy_spark.aws import botocore_config, endpoint_kwargs

        context = get_session().create_client(
            "kinesis",
            config=botocore_config(max_pool_connections=16),
            **endpoint_kwargs(aws.region, aws.endpoint_url),
        )
        client = await context.__aenter__()
        self._clients[aws] = (context, client)
        while len(self._clients) > MAX_CLIENTS:
            _, (old, _) = self._clients.popitem(last=False)
            await old.__aexit__(None, None, None)
        return client


def _freeze_heap() -> None:
    """PySpark's reused Python worker runs a full ``gc.collect()`` after every task; with the
    AWS SDK's service models and a client loaded, that was ~50 ms of CPU a task (more than the
    read). What is alive after the first read (modules, the client) is moved out of the
    collector's sight (``gc.freeze``): later tasks' collections see only their own objects."""
    gc.collect()
    gc.freeze()


_READS: _ExecutorReads | None = None
_READS_LOCK = threading.Lock()


def _executor_reads() -> _ExecutorReads:
    global _READS
    with _READS_LOCK:
        if _READS is None:
            _READS = _ExecutorReads()
        return _READS
