"""The MultiLang JSON-lines messages, checked against amazon_kclpy's own decoder and writer."""

from __future__ import annotations

import io
import json
from types import ModuleType
from typing import Any

import pytest

from kclpy_spark.multilang import protocol
from kclpy_spark.multilang.protocol import (
    CheckpointRequest,
    StatusMessage,
    StrayLine,
    decode_child_line,
)
from kclpy_spark.processor import Record

SEQ1 = "49590338271490256608559692538361571095921575989136588801"
SEQ2 = "49590338271490256608559692538361571095921575989136588802"
RECORDS = [
    Record(b"hello", "pk-1", SEQ1, 0, 1_700_000_000_123),
    Record(bytes(range(256)), "cl\u00e9-2", SEQ2, 7, 1_700_000_001_456),
]


def kclpy_decode(amazon_kclpy: ModuleType, message: dict[str, Any]) -> Any:
    """Decode one of our lines exactly as amazon_kclpy's KCLProcess does."""
    from amazon_kclpy import dispatch

    line = protocol.encode(message).decode("ascii")
    return json.loads(line, object_hook=dispatch.message_decode)


# --- daemon -> child, read by amazon_kclpy -------------------------------------------------------


def test_encode_is_one_compact_ascii_line() -> None:
    line = protocol.encode(protocol.process_records_message(RECORDS, 0))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"action":"processRecords","records":[{"data":')
    line.decode("ascii")


def test_initialize_as_amazon_kclpy_reads_it(amazon_kclpy: ModuleType) -> None:
    from amazon_kclpy import messages

    decoded = kclpy_decode(
        amazon_kclpy, protocol.initialize_message("shardId-000000000001", SEQ1, 3)
    )
    assert isinstance(decoded, messages.InitializeInput)
    assert (decoded.shard_id, decoded.sequence_number, decoded.sub_sequence_number) == (
        "shardId-000000000001",
        SEQ1,
        3,
    )
    assert decoded.action == "initialize"
    sentinel = kclpy_decode(amazon_kclpy, protocol.initialize_message("s", "TRIM_HORIZON", 0))
    assert sentinel.sequence_number == "TRIM_HORIZON"


@pytest.mark.parametrize("lag", [0, 1234, None])
def test_the_fast_process_records_line_equals_the_message(lag: int | None) -> None:
    line = protocol.encode_process_records(RECORDS, lag)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == protocol.process_records_message(RECORDS, lag)
    assert line == protocol.encode(protocol.process_records_message(RECORDS, lag))


def test_process_records_as_amazon_kclpy_reads_it(amazon_kclpy: ModuleType) -> None:
    from amazon_kclpy import dispatch, messages

    line = protocol.encode_process_records(RECORDS, 1234).decode("ascii")  # the bytes on the wire
    decoded = json.loads(line, object_hook=dispatch.message_decode)
    assert isinstance(decoded, messages.ProcessRecordsInput)
    assert decoded.millis_behind_latest == 1234
    assert all(isinstance(r, messages.Record) for r in decoded.records)
    for theirs, ours in zip(decoded.records, RECORDS, strict=True):
        assert theirs.binary_data == ours.binary_data
        assert theirs.data == ours.data
        assert theirs.partition_key == ours.partition_key
        assert theirs.sequence_number == ours.sequence_number
        assert theirs.sub_sequence_number == ours.sub_sequence_number
        assert theirs.timestamp_millis == ours.timestamp_millis
        assert theirs.approximate_arrival_timestamp == ours.approximate_arrival_timestamp
        for key in ("data", "partitionKey", "sequenceNumber", "subSequenceNumber",
                    "approximateArrivalTimestamp", "action"):  # fmt: skip
            assert theirs[key] == ours[key], key


@pytest.mark.parametrize(
    ("message", "class_name", "action"),
    [
        (protocol.lease_lost_message(), "LeaseLostInput", "leaseLost"),
        (protocol.shard_ended_message(), "ShardEndedInput", "shardEnded"),
        (protocol.shutdown_requested_message(), "ShutdownRequestedInput", "shutdownRequested"),
    ],
)
def test_lifecycle_messages_as_amazon_kclpy_reads_them(
    amazon_kclpy: ModuleType, message: dict[str, Any], class_name: str, action: str
) -> None:
    from amazon_kclpy import messages

    decoded = kclpy_decode(amazon_kclpy, message)
    assert type(decoded) is getattr(messages, class_name)
    assert decoded.action == action


@pytest.mark.parametrize("error", [None, "ShutdownException", "ThrottlingException"])
def test_checkpoint_replies_as_amazon_kclpy_reads_them(
    amazon_kclpy: ModuleType, error: str | None
) -> None:
    from amazon_kclpy import messages

    decoded = kclpy_decode(amazon_kclpy, protocol.checkpoint_reply(SEQ1, 2, error))
    assert isinstance(decoded, messages.CheckpointInput)
    assert (decoded.sequence_number, decoded.sub_sequence_number, decoded.error) == (
        SEQ1,
        2,
        error,
    )


def test_record_json_round_trips_through_our_record() -> None:
    for record in RECORDS:
        assert Record.from_json(protocol.record_json(record)) == record


# --- a whole dialogue with amazon_kclpy's KCLProcess ---------------------------------------------


class _Recorder:
    version = 3

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.errors: list[str | None] = []

    def initialize(self, initialize_input: Any) -> None:
        self.calls.append(("initialize", initialize_input.shard_id))

    def _checkpoint(self, checkpointer: Any, seq: str | None, sub: int | None) -> None:
        from amazon_kclpy import kcl

        try:
            checkpointer.checkpoint(seq, sub)
            self.errors.append(None)
        except kcl.CheckpointError as exc:
            self.errors.append(exc.value)

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        self.calls.append(("process_records", [r.binary_data for r in records]))
        print("debug output on stdout, as the kclpy sample app does")
        self._checkpoint(process_records_input.checkpointer, records[-1].sequence_number, 7)
        self._checkpoint(process_records_input.checkpointer, None, None)

    def lease_lost(self, lease_lost_input: Any) -> None:
        self.calls.append(("lease_lost", None))

    def shard_ended(self, shard_ended_input: Any) -> None:
        self.calls.append(("shard_ended", None))
        self._checkpoint(shard_ended_input.checkpointer, None, None)

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        raise RuntimeError("boom: amazon-kclpy reports the call done anyway")


def test_a_dialogue_with_amazon_kclpys_kclprocess(
    amazon_kclpy: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    from amazon_kclpy import kcl

    incoming = [
        protocol.initialize_message("shardId-000000000004", "TRIM_HORIZON", 0),
        protocol.process_records_message(RECORDS, 0),
        protocol.checkpoint_reply(SEQ2, 7, "ThrottlingException"),
        protocol.checkpoint_reply(None, None, None),
        protocol.shard_ended_message(),
        protocol.checkpoint_reply(None, None, None),
        protocol.shutdown_requested_message(),
        protocol.lease_lost_message(),
    ]
    stdin = io.StringIO(b"".join(protocol.encode(m) for m in incoming).decode())
    stdout, stderr = io.StringIO(), io.StringIO()
    recorder = _Recorder()
    # print() in the processor goes to sys.stdout: the same stream, as in a real child.
    kcl.KCLProcess(recorder, input_file=stdin, output_file=stdout, error_file=stderr).run()
    out = capsys.readouterr().out
    decoded = [decode_child_line(line) for line in (stdout.getvalue() + out).split("\n")]
    messages = [m for m in decoded if isinstance(m, StatusMessage | CheckpointRequest)]
    assert messages == [
        StatusMessage("initialize"),
        CheckpointRequest(SEQ2, 7),
        CheckpointRequest(None, None),
        StatusMessage("processRecords"),
        CheckpointRequest(None, None),
        StatusMessage("shardEnded"),
        StatusMessage("shutdownRequested"),
        StatusMessage("leaseLost"),
    ]
    assert recorder.errors == ["ThrottlingException", None, None]
    assert recorder.calls == [
        ("initialize", "shardId-000000000004"),
        ("process_records", [b"hello", bytes(range(256))]),
        ("shard_ended", None),
        ("lease_lost", None),
    ]
    assert any(isinstance(m, StrayLine) and "debug output" in m.text for m in decoded)
    assert "boom" in stderr.getvalue()


def test_an_unexpected_reply_to_a_checkpoint_is_invalid_state(amazon_kclpy: ModuleType) -> None:
    """amazon_kclpy's rule: anything but a checkpoint answer -> CheckpointError(InvalidState)."""
    from amazon_kclpy import kcl

    stdin = io.StringIO(protocol.encode(protocol.lease_lost_message()).decode())
    checkpointer = kcl.Checkpointer(kcl._IOHandler(stdin, io.StringIO(), io.StringIO()))
    with pytest.raises(kcl.CheckpointError) as info:
        checkpointer.checkpoint(SEQ1)
    assert info.value.value == "InvalidStateException"


# --- child -> daemon -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", None),
        ("   \r\n", None),
        ("\n", None),
        ('{"action":"status","responseFor":"initialize"}\n', StatusMessage("initialize")),
        (b'{"action": "status", "responseFor": "leaseLost"}\r\n', StatusMessage("leaseLost")),
        ('{"action":"status"}', StatusMessage(None)),
        ('{"action":"checkpoint","sequenceNumber":"123","subSequenceNumber":4}',
         CheckpointRequest("123", 4)),
        ('{"action":"checkpoint","sequenceNumber":null,"subSequenceNumber":null}',
         CheckpointRequest(None, None)),
        ('{"action":"checkpoint"}', CheckpointRequest(None, None)),
        # Coerced as Jackson coerces scalars; what cannot be is left for the checkpointer.
        ('{"action":"checkpoint","sequenceNumber":123,"subSequenceNumber":"4"}',
         CheckpointRequest("123", 4)),
        ('{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":2.0}',
         CheckpointRequest("1", 2)),
        ('{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":"x"}',
         CheckpointRequest("1", "x")),
        # A digit to str.isdigit(), not to int(): left as it is (the checkpointer refuses it).
        ('{"action":"checkpoint","sequenceNumber":"1","subSequenceNumber":"\u00b2"}',
         CheckpointRequest("1", "\u00b2")),
        ("[" * 100_000, StrayLine("[" * 100_000, "not JSON")),  # nested past the parser's stack
        ("Processing 3 records", StrayLine("Processing 3 records", "not JSON")),
        ("{broken", StrayLine("{broken", "not JSON")),
        ("[1, 2]", StrayLine("[1, 2]", "not a JSON object")),
        ("42", StrayLine("42", "not a JSON object")),
        ('{"level":"info"}', StrayLine('{"level":"info"}', "no action")),
        ('{"action":"initialize"}',
         StrayLine('{"action":"initialize"}', "unexpected action 'initialize' from the child")),
    ],
)  # fmt: skip
def test_decode_child_lines(line: str | bytes, expected: object) -> None:
    assert decode_child_line(line) == expected


def test_non_utf8_bytes_are_a_stray_line_not_a_crash() -> None:
    decoded = decode_child_line(b"\xff\xfe log line\n")
    assert isinstance(decoded, StrayLine) and decoded.reason == "not JSON"
