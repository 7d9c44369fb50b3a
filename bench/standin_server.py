"""A stand-in Kinesis endpoint that replays a captured GetRecords body at almost no CPU cost.

It isolates a consumer's own cost from an emulator's: kinesalite spends ~24 us of CPU per record
serving GetRecords, as much as the consumer under test, on the same two cores. This server answers
the four calls a polling consumer makes (JSON 1.1 over HTTP/1.1 keep-alive) with pre-encoded bytes:

* ``DescribeStreamSummary``: ACTIVE, ``--shards`` open shards;
* ``ListShards``: those shards, splitting the hash key space evenly;
* ``GetShardIterator``: ``<shard>:0``;
* ``GetRecords``: the captured body (``--body``, e.g. 10,000 records) with a fresh
  NextShardIterator (``<shard>:<n+1>``) spliced in; every call serves the same records, so
  sequence numbers repeat from one page to the next. ``Limit`` is ignored (but with ``--pages``).

With ``--pages P`` the stream is finite and its records distinct, as a sink needs them: page n of
a shard (its iterator ``<shard>:<n>``) carries the body's records with sequence numbers
``1<n, 11 digits><index in the page, 8 digits>`` (so they increase within a shard, page after
page), written into a copy of the body (~0.1 us of server CPU per record); after P pages a shard
answers with no records, at its tip. A ``Limit`` below a page's records is honoured, as Kinesis
does: the answer holds that many and its iterator (``<shard>:<n>.<index>``) continues inside
the page (reading on the executors asks a lease's share of a round's budget: served whole
pages, each range read ~2.4 times what Kinesis would give at 24 shards). Iterators start at
TRIM_HORIZON or AFTER_SEQUENCE_NUMBER (AT_SEQUENCE_NUMBER gets an error: the benchmarks start
fresh applications). ``calls`` counts the answers with records.
``--synthetic N`` makes the body itself (N records of ``--size`` bytes, as
``kinesalite.default_payload`` makes them) instead of reading a captured one.

Each shard enforces Kinesis's two read limits (``--read-limit -1``: neither): 5 GetRecords a
second (a bucket of 5 calls refilled at 5 a second) and 2 MiB of records a second
(``--read-limit``, MiB; 0: bytes unlimited):
after a page of B bytes (data and partition keys) the shard refuses reads for B / limit seconds,
as Kinesis documents it ("if a call returns 10 MiB, calls made within the next 5 seconds
throw"), answering ProvisionedThroughputExceededException (HTTP 400).

Records served are counted; ``GET /_standin/stats`` answers ``{"records": N, "calls": N,
"throttled": N, "first_read": epoch seconds of the first GetRecords or null}``.
Requests are not authenticated (signatures are not checked). Loopback only.

    python bench/standin_server.py --body .cache/bench/getrecords-10000.json [--port 0]

prints ``http://127.0.0.1:PORT`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_ITERATOR = re.compile(rb'"NextShardIterator"\s*:\s*"[^"]*"')
_SHARD_ID = re.compile(r'"ShardIterator"\s*:\s*"([^":]*)')
_ITERATOR_AT = re.compile(r'"ShardIterator"\s*:\s*"([^":]*):(\d+)(?:\.(\d+))?"')
_LIMIT = re.compile(r'"Limit"\s*:\s*(\d+)')
_PAGE_DIGITS = 11  # the page number's digits in a finite stream's sequence numbers


MIB = 1024 * 1024
CALLS_PER_SECOND = 5.0


class Refused(Exception):
    """A call over one of the shard's read limits."""


