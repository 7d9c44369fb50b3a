"""The sinks with real local Spark (the session fixture): every record exactly once in the Parquet
output although first attempts fail, no checkpoint past an unwritten record (checked after every
batch), replays after a crash skipped by the idempotent sinks, JSON decoding, dead letters."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_harness import LeaseEnv, make_records, written_numbers

from kclpy_spark.processor import Record
from kclpy_spark.spark.batch_life import Batch
from kclpy_spark.spark.micro_batcher import BatcherSettings, MicroBatcher
from kclpy_spark.spark.pieces import Piece, records_to_chunk
from kclpy_spark.spark.session import CLASSIC_DEFAULTS, SparkSessionHolder
from kclpy_spark.spark.sink_batch import FunctionSink, SinkBatch, SinkRoute, current_batch
from kclpy_spark.spark.sinks import DeadLetterDirectory, DeltaSink, ParquetSink

SHARDS = ("shardId-000000000000", "shardId-000000000001", "shardId-000000000002")


@pytest.fixture(scope="module")
def holder(spark: Any) -> SparkSessionHolder:
    return SparkSessionHolder.adopt(spark)


def test_a_batch_frame_is_arrow_the_tasks_convert_not_a_local_relation(
    holder: SparkSessionHolder, spark: Any
) -> None:
    """As the sessions the sink starts are set (``CLASSIC_DEFAULTS``, which the fixture's session
    copies): a batch's DataFrame scans its Arrow data in the tasks, the same rows; with Spark's
    own threshold it would be a local relation in the driver JVM."""
    records = make_records(1, 5)
    table = pa.Table.from_batches([records_to_chunk(records, "s", SHARDS[0]).batch])
    threshold = "spark.sql.execution.arrow.localRelationThreshold"
    assert spark.conf.get(threshold) == CLASSIC_DEFAULTS[threshold] == "0"
    df = holder.to_df(table)
    assert df._jdf.queryExecution().analyzed().getClass().getSimpleName() == "LogicalRDD"
    assert sorted(r.data for r in df.select("data").collect()) == [r.binary_data for r in records]
    pages = pa.Table.from_batches([records_to_chunk([r], "s", SHARDS[0]).batch for r in records])
    assert holder.to_df(pages).rdd.getNumPartitions() == 1  # not a task per page
    full = [records_to_chunk(make_records(1, 6_000), "s", s).batch for s in SHARDS[:2]]
    assert holder.to_df(pa.Table.from_batches(full)).rdd.getNumPartitions() == 2  # left as is
    spark.conf.set(threshold, "48MB")
    try:
        local = holder.to_df(table)._jdf.queryExecution().analyzed()
        assert local.getClass().getSimpleName() == "LocalRelation"
    finally:
        spark.conf.set(threshold, "0")


def check_after_each_batch(env: LeaseEnv, out: Path, log: list[str]) -> Any:
    """After every batch: no lease's checkpoint is beyond the records in the output, and every
    record up to the checkpoint is there."""

    def check(batch: Batch) -> None:
        for shard in SHARDS:
            got = set(written_numbers(out, shard))
            upto = env.checkpoint_number(shard)
            assert set(range(1, upto + 1)) <= got, f"{shard}: checkpoint {upto} passed a gap"
        log.append(batch.state.value)

    return check


def feed(env: LeaseEnv, batcher: MicroBatcher, total: int, sizes: Sequence[int]) -> None:
    """Deliver records 1..total to every shard in chunks of varying sizes, stepping the batcher."""
    at = {shard: 1 for shard in SHARDS}
    i = 0
    while any(n <= total for n in at.values()):
        for shard in SHARDS:
            count = min(sizes[i % len(sizes)], total - at[shard] + 1)
            i += 1
            if count > 0:
                env.deliver(batcher, shard, make_records(at[shard], count))
                at[shard] += count
        batcher.run_until_idle()


def test_a_user_function_failing_first_attempts_leaves_every_record_once(
    holder: SparkSessionHolder, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    seen: dict[int, int] = {}
    pieces_seen: list[tuple[Piece, ...]] = []

    def foreach_batch(df: Any, batch_id: int) -> None:  # plain Spark foreachBatch code
        seen[batch_id] = seen.get(batch_id, 0) + 1
        if seen[batch_id] == 1 and batch_id % 3 != 0:
            raise RuntimeError("first attempt fails")
        batch = current_batch()
        assert batch is not None and batch.batch_id == batch_id
        pieces_seen.append(batch.pieces)
        df.write.mode("append").parquet(str(out))

    env = LeaseEnv(SHARDS)
    log: list[str] = []
    batcher = MicroBatcher(
        FunctionSink(foreach_batch),
        BatcherSettings(max_records=250, max_wait=0.0, max_attempts=3, retry_base_delay=0.0),
        to_df=holder.to_df,
        interrupter=holder,
        threaded=False,
        sleep=lambda s: None,
        on_batch_done=check_after_each_batch(env, out, log),
    )
    for shard in SHARDS:
        env.take(batcher, shard)
    feed(env, batcher, 300, (70, 130, 40))
    assert log and set(log) == {"written"} and batcher.stats.failed_attempts > 0
    df = holder.session().read.parquet(str(out))
    rows = [(r.shard_id, int(r.sequence_number) // 1000) for r in df.collect()]
    assert sorted(rows) == sorted((s, n) for s in SHARDS for n in range(1, 301))
    assert all(env.checkpoint_number(s) == 300 for s in SHARDS)
    assert any(len(p) == 3 for p in pieces_seen)  # worker scope: batches span the leases


class CrashAfterWrite:
    """Writes through the real sink, then fails: a worker dying between write and checkpoint."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.crash = True

    def prepare(self, pieces: Sequence[Piece]) -> Mapping[str, Any]:
        result: Mapping[str, Any] = self.inner.prepare(pieces)
        return result

    def write(self, batch: SinkBatch) -> None:
        self.inner.write(batch)
        if self.crash:
            raise RuntimeError("killed after the write, before the checkpoint")


