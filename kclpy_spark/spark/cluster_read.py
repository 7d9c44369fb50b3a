"""The Spark job that reads planned ranges on the executors (``read_on = "executors"``).

The driver sends only range metadata (``ReadRange`` as JSON, one Spark partition per range);
each task reads its ranges with ``retrieval/range_reader.py`` and yields Arrow record batches of
the record columns (``pieces.SCHEMA``), then one row that holds the ``RangeEnd``. The result is
materialised on the executors with ``localCheckpoint`` (eagerly), and the end rows collected from
what was stored (all the driver receives): the sinks' DataFrame is the stored rows, never a
second read, and a lost block fails the job instead of being re-read without the pin (the retried
attempt reads the pinned ranges, which give the same records or fail loudly). ``StoredReads``
frees a read's stored rows once no batch holds it. What the tasks run is ``range_tasks.py``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kclpy_spark.spark.range_tasks import (
    END_COLUMN,
    LEASE_COLUMN,
    OUTPUT_SCHEMA,
    READ_COLUMNS,
    AwsTarget,
    read_partition,
)
from kclpy_spark.spark.ranges import RangeEnd, ReadRange
from kclpy_spark.spark.sql_text import sql_string


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


# The most bytes of ranges (as JSON) one read job carries in its function. PySpark broadcasts a
# function pickled past ``spark.broadcast.UDFCompressionThreshold`` (1 MiB by default) through a
# temporary file on the driver that nothing deletes: a round of ~1,150 leases or more (with
# multi-stream keys; ~1,550 single-stream) left one there every round (gigabytes an hour, then a
# full disk). A round over it runs several jobs.
CLOSURE_BYTES = 900_000


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
    reads its ranges side by side; a job per ``CLOSURE_BYTES`` of ranges); with
    ``stored_reads``, the read's stored rows are freed once the returned read is garbage."""
    keys = [r.lease_key for r in ranges]
    if not ranges or len(set(keys)) != len(keys):
        raise ValueError(f"one range per lease, at least one: {keys!r}")
    sc = _spark_context(session)  # None over Spark Connect (no job descriptions)
    described = bool(description) and sc is not None
    if described:
        sc.setJobDescription(description)
    jobs: list[tuple[Any, Any]] = []  # each job's stored rows and their JVM RDD
    ends: dict[str, RangeEnd] = {}
    try:
        cores = partitions or cluster_cores(session)
        for payload in _closure_sized(tuple(r.to_json() for r in ranges)):
            stored, jrdd, found = _read_job(
                session, payload, aws, cores or len(payload), classic=sc is not None
            )
            jobs.append((stored, jrdd))
            ends.update(found)
        if set(ends) != set(keys):
            raise RuntimeError(f"the read job returned ends for {sorted(ends)}, not {sorted(keys)}")
    except BaseException:
        for _, jrdd in jobs:
            _unpersist_quietly(jrdd)
        raise
    finally:
        if described:
            sc.setJobDescription(None)
    stored = functools.reduce(lambda a, b: a.union(b), [job[0] for job in jobs])
    read = RangeRead(stored.where(f"{END_COLUMN} IS NULL"), ends)
    for _, jrdd in jobs:
        if stored_reads is not None and jrdd is not None:
            stored_reads.track(read, jrdd)
    return read


def _closure_sized(payload: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``payload`` in runs of at most ``CLOSURE_BYTES`` (a range over it alone is one run)."""
    runs: list[tuple[str, ...]] = []
    run: list[str] = []
    size = 0
    for item in payload:
        if run and size + len(item) > CLOSURE_BYTES:
            runs.append(tuple(run))
            run, size = [], 0
        run.append(item)
        size += len(item)
    runs.append(tuple(run))
    return runs


def _read_job(
    session: Any, payload: tuple[str, ...], aws: AwsTarget, cores: int, *, classic: bool
) -> tuple[Any, Any, dict[str, RangeEnd]]:
    """One Spark job reading ``payload``'s ranges: its stored rows, their JVM RDD (None over
    Spark Connect) and the ranges' ends."""
    n = len(payload)
    reads = functools.partial(read_partition, payload, aws)
    # The ranges travel in the function's closure, so PySpark makes a Python UDF each round
    # (~30 calls to the JVM). Given as SQL literals to one UDF made once, they would stay in
    # each execution's plan description, which Spark keeps for its last 1,000 executions
    # (~450 KB each at 1,000 leases: a range is ~450 bytes of JSON); as job properties, in
    # every event log line of the job.
    planned = session.range(0, n, 1, max(1, min(n, cores))).mapInArrow(reads, _output_type())
    # Stored first (a job of its own), then the ends read from what was stored: the ends always
    # name the rows the sinks will write. Stored by the job that collects the ends instead (one
    # job less), a partition whose block went missing before that job ended (an executor lost)
    # was computed again by Spark, reading Kinesis again past the ends collected; the check that
    # counted the tag's jobs read Spark's status store, which its listener fills later, so it
    # could miss that job. A block lost after this fails the read. Classic: the storing job is
    # the stored RDD's count (``eager=True`` does the same, but a failure of it left the blocks
    # stored so far with no RDD to free them by); over Connect, eager.
    stored = planned.localCheckpoint(eager=not classic, storageLevel=_stored_level())
    jrdd = _stored_rdd(stored)
    try:
        if jrdd is not None:
            jrdd.count()
        # SQL text, whole rows: each Column function or column list is more calls to the JVM.
        rows = stored.where(f"{END_COLUMN} IS NOT NULL").collect()
    except BaseException:
        _unpersist_quietly(jrdd)
        raise
    ends = {e.lease_key: e for e in (RangeEnd.from_json(row[END_COLUMN]) for row in rows)}
    return stored, jrdd, ends


def _unpersist_quietly(jrdd: Any) -> None:
    if jrdd is not None:
        with contextlib.suppress(Exception):
            _unpersist(jrdd)


@functools.cache
def _output_type() -> Any:
    """``OUTPUT_DDL`` as PySpark's type, made in Python: given as text, every read job would
    have the JVM parse it (three calls to the JVM)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(OUTPUT_SCHEMA)


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
