"""The fast GetRecords decode gives exactly what botocore's parse gives, falls back by itself, and
never touches error responses. Pure tests use botocore's own parser and a boto3 client whose HTTP
send is answered by a ``before-send`` handler; one integration test reads LocalStack through real
aiobotocore and boto3 clients with and without the hook."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.awsrequest import AWSResponse
from botocore.parsers import create_parser
from dateutil.tz import tzlocal

from kclpy_spark.processor import Record
from kclpy_spark.retrieval import fastdecode, page_decode
from kclpy_spark.retrieval.fastdecode import (
    FastDecodeStatus,
    compare_parses,
    decode_response,
    install_fast_getrecords,
    record_from_parsed,
    records_from_response,
)
from kclpy_spark.retrieval.polling import record_from_api

SEQ = "49590338271490256608559692538361571095921575989136588898"


def _client(service: str = "kinesis") -> Any:
    return boto3.session.Session().client(
        service, region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b"
    )


def _response(body: bytes, status: int = 200) -> dict[str, Any]:
    return {
        "status_code": status,
        "headers": {"content-type": "application/x-amz-json-1.1", "x-amzn-requestid": "r"},
        "body": body,
        "context": {"operation_name": "GetRecords"},
    }


def _entry(data: bytes, ts: float | int, i: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "SequenceNumber": f"{SEQ[:-4]}{i:04d}",
        "ApproximateArrivalTimestamp": ts,
        "Data": base64.b64encode(data).decode("ascii"),
        "PartitionKey": f"pk-{i}",
        **extra,
    }


def _body(records: list[dict[str, Any]], **rest: Any) -> bytes:
    fields = {"NextShardIterator": "AAAA", "MillisBehindLatest": 0, **rest}
    return json.dumps({"Records": records, **fields}).encode()


def _both(body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(botocore's parse, the fast path's parse) of one GetRecords body."""
    operation = _client().meta.service_model.operation_model("GetRecords")
    parser = create_parser("json")
    standard = parser.parse(_response(body), operation.output_shape)
    fast_response = _response(body)
    customized: dict[str, Any] = {}
    assert decode_response(fast_response, customized)
    fast = parser.parse(fast_response, operation.output_shape)
    fast.update(customized)
    return standard, fast


BODIES = {
    "binary, not UTF-8": _body([_entry(bytes(range(256)), 1_700_000_000.5, 1)]),
    "empty data": _body([_entry(b"", 1_700_000_000.25, 1)]),
    "1 MiB of data": _body([_entry(random.Random(1).randbytes(1 << 20), 1_732_000_000.001)]),
    "sub-millisecond times": _body(
        [_entry(b"x", t, i) for i, t in enumerate([1.7e9 + 0.0004999, 1.7e9 + 0.9995, 1.7e9])]
    ),
    "integer time": _body([_entry(b"x", 1_700_000_000)]),
    "encryption fields": _body(
        [_entry(b"secret", 1.7e9, 1, EncryptionType="KMS"), _entry(b"p", 1.7e9, 2)]
    ),
    "no records, caught up": _body([], MillisBehindLatest=0),
    "closed shard with children": json.dumps(
        {
            "Records": [_entry(b"last", 1.7e9)],
            "MillisBehindLatest": 0,
            "ChildShards": [
                {
                    "ShardId": "shardId-000000000002",
                    "ParentShards": ["shardId-000000000000"],
                    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
                }
            ],
        }
    ).encode(),
    "many records": _body(
        [_entry(f"r{i}".encode(), 1.7e9 + i * 0.0001234, i) for i in range(2000)],
        MillisBehindLatest=86_400_000,
    ),
}


@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_fast_parse_equals_botocore_parse(body: bytes) -> None:
    standard, fast = _both(body)
    assert compare_parses(standard, fast) is None
    expected = [record_from_api(r) for r in standard["Records"]]
    assert list(fast["Records"]) == expected
    for mine, theirs in zip(fast["Records"], expected, strict=True):
        assert (mine.binary_data, mine.timestamp_millis, mine.data) == (
            theirs.binary_data,
            theirs.timestamp_millis,
            theirs.data,
        )
    assert {k: v for k, v in fast.items() if k != "Records"} == {
        k: v for k, v in standard.items() if k != "Records"
    }


def test_msgspec_decodes_the_data_as_it_parses() -> None:
    assert page_decode.DECODER == "msgspec"
    _, fast = _both(BODIES["binary, not UTF-8"])
    record = fast["Records"][0]
    assert record.binary_data == bytes(range(256))


