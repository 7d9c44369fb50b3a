"""The processor API: amazon-kclpy v3's names and shapes, cheap records, sync and async methods."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import subprocess
import sys
from datetime import datetime

import pytest

import checkpoint.checkpointer
import kclpy_spark
from kclpy_spark import (
    CheckpointError,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    Record,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
    is_async,
)

SEQ = "49590338271490256608559692538361571095921575989136588898"
MILLIS = 1_700_000_123_456


class RecordingCheckpointer:
    """A fake checkpointer that remembers every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, int | None]] = []

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        self.calls.append((sequence_number, sub_sequence_number))


def make_record(data: bytes = b"hello") -> Record:
    return Record(data, "pk-1", SEQ, 3, MILLIS)


def test_record_fields_have_amazon_kclpys_names_and_types() -> None:
    record = make_record()
    assert record.binary_data == b"hello"
    assert record.data == base64.b64encode(b"hello").decode()
    assert record.partition_key == "pk-1"
    assert record.sequence_number == SEQ
    assert record.sub_sequence_number == 3
    assert record.timestamp_millis == MILLIS
    # amazon-kclpy: a naive datetime in local time, from datetime.fromtimestamp.
    assert record.approximate_arrival_timestamp == datetime.fromtimestamp(MILLIS / 1000.0)
    assert record.approximate_arrival_timestamp.tzinfo is None


def test_records_are_outside_the_cyclic_collectors_sight_and_equal_by_their_fields() -> None:
    """A worker keeps pages of records waiting per shard: the collector must not walk them."""
    import gc

    record = make_record()
    assert not gc.is_tracked(record)
    from_text = Record.from_base64(record.data, "pk-1", SEQ, 3, MILLIS)
    assert from_text.binary_data == b"hello"
    assert from_text == record and hash(from_text) == hash(record)
    assert Record(b"hello", "pk-1", SEQ, 3, MILLIS + 1) != record


def test_record_is_small_and_read_only() -> None:
    record = make_record()
    assert not hasattr(record, "__dict__")
    with pytest.raises(AttributeError):
        record.data = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        record.extra = 1  # type: ignore[attr-defined]


def test_record_dict_access_uses_amazon_kclpys_raw_json_keys() -> None:
    raw = {
        "action": "record",
        "data": base64.b64encode(b"\x00\x01payload").decode(),
        "partitionKey": "pk",
        "sequenceNumber": SEQ,
        "subSequenceNumber": 2,
        "approximateArrivalTimestamp": MILLIS,
    }
    record = Record.from_json(json.loads(json.dumps(raw)))
    for key, value in raw.items():
        assert record[key] == value
        assert record.get(key) == value
        assert key in record
    assert record.binary_data == b"\x00\x01payload"
    with pytest.raises(KeyError):
        record["nope"]
    with pytest.raises(KeyError):
        record.get("nope")  # as amazon-kclpy: get without a default raises
    assert record.get("nope", None) is None
    assert "nope" not in record


def test_record_repr_does_not_dump_the_payload() -> None:
    text = repr(make_record(b"x" * 10_000))
    assert SEQ in text and "10000 bytes" in text and len(text) < 300