class ShardLimits:
    """Kinesis's read limits of one shard on the monotonic clock: 5 calls a second (a bucket of
    5) and, after a page of B bytes, no read for B / ``rate`` seconds (``rate`` 0: bytes
    unlimited)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.blocked_until = 0.0
        self.tokens = CALLS_PER_SECOND
        self.tokens_at = time.monotonic()

    def admit(self) -> float:
        """Count one call (now, returned); raise Refused if a limit refuses it."""
        now = time.monotonic()
        self.tokens = min(CALLS_PER_SECOND, self.tokens + CALLS_PER_SECOND * (now - self.tokens_at))
        self.tokens_at = now
        if now < self.blocked_until or self.tokens < 1:
            raise Refused
        self.tokens -= 1
        return now

    def served(self, now: float, size: int) -> None:
        if self.rate > 0:
            self.blocked_until = now + size / self.rate


def records_bytes(records: list[dict[str, str]]) -> int:
    """What a page's records count against the read limit: data (decoded) and partition keys."""
    return sum(len(base64.b64decode(r["Data"])) + len(r["PartitionKey"].encode()) for r in records)


def sequence_number(page: int, index: int) -> str:
    """Record ``index`` of page ``page`` in a finite stream (both from 0)."""
    return f"1{page:0{_PAGE_DIGITS}d}{index:08d}"


def synthetic_body(records: int, size: int) -> bytes:
    """A GetRecords body of ``records`` records of ``size`` bytes (record i's data: its number,
    padded with x, as ``kinesalite.default_payload``), arrived now."""
    arrived = round(time.time(), 3)
    rows = []
    for i in range(records):
        head = f"{i:012d}|".encode()
        data = head + b"x" * max(0, size - len(head))
        rows.append(
            {
                "SequenceNumber": sequence_number(0, i),
                "ApproximateArrivalTimestamp": arrived,
                "Data": base64.b64encode(data).decode(),
                "PartitionKey": f"pk-{i}",
            }
        )
    body = {"Records": rows, "NextShardIterator": "standin:1", "MillisBehindLatest": 0}
    return json.dumps(body, separators=(",", ":")).encode()