def test_a_body_msgspec_refuses_goes_to_botocore_alone() -> None:
    # Base64 with a line break (botocore accepts it) or not base64 at all: that body is
    # botocore's to parse, and the fast path stays on for the next one.
    for data in ("aGVs\nbG8=", "not base64!"):
        entry = {"Data": data, "PartitionKey": "k", "SequenceNumber": SEQ}
        body = json.dumps({"Records": [entry], "NextShardIterator": "it"}).encode()
        assert page_decode.decode_page(body) is None
    client = _client()
    entry = {"Data": "aGVs\nbG8=", "PartitionKey": "k", "SequenceNumber": SEQ,
             "ApproximateArrivalTimestamp": 1.7e9}  # fmt: skip
    _answer(client, json.dumps({"Records": [entry], "NextShardIterator": "it"}).encode())
    status = install_fast_getrecords(client)
    resp = client.get_records(ShardIterator="it")
    assert records_from_response(resp, status)[0].binary_data == b"hello"
    assert status.active and status.fallbacks == 0 and status.fast_calls == 0


def test_a_success_without_records_is_left_to_botocore() -> None:
    assert page_decode.decode_page(b'{"NextShardIterator":"it","MillisBehindLatest":0}') is None


def test_arrival_millis_matches_botocores_datetimes() -> None:
    rng = random.Random(42)
    values: list[float] = [
        0.0,
        1.0,
        1_700_000_000,
        1.7e9 + 0.0005,
        1.7e9 + 0.0015,
        1.7e9 + 0.9999995,
    ]
    values += [rng.uniform(1e9, 2e9) for _ in range(20_000)]
    values += [round(rng.uniform(1e9, 2e9), 3) for _ in range(20_000)]  # what Kinesis sends
    values += [round(rng.uniform(1e9, 2e9), 6) + 5e-7 for _ in range(5_000)]  # half-microseconds
    for value in values:
        for tz in (UTC, tzlocal()):
            expected = int(datetime.fromtimestamp(value, tz).timestamp() * 1000)
            assert page_decode.arrival_millis(value) == expected, value
    assert page_decode.arrival_millis(None) == 0


def test_record_from_parsed_is_polling_record_from_api() -> None:
    entry = {
        "SequenceNumber": SEQ,
        "PartitionKey": "k",
        "Data": b"\xff",
        "ApproximateArrivalTimestamp": datetime.fromtimestamp(1.7e9 + 0.1236, tzlocal()),
    }
    assert record_from_parsed(entry) == record_from_api(entry)
    no_time = {k: v for k, v in entry.items() if k != "ApproximateArrivalTimestamp"}
    assert record_from_parsed(no_time).timestamp_millis == 0


def test_error_bodies_are_untouched() -> None:
    body = json.dumps({"__type": "ExpiredIteratorException", "message": "old", "Records": []})
    for status in (300, 400, 500):
        response = _response(body.encode(), status)
        customized: dict[str, Any] = {}
        assert not decode_response(response, customized)
        assert response["body"] == body.encode()
        assert customized == {}


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'{"NextShardIterator": "x"}'])
def test_non_record_bodies_are_left_to_botocore(body: bytes) -> None:
    response = _response(body)
    customized: dict[str, Any] = {}
    assert not decode_response(response, customized)
    assert response["body"] == body and customized == {}


# --- through a real boto3 client, its HTTP send answered by a before-send handler ---------------


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _answer(client: Any, body: bytes, status: int = 200) -> None:
    def send(request: Any, **_: Any) -> AWSResponse:
        headers = {"content-type": "application/x-amz-json-1.1", "x-amzn-requestid": "r"}
        return AWSResponse(request.url, status, headers, _Raw(body))

    client.meta.events.register("before-send.kinesis.GetRecords", send)


@pytest.fixture(autouse=True)
def _fast_decode_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fastdecode.ENV_SWITCH, raising=False)


def test_client_hook_gives_botocores_records() -> None:
    body = BODIES["encryption fields"]
    plain, fast = _client(), _client()
    _answer(plain, body)
    _answer(fast, body)
    status = install_fast_getrecords(fast)
    assert status.active and status.reason == ""
    expected = plain.get_records(ShardIterator="it")
    got = fast.get_records(ShardIterator="it")
    assert status.events == 1 and status.fast_calls == 1
    assert records_from_response(got, status) == records_from_response(expected)
    assert records_from_response(expected) == [record_from_api(r) for r in expected["Records"]]
    assert got["NextShardIterator"] == expected["NextShardIterator"]
    assert got["MillisBehindLatest"] == expected["MillisBehindLatest"]
    assert install_fast_getrecords(fast) is status  # installing twice changes nothing


