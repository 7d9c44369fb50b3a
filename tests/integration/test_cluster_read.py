"""Ranges read on Spark executors (``spark/cluster_read.py``) from a real LocalStack stream with a
real local SparkSession: budgets, the next range, a pinned range read again by a new job giving
exactly the same records while the shard grew, a pin that no longer matches refused, a shard end
with its children, the stored rows of reads no one holds freed, a read job hung on a silent
endpoint cancelled at its deadline."""

from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any

import pytest
from jvm_calls import jvm_calls

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.cluster_read import RangeRead, StoredReads, _output_type, read_ranges
from kclpy_spark.spark.range_tasks import OUTPUT_DDL, AwsTarget
from kclpy_spark.spark.ranges import RangeEnd, ReadRange, next_range

REGION = "us-east-1"
SHARD0 = "shardId-000000000000"
TRIM = ExtendedSequenceNumber("TRIM_HORIZON")


def make_stream(kinesis: Any, name: str, shards: int = 1) -> None:
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(
        StreamName=name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )


def put(kinesis: Any, name: str, first: int, count: int) -> list[str]:
    seqs = []
    for i in range(first, first + count):
        answer = kinesis.put_record(StreamName=name, Data=f"r{i}".encode(), PartitionKey=f"k{i}")
        seqs.append(answer["SequenceNumber"])
    return seqs


def rng(name: str, shard: str = SHARD0, **kw: Any) -> ReadRange:
    return ReadRange(
        lease_key=shard,
        stream=name,
        stream_arg={"StreamName": name},
        shard_id=shard,
        after=kw.pop("after", TRIM),
        max_seconds=kw.pop("max_seconds", 20.0),
        **kw,
    )


def rows_of(read: RangeRead) -> list[tuple[str, str, int, bytes]]:
    got = read.records.collect()
    return sorted(
        (r["shard_id"], r["sequence_number"], r["sub_sequence_number"], bytes(r["data"]))
        for r in got
    )


@pytest.fixture
def aws(localstack_endpoint: str) -> AwsTarget:
    return AwsTarget(REGION, localstack_endpoint)


def test_a_range_stops_at_its_budget_and_the_next_one_goes_on_from_its_end(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name)
    seqs = put(kinesis_client, unique_name, 0, 50)
    first = rng(unique_name, max_records=30)
    read = read_ranges(spark, [first], aws, description="test: first range")
    end = read.ends[SHARD0]
    assert sorted(r[3] for r in rows_of(read)) == sorted(f"r{i}".encode() for i in range(30))
    assert (end.rows, end.first, end.last) == (
        30,
        ExtendedSequenceNumber(seqs[0]),
        ExtendedSequenceNumber(seqs[29]),
    )
    assert end.next_iterator and not end.shard_ended

    second = next_range(first, end)
    read = read_ranges(spark, [second], aws)
    end = read.ends[SHARD0]
    assert sorted(r[3] for r in rows_of(read)) == sorted(f"r{i}".encode() for i in range(30, 50))
    assert end.rows == 20 and end.millis_behind_latest == 0  # at the tip: the read stopped


def test_a_pinned_range_read_again_gives_the_same_records_though_the_shard_grew(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name, shards=2)
    put(kinesis_client, unique_name, 0, 40)
    ranges = [rng(unique_name, f"shardId-00000000000{i}") for i in (0, 1)]
    read = read_ranges(spark, ranges, aws)
    before = rows_of(read)
    assert len(before) == 40
    put(kinesis_client, unique_name, 40, 40)  # more arrives before the re-read

    pinned = [dataclasses.replace(r, pinned=read.ends[r.lease_key].pin) for r in ranges]
    again = read_ranges(spark, pinned, aws)  # a new job: every task reads Kinesis again
    assert rows_of(again) == before
    assert {k: e.pin for k, e in again.ends.items()} == {k: e.pin for k, e in read.ends.items()}

    unpinned = read_ranges(spark, ranges, aws)  # what the pin kept out
    assert len(rows_of(unpinned)) == 80


def test_a_pin_the_shard_no_longer_matches_fails_that_range_only(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name)
    put(kinesis_client, unique_name, 0, 10)
    first = rng(unique_name)
    end = read_ranges(spark, [first], aws).ends[SHARD0]
    wrong = dataclasses.replace(end.pin, rows=end.rows + 1)
    read = read_ranges(spark, [dataclasses.replace(first, pinned=wrong)], aws)
    failed = read.ends[SHARD0]
    assert failed.error is not None and "read again gave" in failed.error
    assert "RangeMismatchError" in failed.error and read.records.count() == 0


