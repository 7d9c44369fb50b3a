"""A self-checking fast decode of Kinesis GetRecords responses, inside the AWS SDK.

botocore spends ~15 us per record parsing a GetRecords response, two thirds of it turning each
``ApproximateArrivalTimestamp`` into a datetime; decoding the same JSON ourselves
(``page_decode.py``: msgspec, data decoded in C) costs ~1 us. botocore emits
``before-parse.kinesis.GetRecords`` after the HTTP response arrives and before it parses it, and
merges ``customized_response_dict`` into what it parsed. The handler installed here takes
``Records`` out of the JSON body, builds ``Record`` objects from them, hands them over in
``customized_response_dict``, and leaves the small rest of the body (NextShardIterator,
MillisBehindLatest, ChildShards) to botocore. Signing, credentials, endpoints, retries and error
mapping all stay in the SDK; error responses (HTTP status >= 300) are never touched.

The event and its arguments are not documented (botocore's own S3 and sso-oidc handlers use them,
since botocore 1.35.16 / aiobotocore 2.15.0), so the decode checks itself:

* at install: the client is Kinesis with the JSON protocol, the model's Record shape and
  GetRecords' output have no member we do not know, and a synthetic body built from the model
  parses to the same values through botocore's own parser and through the fast path;
* on the first response: the event fired (``records_from_response`` notices it did not);
* on every response: a body that cannot be decoded is left to botocore.

Any failure turns the fast path off for that client: botocore parses as usual, one WARNING is
logged, and ``FastDecodeStatus.fallbacks`` counts it. ``KCLPY_SPARK_FAST_DECODE=0`` in the
environment turns it off from the start (for benchmarks and comparisons).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kclpy_spark.processor import Record
from kclpy_spark.retrieval.page_decode import (
    DECODER,
    OTHER_MEMBERS,
    FastRecords,
    decode_page,
)

log = logging.getLogger(__name__)

ENV_SWITCH = "KCLPY_SPARK_FAST_DECODE"
_EVENT = "before-parse.kinesis.GetRecords"
_UNIQUE_ID = "kclpy-spark-fast-getrecords"

# The Record members this decode understands, with their model types. Record keeps neither
# EncryptionType nor anything new: a member outside this set means the API changed, so the decode
# stays off until someone has looked (botocore's parse keeps working meanwhile).
KNOWN_RECORD_MEMBERS: Mapping[str, str] = {
    "SequenceNumber": "string",
    "ApproximateArrivalTimestamp": "timestamp",
    "Data": "blob",
    "PartitionKey": "string",
    "EncryptionType": "string",
}


def record_from_parsed(entry: Mapping[str, Any]) -> Record:
    """A Record from botocore's parsed GetRecords entry (the semantics of
    ``polling.record_from_api``)."""
    arrival = entry.get("ApproximateArrivalTimestamp")
    millis = int(arrival.timestamp() * 1000) if arrival is not None else 0
    return Record(entry["Data"], entry["PartitionKey"], entry["SequenceNumber"], 0, millis)


def page_bytes(records: list[Record]) -> int:
    """The bytes of a GetRecords page's records as a shard's read limit counts them, about: data
    (decoded; the fast path counts base64 padding as data, at most 2 bytes a record over) and
    partition keys (UTF-8)."""
    if isinstance(records, FastRecords):
        return records.data_bytes
    # surrogatepass: a key with a lone surrogate (an emulator stores one; botocore parses it)
    # failed every read of its page, the shard stopped for good.
    return sum(
        len(r.binary_data) + len(r.partition_key.encode("utf-8", "surrogatepass")) for r in records
    )


def _looks_like_json_object(body: bytes) -> bool:
    # Only the first bytes: stripping a multi-megabyte body would copy it.
    return body[:64].lstrip()[:1] == b"{"


def decode_response(response_dict: dict[str, Any], customized: dict[str, Any]) -> bool:
    """The fast path on one HTTP response: if it is a success with a JSON body holding
    ``Records``, move them, decoded, into ``customized`` and replace the body with the rest.
    Returns whether it did. Raises whatever decoding raised; the body is then unchanged."""
    status = response_dict.get("status_code")
    body = response_dict.get("body")
    if not isinstance(status, int) or status >= 300:
        return False
    if not isinstance(body, bytes | bytearray) or not _looks_like_json_object(bytes(body[:64])):
        return False
    page = decode_page(bytes(body))
    if page is None:
        return False
    records, rest = page
    response_dict["body"] = rest
    customized["Records"] = records
    return True


@dataclass
class FastDecodeStatus:
    """Whether the fast decode is on for one client, and what it did. Runtime state, mutable."""

    active: bool
    reason: str = ""
    decoder: str = DECODER
    fallbacks: int = 0
    # Responses the handler saw, and those it decoded itself.
    events: int = 0
    fast_calls: int = 0
    _events: Any = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def fall_back(self, reason: str) -> None:
        """Turn the fast path off for good: botocore parses every later response."""
        with self._lock:
            if not self.active:
                return
            self.active = False
            self.reason = reason
            self.fallbacks += 1
        log.warning("fast GetRecords decode is off, botocore parses instead: %s", reason)
        if self._events is not None:
            self._events.unregister(_EVENT, unique_id=_UNIQUE_ID)

    def handle(self, response_dict: dict[str, Any], customized_response_dict: dict[str, Any],
               **_: Any) -> None:  # fmt: skip
        """The before-parse handler."""
        self.events += 1
        if not self.active:
            return
        try:
            done = decode_response(response_dict, customized_response_dict)
        except Exception as exc:  # anything: botocore then parses the untouched body
            customized_response_dict.pop("Records", None)
            self.fall_back(f"a GetRecords body could not be decoded: {exc!r}")
            return
        if done:
            self.fast_calls += 1


# One status per client: installing twice returns the first (botocore would ignore a second
# registration under the same unique id, leaving the second status blind).
_INSTALLED: weakref.WeakKeyDictionary[Any, FastDecodeStatus] = weakref.WeakKeyDictionary()
_INSTALL_LOCK = threading.Lock()


def install_fast_getrecords(client: Any) -> FastDecodeStatus:
    """Register the fast decode on a boto3 or aiobotocore Kinesis client, after checking it
    against botocore's own parse. Never raises for a check that fails: the returned status is
    then inactive with the reason, logged once at WARNING (not when switched off by
    ``KCLPY_SPARK_FAST_DECODE=0``, nor for an object that is no botocore client, such as a test
    fake, which gets an inactive status silently)."""
    with _INSTALL_LOCK:
        try:
            existing = _INSTALLED.get(client)
        except TypeError:  # not weak-referenceable: no botocore client
            existing = None
        if existing is not None:
            return existing
        meta = getattr(client, "meta", None)
        events = getattr(meta, "events", None)
        model = getattr(meta, "service_model", None)
        if os.environ.get(ENV_SWITCH, "1").strip().lower() in {"0", "false", "no", "off"}:
            status = FastDecodeStatus(active=False, reason=f"{ENV_SWITCH}=0")
        elif events is None or model is None:
            return FastDecodeStatus(active=False, reason="not a botocore client")
        else:
            status = FastDecodeStatus(active=True, _events=events)
            try:
                problem = self_check(model)
            except Exception as exc:
                problem = f"the self-check raised {exc!r}"
            if problem is None:
                events.register(_EVENT, status.handle, unique_id=_UNIQUE_ID)
            else:
                status._events = None
                status.fall_back(problem)
        with contextlib.suppress(TypeError):
            _INSTALLED[client] = status
        return status


def records_from_response(
    resp: Mapping[str, Any], status: FastDecodeStatus | None = None
) -> list[Record]:
    """The records of a GetRecords response: the fast path's if it decoded them, else converted
    from botocore's parsed entries. With ``status``, a response that the installed handler never
    saw (the event did not fire) turns the fast path off and is counted as a fallback."""
    records = resp.get("Records")
    if isinstance(records, FastRecords):
        return records
    if status is not None and status.active and status.events == 0:
        status.fall_back(f"botocore did not emit {_EVENT}")
    return [record_from_parsed(r) for r in records or ()]


# --- the self-check ------------------------------------------------------------------------------

_SYNTHETIC_DATA = (
    b"",
    b"plain text",
    bytes(range(256)),  # every byte value, most of them not UTF-8
    b"\xff\xfe\x00\x80" * 2048,  # 8 KiB of non-UTF-8
)
# Sub-millisecond fractions, including ones that sit on rounding edges of the conversion.
_SYNTHETIC_TIMES = (1_700_000_000, 1_700_000_000.123, 1_732_199_999.9995, 1_000_000_000.0004999)


def synthetic_body(model_members: Mapping[str, str]) -> bytes:
    """A GetRecords JSON body with records covering each member the model's Record shape has
    (``model_members``: name -> type), binary and large data, sub-millisecond times, ChildShards."""
    records = []
    for i, data in enumerate(_SYNTHETIC_DATA):
        entry: dict[str, Any] = {}
        for name, kind in model_members.items():
            if name == "Data":
                entry[name] = base64.b64encode(data).decode("ascii")
            elif name == "ApproximateArrivalTimestamp":
                entry[name] = _SYNTHETIC_TIMES[i % len(_SYNTHETIC_TIMES)]
            elif name == "SequenceNumber":
                entry[name] = f"4959033827149025660855969253836157109592157598913658{i:04d}"
            elif name == "PartitionKey":
                entry[name] = f"pk-\u00e9-{i}"
            elif name == "EncryptionType":
                if i % 2:
                    entry[name] = "KMS"
            elif kind == "string":
                entry[name] = f"value-{i}"
        records.append(entry)
    body = {
        "Records": records,
        "NextShardIterator": "AAAAAAAAAAF" + "x" * 200,
        "MillisBehindLatest": 1234,
        "ChildShards": [
            {
                "ShardId": "shardId-000000000004",
                "ParentShards": ["shardId-000000000001"],
                "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "170141183460"},
            }
        ],
    }
    return json.dumps(body).encode("utf-8")


def _response(body: bytes) -> dict[str, Any]:
    return {
        "status_code": 200,
        "headers": {"content-type": "application/x-amz-json-1.1", "x-amzn-requestid": "check"},
        "body": body,
        "context": {"operation_name": "GetRecords"},
    }


def compare_parses(standard: Mapping[str, Any], fast: Mapping[str, Any]) -> str | None:
    """None if a response botocore parsed (``standard``) and one the fast path handled (``fast``)
    give the same records and the same other fields; else the first difference."""
    expected = [record_from_parsed(r) for r in standard.get("Records") or ()]
    got = fast.get("Records")
    if not isinstance(got, FastRecords):
        return "the fast path did not decode the records"
    if len(got) != len(expected):
        return f"{len(got)} records decoded, botocore parsed {len(expected)}"
    for i, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        for name in (
            "sequence_number",
            "sub_sequence_number",
            "partition_key",
            "binary_data",
            "timestamp_millis",
            "data",
        ):
            if getattr(mine, name) != getattr(theirs, name):
                return f"record {i}: {name} differs"
    rest_standard = {k: v for k, v in standard.items() if k != "Records"}
    rest_fast = {k: v for k, v in fast.items() if k != "Records"}
    if rest_standard != rest_fast:
        return f"other fields differ: {sorted(set(rest_standard) ^ set(rest_fast)) or 'values'}"
    return None


def self_check(service_model: Any) -> str | None:
    """None if the fast path matches botocore's own parse for this service model, else why not."""
    from botocore.parsers import create_parser

    if service_model.service_id.hyphenize() != "kinesis":
        return f"not a Kinesis client ({service_model.service_id})"
    protocol = getattr(service_model, "resolved_protocol", None) or service_model.protocol
    if protocol != "json":
        return f"GetRecords uses the {protocol!r} protocol, not JSON"
    operation = service_model.operation_model("GetRecords")
    record_shape = operation.output_shape.members["Records"].member
    members = {name: shape.type_name for name, shape in record_shape.members.items()}
    unknown = {n: t for n, t in members.items() if KNOWN_RECORD_MEMBERS.get(n) != t}
    if unknown:
        return f"the Record shape has members this decode does not know: {unknown}"
    others = set(operation.output_shape.members) - {"Records", *OTHER_MEMBERS}
    if others:
        return f"GetRecords answers members this decode does not know: {sorted(others)}"
    body = synthetic_body(members)
    parser = create_parser(protocol)
    standard = parser.parse(_response(body), operation.output_shape)
    fast_response = _response(body)
    customized: dict[str, Any] = {}
    if not decode_response(fast_response, customized):
        return "the fast path declined a synthetic GetRecords body"
    fast = parser.parse(fast_response, operation.output_shape)
    fast.update(customized)
    return compare_parses(standard, fast)