@pytest.mark.parametrize("kind", ["parquet", "delta"])
def test_a_batch_replayed_after_a_crash_is_not_duplicated(
    holder: SparkSessionHolder, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / kind
    inner = ParquetSink(path) if kind == "parquet" else DeltaSink(str(path))
    sink = CrashAfterWrite(inner)
    settings = BatcherSettings(max_records=1000, max_wait=0.0, max_attempts=1)
    env = LeaseEnv(SHARDS[:2])
    a = MicroBatcher(sink, settings, to_df=holder.to_df, threaded=False)
    for shard in SHARDS[:2]:
        env.take(a, shard)
        env.deliver(a, shard, make_records(1, 120))
    a.run_until_idle()  # written, then 'killed': nothing checkpointed, pending set
    assert all(env.checkpoint_number(s) == 0 for s in SHARDS[:2])
    # Another worker takes the leases and reads from the checkpoint, in other chunk sizes.
    sink.crash = False
    env.new_worker("worker-b")
    b = MicroBatcher(sink, settings, to_df=holder.to_df, threaded=False)
    for shard in SHARDS[:2]:
        env.take(b, shard)
        env.deliver(b, shard, make_records(1, 50))
        env.deliver(b, shard, make_records(51, 100))
    b.run_until_idle()
    if kind == "parquet":
        got = written_numbers(path)
    else:
        from deltalake import DeltaTable

        seqs = DeltaTable(str(path)).to_pyarrow_table().column("sequence_number").to_pylist()
        got = [int(s) // 1000 for s in seqs]
    assert sorted(got) == sorted(list(range(1, 151)) * 2)
    assert all(env.checkpoint_number(s) == 150 for s in SHARDS[:2])


def test_a_key_arrow_cannot_encode_is_written_and_checkpointed(
    holder: SparkSessionHolder, tmp_path: Path
) -> None:
    """A partition key with a lone surrogate (an emulator stores one) failed every write of its
    batch: Arrow refused the key, so the lease never moved on."""
    out = tmp_path / "out"
    env = LeaseEnv(SHARDS[:1])
    batcher = MicroBatcher(
        ParquetSink(out),
        BatcherSettings(max_records=10, max_wait=0.0),
        to_df=holder.to_df,
        threaded=False,
    )
    env.take(batcher, SHARDS[0])
    records = make_records(1, 3)
    records[1] = Record(records[1].binary_data, "odd-\udc80", records[1].sequence_number)
    env.deliver(batcher, SHARDS[0], records)
    batcher.run_until_idle()
    table = pq.read_table(out, columns=["sequence_number", "partition_key"]).sort_by(
        "sequence_number"
    )
    assert table.column("partition_key").to_pylist() == ["key-1", "odd-\ufffd", "key-3"]
    assert env.checkpoint_number(SHARDS[0]) == 3


# (data, (id, name) as parsed, whether the bytes are kept in unparsed_data)
JSON_CASES = [
    (b'{"id": 0, "name": "n0"}', (0, "n0"), False),
    (b' {"name": "n1", "id": 1, "extra": [1]}\n', (1, "n1"), False),
    (b'{"id": null, "name": null}', (None, None), False),  # explicit nulls fill the schema
    (b"not json", (None, None), True),
    (b"\xff\xfe{not utf-8", (None, None), True),
    # Spark fills nothing (its names are case-sensitive) and marks nothing corrupt: keep the bytes.
    (b'{"ID": 4, "NAME": "x"}', (None, None), True),
    (b'{"id": 5}', (5, None), True),  # a field missing
    (b'{"id": 6, "name": "x"} garbage', (6, "x"), True),  # Spark ignores the trailing text
    (b'{"id": 7, "name": "x"}{"id": 8}', (7, "x"), True),
    (b'{"id": 9, "name": "x"} ]', (9, "x"), True),
    (b'{"id": 10, "name": "x"}\n{"id": 11, "name": "y"}', (10, "x"), True),
    (b'{"id": "abc", "name": "x"}', (None, "x"), True),  # a wrong type: corrupt, as before
    (b"[1, 2]", (None, None), True),
    (b"", (None, None), True),
]


def test_json_values_are_decoded_into_the_user_schema(spark: Any, tmp_path: Path) -> None:
    holder = SparkSessionHolder.adopt(spark, value_schema="id BIGINT, name STRING")
    frames: list[Any] = []
    env = LeaseEnv(SHARDS[:1])
    batcher = MicroBatcher(
        FunctionSink(lambda df, batch_id: frames.append(df.collect())),
        BatcherSettings(max_records=len(JSON_CASES), max_wait=0.0),
        to_df=holder.to_df,
        threaded=False,
    )
    env.take(batcher, SHARDS[0])

    recs = [
        Record(data, r.partition_key, r.sequence_number)
        for (data, _, _), r in zip(JSON_CASES, make_records(1, len(JSON_CASES)), strict=True)
    ]
    env.deliver(batcher, SHARDS[0], recs)
    batcher.run_until_idle()
    [rows] = frames
    assert "data" not in rows[0].asDict() and rows[0]["shard_id"] == SHARDS[0]
    got = [((r["id"], r["name"]), r["unparsed_data"]) for r in rows]
    want = [(fields, bytearray(data) if kept else None) for data, fields, kept in JSON_CASES]
    assert got == want


def test_dead_lettered_batches_are_stored_and_acknowledged(
    holder: SparkSessionHolder, tmp_path: Path
) -> None:
    def always_fails(df: Any, batch_id: int) -> None:
        raise ValueError("bad data")

    env = LeaseEnv(SHARDS[:1])
    batcher = MicroBatcher(
        FunctionSink(always_fails),
        BatcherSettings(max_records=10, max_wait=0.0, max_attempts=2),
        to_df=holder.to_df,
        dead_letter=DeadLetterDirectory(tmp_path / "dlq"),
        threaded=False,
        sleep=lambda s: None,
    )
    env.take(batcher, SHARDS[0])
    env.deliver(batcher, SHARDS[0], make_records(1, 10))
    batcher.run_until_idle()
    [file] = sorted((tmp_path / "dlq").glob("*.parquet"))
    table = pq.read_table(file)
    assert table.num_rows == 10 and b"bad data" in table.schema.metadata[b"kclpy_spark.error"]
    assert env.checkpoint_number(SHARDS[0]) == 10


def test_a_write_over_its_timeout_has_its_spark_job_cancelled_and_is_retried(
    holder: SparkSessionHolder, tmp_path: Path
) -> None:
    calls: list[float] = []

    def slow_then_fine(df: Any, batch_id: int) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:  # hours of work: only the interruption can end it
            df.sparkSession.range(10**13).selectExpr("max(id % 7)").collect()
        df.write.mode("append").parquet(str(tmp_path / "out"))

    env = LeaseEnv(SHARDS[:1])
    batcher = MicroBatcher(
        FunctionSink(slow_then_fine),
        # The timeout bounds each attempt, the retry's too: room for a write on a loaded machine.
        BatcherSettings(max_records=5, max_wait=0.0, write_timeout=8.0, max_attempts=2),
        to_df=holder.to_df,
        interrupter=holder,
        threaded=False,
        sleep=lambda s: None,
    )
    env.take(batcher, SHARDS[0])
    env.deliver(batcher, SHARDS[0], make_records(1, 5))
    started = time.monotonic()
    batcher.run_until_idle()
    assert time.monotonic() - started < 60
    assert len(calls) == 2 and "WriteTimeoutError" in batcher.stats.last_error
    assert sorted(written_numbers(tmp_path / "out")) == [1, 2, 3, 4, 5]
    assert env.checkpoint_number(SHARDS[0]) == 5


def test_two_sinks_on_real_spark_each_get_every_record_and_the_checkpoint_waits_for_both(
    holder: SparkSessionHolder, tmp_path: Path
) -> None:
    """Parquet (idempotent per piece) and a foreachBatch function that fails first attempts:
    after every batch no checkpoint passes a record missing from either sink; at the end each
    sink has every record once and Parquet was not asked again for the function's retries.
    Then the function fails for good: Parquet has the rows, the checkpoint has not moved."""
    out, fn_out = tmp_path / "parquet", tmp_path / "function"
    seen: dict[int, int] = {}
    fail_all = [False]

    def foreach_batch(df: Any, batch_id: int) -> None:
        seen[batch_id] = seen.get(batch_id, 0) + 1
        if fail_all[0] or (seen[batch_id] == 1 and batch_id % 2 == 0):
            raise RuntimeError("the function's first attempt fails")
        df.write.mode("append").parquet(str(fn_out))

    parquet = ParquetSink(out)
    parquet_writes: list[int] = []
    original_write = parquet.write

    def counted_write(batch: SinkBatch) -> None:
        parquet_writes.append(batch.batch_id)
        original_write(batch)

    parquet.write = counted_write  # type: ignore[method-assign]
    env = LeaseEnv(SHARDS)
    log: list[str] = []
    both = check_after_each_batch(env, out, log)

    def check(batch: Batch) -> None:
        both(batch)
        for shard in SHARDS:  # the function's output too
            upto = env.checkpoint_number(shard)
            assert set(range(1, upto + 1)) <= set(written_numbers(fn_out, shard))

    routes = [
        SinkRoute("parquet", parquet, max_attempts=3, write_timeout=120.0),
        SinkRoute("fn", FunctionSink(foreach_batch), max_attempts=3, write_timeout=120.0),
    ]
    batcher = MicroBatcher(
        routes,
        BatcherSettings(max_records=250, max_wait=0.0, retry_base_delay=0.0),
        to_df=holder.to_df,
        interrupter=holder,
        threaded=False,
        sleep=lambda s: None,
        on_batch_done=check,
    )
    for shard in SHARDS:
        env.take(batcher, shard)
    feed(env, batcher, 200, (70, 130, 40))
    assert log and set(log) == {"written"} and batcher.stats.failed_attempts > 0
    assert len(parquet_writes) == len(set(parquet_writes))  # never asked again for a retry
    for folder in (out, fn_out):
        got = sorted(written_numbers(folder))
        assert got == sorted(list(range(1, 201)) * len(SHARDS)), folder
    assert all(env.checkpoint_number(s) == 200 for s in SHARDS)
    # The function now fails for good: the batch is parked although Parquet wrote it.
    fail_all[0] = True
    env.deliver(batcher, SHARDS[0], make_records(201, 10))
    batcher.run_until_idle()
    assert log[-1] == "parked" and env.checkpoint_number(SHARDS[0]) == 200
    assert 210 in written_numbers(out, SHARDS[0])
    batcher.close()


def test_the_shared_folder_probe_writes_as_the_sink_does_and_leaves_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """On a cluster of several machines a local path is each one's own disk: Spark's commit
    found nothing to move, the piece was published empty and its checkpoint moved. The probe
    writes one row a task the way the sink writes and counts the files this worker sees."""
    from checkpoint.base.errors import ConfigError
    from kclpy_spark.spark.executor_probe import probe_shared_folder, unshared

    shared = tmp_path / "out"
    shared.mkdir()
    probe_shared_folder(spark, shared, "config 'sink' parquet:out", tasks=2)  # one disk: fine
    assert list(shared.iterdir()) == []  # its files are gone
    assert unshared(2, 2, shared) is None
    problem = unshared(1, 2, shared)  # a task's file landed on another machine's disk
    assert problem is not None and "1 of 2" in problem and "shared mount" in problem
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="could not write") as err:
        probe_shared_folder(spark, tmp_path / "a-file", "config 'sink' parquet:a-file", tasks=1)
    assert "\n" not in str(err.value)
