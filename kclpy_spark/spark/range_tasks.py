"""What a read job's task runs on an executor (``read_on = "executors"``).

A task reads the ranges its partition names (``read_partition``, mapInArrow's function) with
``retrieval/range_reader.py`` and yields Arrow record batches of ``OUTPUT_SCHEMA``: the record
columns as Spark holds them, the lease each row belongs to, and, in one row a range, its
``RangeEnd`` as JSON. ``cluster_read.py`` plans the job on the driver; ``readstream`` reuses
``TaskReads`` in its own tasks.

One ``TaskReads`` per Python worker process keeps an event loop thread and up to
``MAX_CLIENTS`` Kinesis clients (by region and endpoint) across tasks. Credentials come from the
executor's own AWS chain: the driver sends a region and an endpoint, never a secret.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from kclpy_spark.spark.pieces import SCHEMA, records_to_chunk
from kclpy_spark.spark.ranges import RangeEnd, ReadRange

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


def waves(ranges: int, tasks: int) -> int:
    """How many rounds of ``READS_AT_ONCE`` reads side by side the busiest of ``tasks`` tasks
    makes over ``ranges`` ranges (the job's ranges are split evenly over its tasks)."""
    share = -(-ranges // max(1, tasks))
    return -(-share // READS_AT_ONCE)


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
    for rng, outcome in task_reads().reads(ranges, aws):
        if isinstance(outcome, BaseException):  # this range's failure, told to the driver
            paced = getattr(outcome, "next_call_at", None)  # with when the shard may be called
            failed = RangeEnd(rng.lease_key, None, None, 0, 0, error=one_line(outcome),
                              next_call_at=paced if isinstance(paced, float) else None)  # fmt: skip
            yield end_row(failed)
            continue
        chunks, end = outcome
        for chunk in chunks:
            yield as_output(chunk, rng.lease_key)
        yield end_row(end)


def one_line(exc: BaseException) -> str:
    """A failure as one line (its type and the first line of its message), in text that encodes
    as UTF-8: a lone surrogate (a partition key an emulator stored, quoted in a message) is
    written as its escape, or the range's end could not be sent back and the task would fail."""
    line = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def spark_columns(batch: pa.RecordBatch) -> list[pa.Array]:
    """A chunk's record columns with the arrival time as Spark holds it (microseconds)."""
    return [
        col.cast(OUTPUT_SCHEMA.field(i).type) if i == 5 else col
        for i, col in enumerate(batch.columns)
    ]


def as_output(batch: pa.RecordBatch, lease_key: str) -> pa.RecordBatch:
    columns = spark_columns(batch)
    columns.append(pa.repeat(pa.scalar(lease_key, pa.string()), batch.num_rows))
    columns.append(pa.nulls(batch.num_rows, pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)


def end_row(end: RangeEnd) -> pa.RecordBatch:
    columns = [pa.nulls(1, f.type) for f in OUTPUT_SCHEMA][:-1]
    columns.append(pa.array([end.to_json()], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)


Read = tuple[list[pa.RecordBatch], RangeEnd]  # one range's record batches and its end


class TaskReads:
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

        # A future given back is let go of, with its records (as_completed lets go too): they
        # were all kept until the last range ended, a task's memory every range's records.
        waiting = {asyncio.run_coroutine_threadsafe(one(r), self._loop): r for r in ranges}
        longest = max(r.max_seconds for r in ranges) + GRACE_SECONDS
        limit = max(r.delay for r in ranges) + waves(len(ranges), 1) * longest + GRACE_SECONDS
        try:
            for future in concurrent.futures.as_completed(list(waiting), timeout=limit):
                rng = waiting.pop(future)
                try:
                    outcome: Read | BaseException = future.result()
                except BaseException as exc:  # this range's failure, whatever it is
                    outcome = exc
                del future
                yield rng, outcome
                del outcome
        except concurrent.futures.TimeoutError as exc:
            for rng in waiting.values():
                yield rng, exc
        finally:
            for future in waiting:
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
            # No retries of the SDK's own: the reader's loop retries, paced and within the
            # range's time (four requests a call, 20 ms apart, to a throttled shard).
            config=botocore_config(max_pool_connections=16, attempts=1),
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


_READS: TaskReads | None = None
_READS_LOCK = threading.Lock()


def task_reads() -> TaskReads:
    """This Python worker's ``TaskReads`` (made by the first task that reads)."""
    global _READS
    with _READS_LOCK:
        if _READS is None:
            _READS = TaskReads()
        return _READS
