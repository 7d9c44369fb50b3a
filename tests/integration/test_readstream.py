"""#44: ``spark.readStream.format("kinesis-kcl")`` on LocalStack with a real local SparkSession.

- Trigger.AvailableNow twice in a row on a stream split and merged between and during runs:
  every record exactly once, each batch's records kept apart by ``batch_id``, children only in
  batches after their parents' last records.
- A batch Spark replays (its foreachBatch raised; the query restarted from its checkpoint)
  holds exactly the records its first attempt saw, though more records arrived in between.
- A processing-time query picks up records as they arrive.
- A bad option is one line at ``load()``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, wait_active

from kclpy_spark.readstream.data_source import KinesisKclDataSource

pytestmark = [pytest.mark.spark]


@pytest.fixture
def source(spark: Any, localstack_endpoint: str, tmp_path: Path) -> Any:
    spark.dataSource.register(KinesisKclDataSource)

    def reader(stream: str, **options: str) -> Any:
        r = (spark.readStream.format("kinesis-kcl").option("streamName", stream)
             .option("endpointUrl", localstack_endpoint).option("initialPosition", "TRIM_HORIZON")
             .option("pinLocation", str(tmp_path / "pins")))  # fmt: skip
        for key, value in options.items():
            r = r.option(key, value)
        return r.load()

    return reader


def _batches_to(folder: Path) -> Any:
    """A foreachBatch function keeping each batch's records in a file of its own (replaced when
    the batch comes again: idempotent by batch id)."""

    def write(df: Any, batch_id: int) -> None:
        rows = [
            {"n": int(r.data), "shard": r.shard_id} for r in df.select("data", "shard_id").collect()
        ]
        _write(folder / f"{batch_id:06d}.json", rows)

    folder.mkdir(parents=True, exist_ok=True)
    return write


def _write(path: Path, rows: Any) -> None:
    """Whole or not at all: the test reads these files while batches are written."""
    draft = path.with_suffix(".tmp")
    draft.write_text(json.dumps(rows))
    os.replace(draft, path)


def _read_batches(folder: Path) -> dict[int, list[dict[str, Any]]]:
    return {int(p.stem): json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _run_available_now(df: Any, out: Path, checkpoint: Path) -> None:
    query = (df.writeStream.foreachBatch(_batches_to(out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())  # fmt: skip
    assert query.awaitTermination(240), "the AvailableNow run did not end"
    assert query.exception() is None, query.exception()


def _split(kinesis: Any, stream: str) -> list[str]:
    shard = kinesis.list_shards(StreamName=stream)["Shards"][0]
    low, high = (
        int(shard["HashKeyRange"]["StartingHashKey"]),
        int(shard["HashKeyRange"]["EndingHashKey"]),
    )
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard["ShardId"],
                        NewStartingHashKey=str((low + high) // 2))  # fmt: skip
    wait_active(kinesis, stream)
    return [s["ShardId"] for s in kinesis.list_shards(StreamName=stream)["Shards"]
            if s.get("ParentShardId") == shard["ShardId"]]  # fmt: skip


def _parents_first(
    batches: dict[int, list[dict[str, Any]]], parent: str, children: list[str]
) -> None:
    last_parent = max(b for b, rows in batches.items() if any(r["shard"] == parent for r in rows))
    for b, rows in batches.items():
        if any(r["shard"] in children for r in rows):
            assert b > last_parent, (
                f"batch {b} read a child before its parent's end (batch {last_parent})"
            )


def test_available_now_twice_through_a_split_and_a_merge(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 60))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = source(unique_name, maxRecordsPerShard="25")  # several batches per run

    _run_available_now(df, out, checkpoint)
    first = _read_batches(out)
    assert sorted(r["n"] for rows in first.values() for r in rows) == list(range(60))

    parent = kinesis_client.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    children = _split(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(60, 120))  # into the two children
    kinesis_client.merge_shards(StreamName=unique_name, ShardToMerge=children[0],
                                AdjacentShardToMerge=children[1])  # fmt: skip
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(120, 150))  # into the merged child
    _run_available_now(df, out, checkpoint)

    batches = _read_batches(out)
    numbers = [r["n"] for rows in batches.values() for r in rows]
    assert sorted(numbers) == list(range(150)), "every record exactly once"
    _parents_first(batches, parent, children)
    merged = {r["shard"] for rows in batches.values() for r in rows} - {parent, *children}
    assert len(merged) == 1, merged
    _parents_first(batches, children[0], list(merged))
    _parents_first(batches, children[1], list(merged))


def test_a_replayed_batch_reads_what_its_first_attempt_read(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 15))  # fewer than a batch's budget
    seen, checkpoint = tmp_path / "seen", tmp_path / "checkpoint"
    seen.mkdir()

    def fail_once(df: Any, batch_id: int) -> None:
        rows = sorted(int(r.data) for r in df.select("data").collect())
        attempt = len(list(seen.glob(f"{batch_id:06d}-*.json")))
        _write(seen / f"{batch_id:06d}-{attempt}.json", rows)
        if batch_id == 0 and attempt == 0:
            raise RuntimeError("the sink failed (on purpose)")

    df = source(unique_name, maxRecordsPerShard="20")
    # Processing-time triggers: no AvailableNow bound, so only the pin keeps the replay to what
    # its first attempt read.
    query = (df.writeStream.foreachBatch(fail_once).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 second").start())  # fmt: skip
    with pytest.raises(Exception, match="on purpose"):  # the query stops; batch 0 uncommitted
        query.awaitTermination(240)
    produce(kinesis_client, unique_name, range(15, 45))  # more: an unpinned re-read takes them
    query = (df.writeStream.foreachBatch(fail_once).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="1 second").start())  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_numbers_after_first(seen)) < 45:
            assert query.exception() is None, query.exception()
            time.sleep(1)
    finally:
        query.stop()
    first = json.loads((seen / "000000-0.json").read_text())
    again = json.loads((seen / "000000-1.json").read_text())
    assert first == again == list(range(15)), "the replay read the pinned records"
    assert sorted(_numbers_after_first(seen)) == list(range(45))


def _numbers_after_first(seen: Path) -> list[int]:
    """What the batches that went through held (the failed first attempt left out)."""
    return [n for p in seen.glob("*.json") if p.name != "000000-0.json"
            for n in json.loads(p.read_text())]  # fmt: skip


def test_a_processing_time_query_follows_the_stream(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    out = tmp_path / "out"
    query = (source(unique_name).writeStream.foreachBatch(_batches_to(out))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="1 second").start())  # fmt: skip
    try:
        stop = threading.Event()

        def producing() -> None:
            for start in range(0, 100, 20):
                produce(kinesis_client, unique_name, range(start, start + 20))
                if stop.wait(0.5):
                    return

        producer = threading.Thread(target=producing)
        producer.start()
        producer.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            numbers = [r["n"] for rows in _read_batches(out).values() for r in rows]
            if len(numbers) >= 100:
                break
            assert query.exception() is None, query.exception()
            time.sleep(1)
        assert sorted(numbers) == list(range(100))
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"streamName": "s", "maxRecords": "5"},
         ["unknown option", "maxRecords", "maxRecordsPerShard"]),
        ({"streamName": "s", "initialPosition": "EARLIEST"}, ["initialPosition", "EARLIEST"]),
        ({"streamName": "s", "maxRecordsPerShard": "lots"}, ["maxRecordsPerShard", "whole number"]),
        ({}, ["streamName", "required"]),
    ],
)  # fmt: skip
def test_a_bad_option_is_one_line_at_load(
    spark: Any, options: dict[str, str], words: list[str]
) -> None:
    spark.dataSource.register(KinesisKclDataSource)
    reader = spark.readStream.format("kinesis-kcl")
    for key, value in options.items():
        reader = reader.option(key, value)
    with pytest.raises(Exception) as err:
        reader.load()
    text = str(err.value)
    line = next((x for x in text.splitlines() if "ConfigError: kinesis-kcl" in x), "")
    assert all(w in line for w in words), text[:2000]


def test_with_values_parses_json_as_the_daemons_sinks_do(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    from checkpoint.base.errors import ConfigError
    from kclpy_spark.spark.values import with_values

    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    payloads = [b'{"id": 1, "name": "a"}', b'{"id": 2}', b"not json", b'{"id": 3, "name": "c"}']
    for data in payloads:
        kinesis_client.put_record(StreamName=unique_name, Data=data, PartitionKey="k")
    df = with_values(source(unique_name), "id BIGINT, name STRING")
    assert df.columns == ["stream", "shard_id", "sequence_number", "sub_sequence_number",
                          "partition_key", "approximate_arrival_timestamp", "id", "name",
                          "unparsed_data"]  # fmt: skip
    rows: list[Any] = []
    query = (df.writeStream.foreachBatch(lambda batch, _: rows.extend(batch.collect()))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())  # fmt: skip
    assert query.awaitTermination(240) and query.exception() is None
    got = sorted((r.id, r.name, r.unparsed_data) for r in rows if r.unparsed_data is None)
    assert got == [(1, "a", None), (3, "c", None)]
    kept = sorted(bytes(r.unparsed_data) for r in rows if r.unparsed_data is not None)
    assert kept == [b"not json", b'{"id": 2}']  # not JSON, a missing field: bytes kept
    with pytest.raises(ConfigError, match="not a Spark DDL schema"):
        with_values(source(unique_name), "id BIGINTEGER,,")


def test_max_records_per_trigger_bounds_every_batch(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 100))
    out = tmp_path / "out"
    _run_available_now(source(unique_name, maxRecordsPerTrigger="30"), out,
                       tmp_path / "checkpoint")  # fmt: skip
    batches = _read_batches(out)
    assert sorted(r["n"] for rows in batches.values() for r in rows) == list(range(100))
    assert max(len(rows) for rows in batches.values()) <= 30
    assert len(batches) >= 4  # 100 records, at most 30 a batch
    # A per-shard budget below the trigger's share still holds (docs/spark.md).
    out = tmp_path / "out-per-shard"
    _run_available_now(source(unique_name, maxRecordsPerTrigger="30", maxRecordsPerShard="10"),
                       out, tmp_path / "checkpoint-per-shard")  # fmt: skip
    batches = _read_batches(out)
    assert sorted(r["n"] for rows in batches.values() for r in rows) == list(range(100))
    per_shard = Counter((batch, r["shard"]) for batch, rows in batches.items() for r in rows)
    assert max(per_shard.values()) <= 10 and len(batches) >= 5, per_shard


def test_trigger_once_reads_one_batch_per_run(
    source: Any, kinesis_client: Any, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(0, 50))
    _two_once_runs_read_two_batches(source(unique_name, maxRecordsPerShard="20"), tmp_path)


def _two_once_runs_read_two_batches(df: Any, tmp_path: Path) -> None:
    """Two Trigger.Once runs of ``df`` (a stream of 0..49, 20 records a shard a batch) on one
    Spark checkpoint: each wrote one batch, 0..19 then 20..39."""
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    for _ in range(2):
        query = (df.writeStream.foreachBatch(_batches_to(out))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(once=True).start())  # fmt: skip
        assert query.awaitTermination(240) and query.exception() is None
    batches = _read_batches(out)
    assert [sorted(r["n"] for r in rows) for rows in batches.values()] == [
        list(range(0, 20)), list(range(20, 40))
    ]  # fmt: skip