def test_client_error_response_is_botocores() -> None:
    body = json.dumps({"__type": "ExpiredIteratorException", "message": "Iterator expired"})
    client = _client()
    _answer(client, body.encode(), 400)
    status = install_fast_getrecords(client)
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.get_records(ShardIterator="it")
    assert caught.value.response["Error"]["Code"] == "ExpiredIteratorException"
    assert status.active and status.fast_calls == 0 and status.fallbacks == 0


def test_forced_mismatch_falls_back_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(page_decode, "arrival_millis", lambda value: 0)
    client = _client()
    _answer(client, BODIES["many records"])
    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        status = install_fast_getrecords(client)
    assert not status.active and status.fallbacks == 1
    assert "timestamp_millis differs" in status.reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    resp = client.get_records(ShardIterator="it")
    assert status.events == 0  # not registered: botocore parsed it
    assert records_from_response(resp, status) == [record_from_api(r) for r in resp["Records"]]
    assert status.fallbacks == 1


def test_unknown_record_member_keeps_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    known = {k: v for k, v in fastdecode.KNOWN_RECORD_MEMBERS.items() if k != "EncryptionType"}
    monkeypatch.setattr(fastdecode, "KNOWN_RECORD_MEMBERS", known)
    status = install_fast_getrecords(_client())
    assert not status.active and "EncryptionType" in status.reason


def test_unknown_getrecords_member_keeps_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    # msgspec keeps only the members it knows: one more in the model would be dropped.
    monkeypatch.setattr(fastdecode, "OTHER_MEMBERS", ("NextShardIterator", "MillisBehindLatest"))
    status = install_fast_getrecords(_client())
    assert not status.active and "ChildShards" in status.reason


def test_a_body_of_another_shape_is_botocores_alone(caplog: pytest.LogCaptureFixture) -> None:
    # botocore accepts a timestamp given as a string; the fast path does not, and steps aside
    # for that body only.
    body = _body([_entry(b"x", 1.7e9, 1), {**_entry(b"y", 1.7e9, 2), "ApproximateArrivalTimestamp":
                                           "1700000000.5"}])  # fmt: skip
    plain, client = _client(), _client()
    _answer(plain, body)
    _answer(client, body)
    status = install_fast_getrecords(client)
    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        resp = client.get_records(ShardIterator="it")
        again = client.get_records(ShardIterator="it")
    assert status.active and status.fallbacks == 0 and status.events == 2
    assert status.fast_calls == 0 and not caplog.records
    expected = [record_from_api(r) for r in plain.get_records(ShardIterator="it")["Records"]]
    assert records_from_response(resp, status) == expected
    assert records_from_response(again, status) == expected


def test_a_decode_that_raises_turns_the_fast_path_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client()
    _answer(client, BODIES["many records"])
    status = install_fast_getrecords(client)

    def broken(body: bytes) -> None:
        raise ValueError("broken decode")

    monkeypatch.setattr(fastdecode, "decode_page", broken)
    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        resp = client.get_records(ShardIterator="it")
    assert not status.active and status.fallbacks == 1 and "broken decode" in status.reason
    assert len(caplog.records) == 1
    assert records_from_response(resp, status) == [record_from_api(r) for r in resp["Records"]]


def test_event_that_never_fires_is_noticed(caplog: pytest.LogCaptureFixture) -> None:
    client = _client()
    _answer(client, BODIES["binary, not UTF-8"])
    status = install_fast_getrecords(client)
    # An SDK that no longer emits the event: what the handler would never see.
    client.meta.events.unregister(fastdecode._EVENT, unique_id=fastdecode._UNIQUE_ID)
    resp = client.get_records(ShardIterator="it")
    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        records = records_from_response(resp, status)
    assert records == [record_from_api(r) for r in resp["Records"]]
    assert not status.active and status.fallbacks == 1 and "did not emit" in status.reason
    assert len(caplog.records) == 1


def test_scoped_to_kinesis() -> None:
    streams = _client("dynamodbstreams")
    status = install_fast_getrecords(streams)
    assert not status.active and "not a Kinesis client" in status.reason
    kinesis = _client()
    install_fast_getrecords(kinesis)
    hooked = [
        name
        for name in ("before-parse.kinesis.GetRecords", "before-parse.kinesis.ListShards")
        if any(
            getattr(h, "__self__", None).__class__ is FastDecodeStatus
            for h in kinesis.meta.events._emitter._handlers.prefix_search(name)
        )
    ]
    assert hooked == ["before-parse.kinesis.GetRecords"]