def test_a_range_that_reaches_the_shard_end_says_so_with_its_children(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name)
    put(kinesis_client, unique_name, 0, 5)
    kinesis_client.update_shard_count(
        StreamName=unique_name, TargetShardCount=2, ScalingType="UNIFORM_SCALING"
    )
    kinesis_client.get_waiter("stream_exists").wait(
        StreamName=unique_name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )
    end: RangeEnd | None = None
    current = rng(unique_name)
    got = 0
    for _ in range(10):  # LocalStack may answer a few pages before the end
        read = read_ranges(spark, [current], aws)
        end = read.ends[SHARD0]
        got += len(rows_of(read))
        if end.shard_ended:
            break
        current = next_range(current, end)
    assert end is not None and end.shard_ended and end.next_iterator is None
    assert got == 5 and len(end.child_shards) == 2
    assert all(SHARD0 in c["ParentShards"] for c in end.child_shards)


def test_the_stored_rows_of_a_read_are_freed_once_no_one_holds_it(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name)
    put(kinesis_client, unique_name, 0, 20)
    stored = StoredReads()

    def cached() -> set[int]:
        return {i.id() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()}

    def settles(expected: set[int], since: set[int]) -> bool:  # unpersist is asynchronous
        deadline = time.monotonic() + 20
        while cached() - since != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        return cached() - since == expected

    before = cached()
    keep = read_ranges(spark, [rng(unique_name)], aws, stored_reads=stored)
    kept = cached() - before
    assert len(kept) == 1  # the one job that collected the ends stored the rows
    (info,) = [i for i in spark.sparkContext._jsc.sc().getRDDStorageInfo() if i.id() in kept]
    level = info.storageLevel()  # serialized buffers, not a Java object a row (GC, BENCHMARKS.md)
    assert not level.deserialized() and level.useMemory() and level.useDisk()
    for _ in range(3):
        read_ranges(spark, [rng(unique_name)], aws, stored_reads=stored)  # dropped at once
    gc.collect()
    assert stored.release() == 3 and stored.kept == 1
    assert settles(kept, before)
    assert len(rows_of(keep)) == 20  # the held read's rows are still there
    del keep
    gc.collect()
    assert stored.release() == 1 and stored.kept == 0
    assert settles(set(), before)


def test_a_read_job_hung_on_a_silent_endpoint_is_cancelled_at_its_deadline(spark: Any) -> None:
    """An endpoint that accepts connections and never answers: each task would wait its read's
    budget plus a minute; the read job is cancelled at its own deadline instead, and its range
    fails (the lease's consumer counts the failure)."""
    import socket
    import threading

    from checkpoint.base.clock import ManualClock
    from kclpy_spark.spark.executor_reads import ExecutorReads, LeaseSource, ReadSettings
    from kclpy_spark.spark.lane import Lane
    from kclpy_spark.spark.lane_feed import LanesFeed
    from kclpy_spark.spark.session import SparkSessionHolder

    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.extend(silent.accept() for _ in range(8)),
                     daemon=True).start()  # fmt: skip
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"

    class Checkpointer:
        lease_key = SHARD0
        pending_checkpoint = None

        largest_permitted = TRIM

        def set_largest_permitted(self, position: Any) -> None:
            return None

    lane = Lane(SHARD0, SHARD0, Checkpointer())  # type: ignore[arg-type]
    feed = LanesFeed(threading.Condition(), {SHARD0: lane}, ManualClock(), lambda: False)
    reads = ExecutorReads(
        lambda: spark,
        AwsTarget(REGION, endpoint),
        ReadSettings(max_seconds=1.0, job_grace=4.0),
        jobs=SparkSessionHolder.adopt(spark),
    )
    reads.start(feed, threaded=False)
    posted: list[Any] = []
    reads.register(LeaseSource(SHARD0, "s", {"StreamName": "s"}, SHARD0, TRIM), posted.append)
    try:
        assert reads.read_round() == 1
    finally:
        reads.close()
        silent.close()
    # A task that gave up on its own would end its range with an error and the job would
    # succeed; only a cancelled job raises after the deadline.
    assert len(posted) == 1 and "ran over 5 s and was cancelled" in str(posted[0])
    assert spark.range(3).count() == 3  # the session goes on