class StandIn:
    """The canned answers and the counters."""

    def __init__(
        self,
        body: bytes,
        shards: int,
        stream: str = "standin",
        pages: int | None = None,
        read_limit: float | None = 2 * MIB,
    ) -> None:
        """``read_limit``: bytes a second per shard (0: bytes unlimited); None: no limit at all,
        not even 5 calls a second."""
        self.pages = pages
        self.read_limit = read_limit
        self.limits: dict[str, ShardLimits] = {}
        self.throttled = 0
        if pages is not None:
            body = self._numbered(body)
        match = _ITERATOR.search(body)
        if match is None:
            raise ValueError("the captured body has no NextShardIterator")
        # The body around the iterator's value, so each answer is three writes and no copy.
        self.prefix = body[: match.start()] + b'"NextShardIterator":"'
        self.suffix = b'"' + body[match.end() :]
        if pages is not None and any(at >= len(self.prefix) for at in self._page_at):
            raise ValueError("the body's records must come before its NextShardIterator")
        records = json.loads(body)["Records"]
        self.per_page = len(records)
        self.page_bytes = records_bytes(records)
        # Each record's JSON and where its page digits are: answers of part of a page.
        self._parts = [json.dumps(r, separators=(",", ":")).encode() for r in records]
        marker = b'"SequenceNumber":"1'
        self._digits_at = [part.find(marker) + len(marker) for part in self._parts]
        self._served_bytes = 0
        self.records = 0
        self.calls = 0
        self.first_read: float | None = None  # epoch seconds of the first GetRecords
        self.shard_ids = [f"shardId-{i:012d}" for i in range(shards)]
        step = 2**128 // shards
        listing = [
            {
                "ShardId": sid,
                "HashKeyRange": {
                    "StartingHashKey": str(i * step),
                    "EndingHashKey": str(2**128 - 1 if i == shards - 1 else (i + 1) * step - 1),
                },
                "SequenceNumberRange": {"StartingSequenceNumber": "0"},
            }
            for i, sid in enumerate(self.shard_ids)
        ]
        arn = f"arn:aws:kinesis:us-east-1:000000000000:stream/{stream}"
        self.canned = {
            "ListShards": json.dumps({"Shards": listing}).encode(),
            "DescribeStreamSummary": json.dumps(
                {
                    "StreamDescriptionSummary": {
                        "StreamName": stream,
                        "StreamARN": arn,
                        "StreamStatus": "ACTIVE",
                        "RetentionPeriodHours": 24,
                        "StreamCreationTimestamp": 1_700_000_000,
                        "EnhancedMonitoring": [{"ShardLevelMetrics": []}],
                        "OpenShardCount": shards,
                    }
                }
            ).encode(),
        }

    def _numbered(self, body: bytes) -> bytes:
        """The body with page 0's sequence numbers; notes where each one's page digits are."""
        value = json.loads(body)
        for i, record in enumerate(value["Records"]):
            record["SequenceNumber"] = sequence_number(0, i)
        value["MillisBehindLatest"] = 0
        out = json.dumps(value, separators=(",", ":")).encode()
        marker = b'"SequenceNumber":"1'
        self._page_at: list[int] = []
        at = out.find(marker)
        while at >= 0:
            self._page_at.append(at + len(marker))
            at = out.find(marker, at + 1)
        return out

    def _page(self, shard: str, page: int, start: int = 0, limit: int | None = None) -> list[bytes]:
        """Page ``page`` of a finite stream's shard from record ``start``, at most ``limit``
        records, or an empty answer at its tip."""
        assert self.pages is not None
        if page >= self.pages:
            empty = {"Records": [], "NextShardIterator": f"{shard}:{page}", "MillisBehindLatest": 0}
            self._served_bytes = 0
            return [json.dumps(empty).encode()]
        count = self.per_page - start if limit is None else min(limit, self.per_page - start)
        if count <= 0:  # Kinesis refuses a Limit under 1: answered empty, counted as no call
            self._served_bytes = 0
            rest = {"Records": [], "NextShardIterator": f"{shard}:{page}.{start}",
                    "MillisBehindLatest": 1000}  # fmt: skip
            return [json.dumps(rest).encode()]
        self.calls += 1
        self.records += count
        self._served_bytes = self.page_bytes * count // self.per_page
        if count < self.per_page:
            return self._part_of_page(shard, page, start, count)
        head = bytearray(self.prefix)
        digits = f"{page:0{_PAGE_DIGITS}d}".encode()
        for at in self._page_at:
            head[at : at + _PAGE_DIGITS] = digits
        return [bytes(head), f"{shard}:{page + 1}".encode(), self.suffix]

    def _part_of_page(self, shard: str, page: int, start: int, count: int) -> list[bytes]:
        digits = f"{page:0{_PAGE_DIGITS}d}".encode()
        records = [
            part[:at] + digits + part[at + _PAGE_DIGITS :]
            for part, at in zip(
                self._parts[start : start + count],
                self._digits_at[start : start + count],
                strict=True,
            )
        ]
        end = start + count
        after = f"{shard}:{page + 1}" if end == self.per_page else f"{shard}:{page}.{end}"
        # Behind until the stream's last record: an answer shorter than its Limit with no lag
        # is a reader's sign of the tip (it waited as there at every page's last part).
        lag = 0 if page == (self.pages or 0) - 1 and end == self.per_page else 1000
        return [
            b'{"Records":['
            + b",".join(records)
            + f'],"MillisBehindLatest":{lag},"NextShardIterator":"{after}"}}'.encode()
        ]

    def answer(self, target: str, request: bytes) -> list[bytes]:
        """The response body chunks for one call (Refused: over the shard's read limits)."""
        operation = target.rpartition(".")[2]
        if operation == "GetRecords":
            if self.first_read is None:
                self.first_read = time.time()
            found = _SHARD_ID.search(request.decode("utf-8", "replace"))
            shard = found.group(1) if found else "shard"
            limits = self._limits(shard)
            now = limits.admit() if limits is not None else 0.0
            chunks = self._records(shard, request)
            if limits is not None:
                limits.served(now, self._served_bytes)
            return chunks
        if operation == "GetShardIterator":
            asked = json.loads(request)
            shard = asked.get("ShardId", "shard")
            return [json.dumps({"ShardIterator": f"{shard}:{self._start_at(asked)}"}).encode()]
        if operation in self.canned:
            return [self.canned[operation]]
        raise KeyError(operation)

    def _limits(self, shard: str) -> ShardLimits | None:
        if self.read_limit is None:
            return None
        if shard not in self.limits:
            self.limits[shard] = ShardLimits(self.read_limit)
        return self.limits[shard]

    def _records(self, shard: str, request: bytes) -> list[bytes]:
        """A GetRecords answer: three chunks with records, one without."""
        if self.pages is not None:
            text = request.decode("utf-8", "replace")
            found = _ITERATOR_AT.search(text)
            if found is None:
                raise ValueError("a finite stand-in stream reads only its own iterators")
            limit = _LIMIT.search(text)
            return self._page(
                found.group(1),
                int(found.group(2)),
                int(found.group(3) or 0),
                int(limit.group(1)) if limit else None,
            )
        self.calls += 1
        self.records += self.per_page
        self._served_bytes = self.page_bytes
        return [self.prefix, f"{shard}:{self.calls}".encode(), self.suffix]

    def _start_at(self, asked: dict[str, str]) -> str:
        """TRIM_HORIZON: page 0; after a finite stream's record: the next one (``page.index``
        inside a page)."""
        kind = asked.get("ShardIteratorType", "TRIM_HORIZON")
        if kind == "TRIM_HORIZON" or self.pages is None:
            return "0"
        if kind == "AFTER_SEQUENCE_NUMBER":
            seq = asked["StartingSequenceNumber"]
            page, index = int(seq[1 : 1 + _PAGE_DIGITS]), int(seq[1 + _PAGE_DIGITS :])
            return f"{page + 1}" if index == self.per_page - 1 else f"{page}.{index + 1}"
        raise ValueError(f"a finite stand-in stream cannot start at {kind} {asked}")


