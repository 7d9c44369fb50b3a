"""A stand-in Kinesis endpoint that replays a captured GetRecords body at almost no CPU cost.

It isolates a consumer's own cost from an emulator's: kinesalite spends ~24 us of CPU per record
serving GetRecords, as much as the consumer under test, on the same two cores. This server answers
the four calls a polling consumer makes (JSON 1.1 over HTTP/1.1 keep-alive) with pre-encoded bytes:

* ``DescribeStreamSummary``: ACTIVE, ``--shards`` open shards;
* ``ListShards``: those shards, splitting the hash key space evenly;
* ``GetShardIterator``: ``<shard>:0``;
* ``GetRecords``: the captured body (``--body``, e.g. 10,000 records) with a fresh
  NextShardIterator (``<shard>:<n+1>``) spliced in; every call serves the same records, so
  sequence numbers repeat from one page to the next. ``Limit`` is ignored.

Records served are counted; ``GET /_standin/stats`` answers ``{"records": N, "calls": N}``. Requests
are not authenticated (signatures are not checked). Loopback only.

    python bench/standin_server.py --body .cache/bench/getrecords-10000.json [--port 0]

prints ``http://127.0.0.1:PORT`` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

_ITERATOR = re.compile(rb'"NextShardIterator"\s*:\s*"[^"]*"')
_SHARD_ID = re.compile(r'"ShardIterator"\s*:\s*"([^":]*)')


class StandIn:
    """The canned answers and the counters."""

    def __init__(self, body: bytes, shards: int, stream: str = "standin") -> None:
        match = _ITERATOR.search(body)
        if match is None:
            raise ValueError("the captured body has no NextShardIterator")
        # The body around the iterator's value, so each answer is three writes and no copy.
        self.prefix = body[: match.start()] + b'"NextShardIterator":"'
        self.suffix = b'"' + body[match.end() :]
        self.per_page = len(json.loads(body)["Records"])
        self.records = 0
        self.calls = 0
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

    def answer(self, target: str, request: bytes) -> list[bytes]:
        """The response body chunks for one call."""
        operation = target.rpartition(".")[2]
        if operation == "GetRecords":
            self.calls += 1
            self.records += self.per_page
            found = _SHARD_ID.search(request.decode("utf-8", "replace"))
            shard = found.group(1) if found else "shard"
            return [self.prefix, f"{shard}:{self.calls}".encode(), self.suffix]
        if operation == "GetShardIterator":
            shard = json.loads(request).get("ShardId", "shard")
            return [json.dumps({"ShardIterator": f"{shard}:0"}).encode()]
        if operation in self.canned:
            return [self.canned[operation]]
        raise KeyError(operation)


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
                stats = json.dumps({"records": standin.records, "calls": standin.calls}).encode()
                writer.writelines([_head("200 OK", len(stats), "application/json"), stats])
            else:
                try:
                    chunks = standin.answer(headers.get("x-amz-target", ""), body)
                    status = "200 OK"
                except (KeyError, ValueError) as exc:
                    error = {"__type": "InvalidArgumentException", "message": f"standin: {exc}"}
                    chunks, status = [json.dumps(error).encode()], "400 Bad Request"
                writer.writelines([_head(status, sum(map(len, chunks))), *chunks])
            await writer.drain()
    except ConnectionError:
        return  # the client went away (a benchmark run ended)
    finally:
        writer.close()


async def serve(body: bytes, shards: int, port: int, ready: asyncio.Future[int] | None) -> None:
    standin = StandIn(body, shards)
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
    parser.add_argument("--body", type=Path, required=True, help="a captured GetRecords body")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.body.read_bytes(), args.shards, args.port, None))


if __name__ == "__main__":
    main(sys.argv[1:])