def test_input_objects_have_amazon_kclpys_attribute_names() -> None:
    cp = RecordingCheckpointer()
    init = InitializeInput("shardId-000000000001", "TRIM_HORIZON", 0)
    assert (init.shard_id, init.sequence_number, init.sub_sequence_number) == (
        "shardId-000000000001",
        "TRIM_HORIZON",
        0,
    )
    batch = ProcessRecordsInput([make_record()], 1500, cp)
    assert (batch.records[0].data, batch.millis_behind_latest, batch.checkpointer) == (
        "aGVsbG8=",
        1500,
        cp,
    )
    assert ShardEndedInput(cp).checkpointer is cp
    assert ShutdownRequestedInput(cp).checkpointer is cp
    assert dataclasses.fields(LeaseLostInput()) == ()
    actions = [
        x.action
        for x in (init, batch, LeaseLostInput(), ShardEndedInput(cp), ShutdownRequestedInput(cp))
    ]
    assert actions == [
        "initialize",
        "processRecords",
        "leaseLost",
        "shardEnded",
        "shutdownRequested",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        init.shard_id = "other"  # type: ignore[misc]


class Collecting(RecordProcessor):
    def __init__(self) -> None:
        self.shard: str | None = None
        self.seen: list[bytes] = []

    def initialize(self, initialize_input: InitializeInput) -> None:
        self.shard = initialize_input.shard_id

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        self.seen += [r.binary_data for r in process_records_input.records]
        last = process_records_input.records[-1]
        process_records_input.checkpointer.checkpoint(
            last.sequence_number, last.sub_sequence_number
        )


class AsyncCollecting(RecordProcessor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    async def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        await asyncio.sleep(0)
        self.seen += [r.partition_key for r in process_records_input.records]

    async def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        shard_ended_input.checkpointer.checkpoint()


def test_a_subclass_works_and_the_defaults_are_safe() -> None:
    cp = RecordingCheckpointer()
    processor = Collecting()
    processor.initialize(InitializeInput("shard-1", None))
    processor.process_records(ProcessRecordsInput([make_record(b"a"), make_record(b"b")], 0, cp))
    assert (processor.shard, processor.seen, cp.calls) == ("shard-1", [b"a", b"b"], [(SEQ, 3)])
    cp.calls.clear()
    processor.lease_lost(LeaseLostInput())
    processor.shutdown_requested(ShutdownRequestedInput(cp))
    assert cp.calls == []  # no checkpoint of records a buffering processor has not written
    processor.shard_ended(ShardEndedInput(cp))
    assert cp.calls == [(None, None)]  # the SHARD_END checkpoint the KCL requires
    assert RecordProcessor.version == 3


def test_process_records_must_be_written() -> None:
    class Incomplete(RecordProcessor):
        pass

    with pytest.raises(TypeError, match="process_records"):
        Incomplete()  # type: ignore[abstract]


def test_async_methods_are_detected_and_work() -> None:
    cp = RecordingCheckpointer()
    sync, coro = Collecting(), AsyncCollecting()
    assert not is_async(sync.process_records) and not is_async(sync.shard_ended)
    assert is_async(coro.process_records) and is_async(coro.shard_ended)
    assert not is_async(coro.initialize)  # mixing is allowed: this one is inherited and plain
    assert is_async(functools.partial(coro.process_records))

    class Callable:
        async def __call__(self, x: object) -> None:
            return None

    assert is_async(Callable()) and not is_async(len)
    asyncio.run(coro.process_records(ProcessRecordsInput([make_record()], 0, cp)))
    asyncio.run(coro.shard_ended(ShardEndedInput(cp)))
    assert coro.seen == ["pk-1"] and cp.calls == [(None, None)]


def test_checkpoint_error_is_the_checkpointers_with_amazon_kclpys_value() -> None:
    assert CheckpointError is checkpoint.checkpointer.CheckpointError
    error = CheckpointError("ShutdownException")
    assert error.value == "ShutdownException"
    with pytest.raises(CheckpointError) as caught:
        raise error
    assert caught.value.value == "ShutdownException"


def test_package_exports() -> None:
    for name in kclpy_spark.__all__:
        assert getattr(kclpy_spark, name) is not None


def test_importing_the_package_pulls_in_no_heavy_dependency() -> None:
    heavy = ["pyspark", "py4j", "boto3", "botocore", "aiobotocore", "pandas", "pyarrow"]
    code = (
        "import sys, kclpy_spark, kclpy_spark.processor, checkpoint.leasing;"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout
    # -X importtime lists every module imported: none of the heavy ones may appear at all.
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not {m for m in imported if m.split(".")[0] in heavy}


def test_size_and_head_of_a_payload_given_as_base64() -> None:
    import base64
    import random

    rng = random.Random(7)
    for n in [*range(12), 100, 1000]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        record = Record.from_base64(base64.b64encode(data).decode(), "k", "1")
        assert record.data_size == n
        assert [record.head(k) for k in range(8)] == [data[:k] for k in range(8)]
        assert record.binary_data == data and record.data_size == n