def _head(status: str, length: int, content_type: str = "application/x-amz-json-1.1") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n"
        f"x-amzn-RequestId: standin\r\n\r\n"
    ).encode()


async def _serve_connection(
    standin: StandIn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "GET" and path.startswith("/_standin/stats"):
                stats = json.dumps({"records": standin.records, "calls": standin.calls,
                                    "throttled": standin.throttled,
                                    "first_read": standin.first_read}).encode()  # fmt: skip
                writer.writelines([_head("200 OK", len(stats), "application/json"), stats])
            else:
                try:
                    chunks = standin.answer(headers.get("x-amz-target", ""), body)
                    status = "200 OK"
                except Refused:
                    standin.throttled += 1
                    error = {"__type": "ProvisionedThroughputExceededException",
                             "message": "Rate exceeded for the shard (standin)"}  # fmt: skip
                    chunks, status = [json.dumps(error).encode()], "400 Bad Request"
                except (KeyError, ValueError) as exc:
                    error = {"__type": "InvalidArgumentException", "message": f"standin: {exc}"}
                    chunks, status = [json.dumps(error).encode()], "400 Bad Request"
                writer.writelines([_head(status, sum(map(len, chunks))), *chunks])
            await writer.drain()
    except ConnectionError:
        return  # the client went away (a benchmark run ended)
    finally:
        writer.close()


async def serve(
    body: bytes,
    shards: int,
    port: int,
    ready: asyncio.Future[int] | None,
    pages: int | None = None,
    read_limit: float | None = 2 * MIB,
) -> None:
    standin = StandIn(body, shards, pages=pages, read_limit=read_limit)
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(standin, r, w), "127.0.0.1", port
    )
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    print(f"http://127.0.0.1:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--body", type=Path, help="a captured GetRecords body")
    source.add_argument("--synthetic", type=int, help="make a body of this many records")
    parser.add_argument("--size", type=int, default=200, help="payload bytes (--synthetic)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--pages", type=int, help="a finite stream of distinct records")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument(
        "--read-limit", type=float, default=2.0,
        help="MiB a second per shard (Kinesis: 2); 0: bytes unlimited; -1: no limit at all",
    )  # fmt: skip
    args = parser.parse_args(argv)
    limit = None if args.read_limit < 0 else args.read_limit * MIB
    body = args.body.read_bytes() if args.body else synthetic_body(args.synthetic, args.size)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(body, args.shards, args.port, None, args.pages, limit))


if __name__ == "__main__":
    main(sys.argv[1:])