def test_a_fake_client_gets_an_inactive_status(caplog: pytest.LogCaptureFixture) -> None:
    class FakeKinesis:
        async def get_records(self, **_: Any) -> dict[str, Any]:
            return {"Records": []}

    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        status = install_fast_getrecords(FakeKinesis())
    assert not status.active and status.fallbacks == 0 and not caplog.records
    entry = {"Data": b"x", "PartitionKey": "k", "SequenceNumber": SEQ}
    assert records_from_response({"Records": [entry]}, status) == [Record(b"x", "k", SEQ)]


def test_environment_switch_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(fastdecode.ENV_SWITCH, "0")
    client = _client()
    _answer(client, BODIES["binary, not UTF-8"])
    with caplog.at_level(logging.WARNING, logger=fastdecode.__name__):
        status = install_fast_getrecords(client)
        resp = client.get_records(ShardIterator="it")
        records = records_from_response(resp, status)
    assert not status.active and status.fallbacks == 0 and not caplog.records
    assert records == [Record(bytes(range(256)), "pk-1", f"{SEQ[:-4]}0001", 0, 1_700_000_000_500)]


# --- a real endpoint -----------------------------------------------------------------------------


def _read_all_sync(client: Any, stream: str, shard: str) -> dict[str, Any]:
    it = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )
    resp: dict[str, Any] = client.get_records(ShardIterator=it["ShardIterator"], Limit=1000)
    return resp


def test_localstack_getrecords_through_the_hook_equals_without(
    aws_client_kwargs: dict[str, Any], unique_name: str
) -> None:
    from aiobotocore.session import get_session

    payloads = [bytes(range(256)), b"\xff\xfe" * 20_000, b"\x00", b"text"]
    payloads += [f"r{i}".encode() for i in range(50)]
    admin = boto3.session.Session().client("kinesis", **aws_client_kwargs)
    admin.create_stream(StreamName=unique_name, ShardCount=1)
    admin.get_waiter("stream_exists").wait(StreamName=unique_name, WaiterConfig={"Delay": 0.5})
    admin.put_records(
        StreamName=unique_name,
        Records=[{"Data": p, "PartitionKey": str(i)} for i, p in enumerate(payloads)],
    )
    shard = admin.list_shards(StreamName=unique_name)["Shards"][0]["ShardId"]
    expected = _read_all_sync(admin, unique_name, shard)
    want = [record_from_api(r) for r in expected["Records"]]
    assert [r.binary_data for r in want] == payloads

    async def read_async() -> tuple[FastDecodeStatus, dict[str, Any]]:
        async with get_session().create_client("kinesis", **aws_client_kwargs) as fast:
            status = install_fast_getrecords(fast)
            assert status.active, status.reason
            it = await fast.get_shard_iterator(
                StreamName=unique_name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            )
            resp: dict[str, Any] = await fast.get_records(
                ShardIterator=it["ShardIterator"], Limit=1000
            )
            with pytest.raises(botocore.exceptions.ClientError) as caught:
                await fast.get_records(ShardIterator="not-an-iterator")
            assert caught.value.response["Error"]["Code"] == _error_code(admin)
            return status, resp

    status, got = asyncio.run(read_async())
    sync = boto3.session.Session().client("kinesis", **aws_client_kwargs)
    sync_status = install_fast_getrecords(sync)
    got_sync = _read_all_sync(sync, unique_name, shard)
    for stat, resp in ((status, got), (sync_status, got_sync)):
        assert stat.fast_calls == 1 and stat.fallbacks == 0
        assert records_from_response(resp, stat) == want
        assert resp["MillisBehindLatest"] == expected["MillisBehindLatest"]
        assert resp["NextShardIterator"] and set(resp) == set(expected)
    admin.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)


def _error_code(client: Any) -> str:
    """The error botocore reports, without the hook, for a malformed iterator."""
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        client.get_records(ShardIterator="not-an-iterator")
    return str(caught.value.response["Error"]["Code"])


def test_the_size_of_a_page_with_a_lone_surrogate_in_a_key_is_counted() -> None:
    """botocore parses a key holding a lone surrogate (an emulator stores one) into a str that
    does not encode as UTF-8: counting the page's bytes raised, and every read of the page
    failed (the shard stopped for good)."""
    assert fastdecode.page_bytes([Record(b"abc", "k\ud800", "1")]) == 3 + 4
