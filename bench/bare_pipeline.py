"""The bare overlapped pipeline of ``bench_pipeline.py``, the baseline the issue names: no leases,
no checkpoints, no batching rules. One thread drains every shard with aiobotocore (GetRecords,
10,000 records a call, the SDK's own parsing; within a shard's read limits as the consumer keeps
them: a call at most every 0.2 s from the last one's start, and after a page of B bytes none
for B / 2 MiB seconds from its response, a refused call retried after 0.2 s) into Arrow record
batches; another takes ``--batch`` rows at a time and writes them with
``spark.createDataFrame(arrow)`` + Parquet append (the SparkSession made as the sink makes it).
Spark starts before the clock. Prints one JSON line: the seconds from the first GetRecords to
the last write, and the wall time, rows written and writes made at the two ends of ``--window``
(the bench's warm window).

    python bench/bare_pipeline.py --endpoint http://127.0.0.1:PORT --stream s --records N --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import sys
import threading
import time
from typing import Any

import pyarrow as pa

READ_RATE = 2 * 1024 * 1024  # Kinesis's read limit per shard, bytes a second

SCHEMA = pa.schema(
    [
        ("shard_id", pa.string()),
        ("sequence_number", pa.string()),
        ("partition_key", pa.string()),
        ("approximate_arrival_timestamp", pa.timestamp("ms", tz="UTC")),
        ("data", pa.binary()),
    ]
)


def to_arrow(shard: str, records: list[dict[str, Any]]) -> pa.RecordBatch:
    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([shard] * n, pa.string()),
            pa.array([r["SequenceNumber"] for r in records], pa.string()),
            pa.array([r["PartitionKey"] for r in records], pa.string()),
            pa.array([r["ApproximateArrivalTimestamp"] for r in records], SCHEMA.field(3).type),
            pa.array([r["Data"] for r in records], pa.binary()),
        ],
        schema=SCHEMA,
    )


async def drain(endpoint: str, stream: str, total: int, out: queue.Queue[Any]) -> None:
    from aiobotocore.session import get_session
    from botocore.exceptions import ClientError

    session = get_session()
    async with session.create_client(
        "kinesis",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as client:
        shards = (await client.list_shards(StreamName=stream))["Shards"]
        left = [total]

        async def one(shard: str) -> None:
            it = (
                await client.get_shard_iterator(
                    StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
                )
            )["ShardIterator"]
            while left[0] > 0 and it:
                started = time.monotonic()
                try:
                    response = await client.get_records(ShardIterator=it, Limit=10_000)
                except ClientError as exc:
                    if exc.response["Error"]["Code"] != "ProvisionedThroughputExceededException":
                        raise
                    await asyncio.sleep(0.2)
                    continue
                returned = time.monotonic()
                it = response.get("NextShardIterator")
                records = response["Records"]
                if records:
                    left[0] -= len(records)
                    out.put(to_arrow(shard, records))
                    size = sum(len(r["Data"]) + len(r["PartitionKey"].encode()) for r in records)
                    now = time.monotonic()
                    await asyncio.sleep(
                        max(0.2 - (now - started), size / READ_RATE - (now - returned))
                    )
                else:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(one(s["ShardId"]) for s in shards))
    out.put(None)


def write_all(
    spark: Any, batches: queue.Queue[Any], rows: int, path: str, marks: dict[float, list[Any]]
) -> int:
    """Write batches of ``rows`` until the reader's end mark; each of ``marks`` (rows) gets
    the wall time, the rows written and the writes made when that many were first written."""
    pending: list[pa.RecordBatch] = []
    size = written = writes = 0
    while True:
        item = batches.get()
        if item is not None:
            pending.append(item)
            size += item.num_rows
        if pending and (size >= rows or item is None):
            spark.createDataFrame(pa.Table.from_batches(pending)).write.mode("append").parquet(path)
            written += size
            writes += 1
            pending, size = [], 0
            for mark, seen in marks.items():
                if not seen and written >= mark:
                    seen.extend((time.time(), written, writes))
        if item is None:
            return written


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--target", default="local[2]")
    parser.add_argument("--window", default="0.3,0.7", help="FROM,TO as shares of --records")
    args = parser.parse_args()
    from kclpy_spark.spark.session import SparkSessionHolder

    holder = SparkSessionHolder(args.target)  # the sink's Spark settings: same ground
    spark = holder.session()
    spark.range(1).collect()  # the JVM warm before the clock
    batches: queue.Queue[Any] = queue.Queue(maxsize=64)
    began, began_at = time.perf_counter(), time.time()
    reader = threading.Thread(
        target=lambda: asyncio.run(drain(args.endpoint, args.stream, args.records, batches))
    )
    reader.start()
    low, high = (float(x) * args.records for x in args.window.split(","))
    marks: dict[float, list[Any]] = {low: [], high: []}
    written = write_all(spark, batches, args.batch, args.out, marks)
    reader.join()
    steady, ended_at = time.perf_counter() - began, time.time()
    holder.stop()
    summary = {"steady_s": steady, "began": began_at, "ended": ended_at, "rows": written}
    print(json.dumps({**summary, "opened": marks[low], "closed": marks[high]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