def test_a_python_worker_that_read_keeps_its_heap_out_of_the_per_task_collection(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    """PySpark runs gc.collect() after every task in a reused worker; with the SDK loaded that
    cost more than the read, unless the worker froze its heap after its first read."""

    def freeze_counts(batches: Any) -> Any:  # pickled by value (this module is not on workers)
        import gc

        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()] * batch.num_rows})

    make_stream(kinesis_client, unique_name)
    put(kinesis_client, unique_name, 0, 3)
    read_ranges(spark, [rng(unique_name)], aws)
    counts = spark.range(0, 4, 1, 4).mapInArrow(freeze_counts, "frozen long").collect()
    assert max(r["frozen"] for r in counts) > 10_000  # the SDK's objects, among others


def test_one_task_reads_several_ranges_side_by_side_each_failing_alone(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    make_stream(kinesis_client, unique_name, shards=3)
    put(kinesis_client, unique_name, 0, 30)
    shards = [f"shardId-00000000000{i}" for i in range(3)]
    apart = read_ranges(spark, [rng(unique_name, s) for s in shards], aws, partitions=3)
    third = apart.ends[shards[2]]
    bad = dataclasses.replace(third.pin, rows=third.rows + 1)  # a pin its records do not match
    ranges = [rng(unique_name, s) for s in shards[:2]]
    ranges.append(dataclasses.replace(rng(unique_name, shards[2]), pinned=bad))
    together = read_ranges(spark, ranges, aws, partitions=1)  # one task, three ranges
    assert sum(e.rows for e in apart.ends.values()) == 30
    assert [together.ends[s].rows for s in shards[:2]] == [apart.ends[s].rows for s in shards[:2]]
    by_shard = {s: [r for r in rows_of(together) if r[0] == s] for s in shards}
    assert by_shard[shards[0]] == [r for r in rows_of(apart) if r[0] == shards[0]]
    assert together.ends[shards[2]].error is not None and by_shard[shards[2]] == []


def test_a_read_jobs_calls_to_the_jvm_do_not_grow_with_its_ranges(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget
) -> None:
    """Each call to the driver's JVM costs its Python tens of microseconds, every read round:
    the read's type is given made (not as text for the JVM to parse) and the records' two extra
    columns are dropped by their user in one call (63 calls a read before)."""
    make_stream(kinesis_client, unique_name, shards=3)
    put(kinesis_client, unique_name, 0, 6)
    shards = [f"shardId-00000000000{i}" for i in range(3)]

    def calls(ranges: list[ReadRange]) -> tuple[int, RangeRead]:
        with jvm_calls(spark) as count:
            read = read_ranges(spark, ranges, aws)
        return count[0], read

    calls([rng(unique_name)])  # warm: PySpark looks some JVM classes up once
    one, _ = calls([rng(unique_name)])
    three, read = calls([rng(unique_name, s) for s in shards])
    assert sum(e.rows for e in read.ends.values()) == 6
    assert (
        read.records.columns
        == read.stored.columns[:-2]
        == spark.createDataFrame([], OUTPUT_DDL).columns[:-2]
    )
    assert one == three <= 58  # 54 here


def test_the_read_jobs_type_is_its_ddls(spark: Any) -> None:
    """``_output_type`` (made in Python) is the type the JVM parses ``OUTPUT_DDL`` into."""
    from pyspark.sql.types import _parse_datatype_string

    assert _output_type() == _parse_datatype_string(OUTPUT_DDL)


def test_a_round_cut_into_several_jobs_reads_every_range_and_frees_every_job(
    spark: Any, kinesis_client: Any, unique_name: str, aws: AwsTarget, monkeypatch: Any
) -> None:
    """A round over ``CLOSURE_BYTES`` of ranges runs a job per part (a function pickled past 1 MiB
    left a temporary file on the driver each round): one read all the same, freed whole."""
    from kclpy_spark.spark import cluster_read

    monkeypatch.setattr(cluster_read, "CLOSURE_BYTES", 1)  # a job per range
    make_stream(kinesis_client, unique_name, shards=3)
    put(kinesis_client, unique_name, 0, 30)
    shards = [f"shardId-00000000000{i}" for i in range(3)]
    stored = StoredReads()
    before = {i.id() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()}
    read = read_ranges(spark, [rng(unique_name, s) for s in shards], aws, stored_reads=stored)
    assert sorted(read.ends) == shards and sum(e.rows for e in read.ends.values()) == 30
    assert sorted(r[3] for r in rows_of(read)) == sorted(f"r{i}".encode() for i in range(30))
    assert stored.kept == 3
    jobs = {i.id() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo()} - before
    assert len(jobs) == 3
    del read
    gc.collect()
    assert stored.release() == 3 and stored.kept == 0
