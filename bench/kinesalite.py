"""kinesalite for the benchmarks: install it, run it on loopback, and load a stream quickly.

kinesalite (npm, in memory) is the fastest Kinesis emulator measured on this machine (see the
shared notes): about 4x LocalStack's kinesis-mock on GetRecords. Its gaps do not matter for
throughput: MillisBehindLatest is always 0 and there are no ChildShards.

    python bench/kinesalite.py install            # npm install into .cache/kinesalite (idempotent)
    python bench/kinesalite.py serve              # run in the foreground on a free port
    python bench/kinesalite.py load --endpoint http://127.0.0.1:PORT --stream s --records 200000

In code: ``with Kinesalite() as k: load_stream(k.endpoint, "s", shards=4, records=200_000)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from common import reap

REPO = Path(__file__).resolve().parents[1]
INSTALL_DIR = REPO / ".cache" / "kinesalite"
VERSION = "3.3.3"
REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
# PutRecords takes at most 500 records per call; 8 calls in flight keep kinesalite's one Node
# thread busy without queueing so deep that calls time out.
PUT_BATCH = 500
PUT_CONCURRENCY = 8

# The stock CLI listens on every interface; this launcher binds loopback only, on the port given
# (0 = the OS picks a free one), and prints the port it got.
_LAUNCHER = """
const kinesalite = require(process.argv[1]);
const server = kinesalite({createStreamMs: 0, deleteStreamMs: 0, updateStreamMs: 0,
                           shardLimit: 1000});
if (process.argv[3] === 'log-reads') {
  server.on('request', (req) => {
    if (req.headers['x-amz-target'] === 'Kinesis_20131202.GetRecords') {
      console.log('GetRecords at ' + Date.now());
    }
  });
}
server.listen(Number(process.argv[2]), '127.0.0.1', () => {
  console.log('kinesalite listening on port ' + server.address().port);
});
"""


def _drain(stream: IO[str], reads: list[float]) -> None:
    for line in stream:
        found = re.match(r"GetRecords at (\d+)", line)
        if found:
            reads.append(int(found.group(1)) / 1000)


def module_dir() -> Path:
    return INSTALL_DIR / "node_modules" / "kinesalite"


def ensure_installed() -> Path:
    """Install kinesalite with npm into ``.cache/kinesalite`` unless it is there; its module dir."""
    target = module_dir()
    if (target / "index.js").exists():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install kinesalite (apt-get install nodejs npm)")
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(INSTALL_DIR),
         f"kinesalite@{VERSION}"],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    if not (target / "index.js").exists():
        raise RuntimeError(f"npm ran but {target}/index.js is missing")
    return target


class Kinesalite:
    """A kinesalite process on 127.0.0.1 (in memory); a context manager that stops it on exit."""

    def __init__(
        self, port: int = 0, *, max_old_space_mb: int = 4096, log_reads: bool = False
    ) -> None:
        self._port = port
        self._log_reads = log_reads
        # With ``log_reads``: the epoch time each GetRecords request arrived (appended by a thread).
        self.read_times: list[float] = []
        self._heap = max_old_space_mb
        self.proc: subprocess.Popen[str] | None = None
        self.endpoint = ""

    def start(self, timeout: float = 30.0) -> str:
        module = ensure_installed()
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is needed to run kinesalite")
        self.proc = subprocess.Popen(
            [node, f"--max-old-space-size={self._heap}", "-e", _LAUNCHER, str(module),
             str(self._port), "log-reads" if self._log_reads else ""],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            found = re.search(r"listening on port (\d+)", line)
            if found:
                self.endpoint = f"http://127.0.0.1:{found.group(1)}"
                # Keep reading what it prints so a full pipe never blocks it.
                threading.Thread(
                    target=_drain, args=(self.proc.stdout, self.read_times), daemon=True
                ).start()
                return self.endpoint
        self.stop()
        raise RuntimeError("kinesalite did not start")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            reap(self.proc, 10)
        self.proc = None

    def __enter__(self) -> Kinesalite:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def sync_client(endpoint: str, service: str = "kinesis") -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(retries={"mode": "standard", "max_attempts": 10}),
        **CREDENTIALS,
    )


def create_stream(endpoint: str, stream: str, shards: int) -> None:
    """Create ``stream`` with ``shards`` shards (if missing) and wait until it is ACTIVE."""
    client = sync_client(endpoint)
    with contextlib.suppress(client.exceptions.ResourceInUseException):
        client.create_stream(StreamName=stream, ShardCount=shards)
    client.get_waiter("stream_exists").wait(
        StreamName=stream, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300}
    )


def default_payload(size: int) -> Callable[[int], bytes]:
    """Record ``i``'s data: its number, padded to ``size`` bytes (incompressible content is not
    needed: nothing between the put and the read compresses)."""

    def make(i: int) -> bytes:
        head = f"{i:012d}|".encode()
        return head + b"x" * max(0, size - len(head))

    return make


async def _put_all(
    endpoint: str,
    stream: str,
    records: int,
    payload: Callable[[int], bytes],
    concurrency: int,
    shards: int,
    tips: dict[str, int] | None = None,
    positions: dict[str, list[int]] | None = None,
) -> int:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    config = AioConfig(
        retries={"mode": "standard", "max_attempts": 10}, max_pool_connections=concurrency
    )
    next_start = 0
    put = 0
    async with get_session().create_client(
        "kinesis", endpoint_url=endpoint, region_name=REGION, config=config, **CREDENTIALS
    ) as client:

        async def worker() -> None:
            nonlocal next_start, put
            while next_start < records:
                start = next_start
                next_start = min(records, start + PUT_BATCH)
                # Explicit hash keys spread records evenly over the shards, round robin.
                pending = [
                    {
                        "Data": payload(i),
                        "PartitionKey": f"pk-{i}",
                        "ExplicitHashKey": str((i % shards) * (2**128 // shards)),
                    }
                    for i in range(start, next_start)
                ]
                while pending:
                    resp = await client.put_records(StreamName=stream, Records=pending)
                    failed = [
                        entry
                        for entry, result in zip(pending, resp["Records"], strict=True)
                        if "ErrorCode" in result
                    ]
                    put += len(pending) - len(failed)
                    if tips is not None:
                        for result in resp["Records"]:
                            if "ErrorCode" not in result:
                                seq = int(result["SequenceNumber"])
                                shard = result["ShardId"]
                                tips[shard] = max(tips.get(shard, 0), seq)
                    if positions is not None:
                        for result in resp["Records"]:
                            if "ErrorCode" not in result:
                                seqs = positions.setdefault(result["ShardId"], [])
                                seqs.append(int(result["SequenceNumber"]))
                    pending = failed
                    if failed:
                        await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return put


def load_stream(
    endpoint: str,
    stream: str,
    *,
    shards: int = 4,
    records: int = 200_000,
    size: int = 200,
    payload: Callable[[int], bytes] | None = None,
    concurrency: int = PUT_CONCURRENCY,
    tips: dict[str, int] | None = None,
    positions: dict[str, list[int]] | None = None,
) -> float:
    """Create a ``shards``-shard stream and put ``records`` records of ``size`` bytes, spread
    evenly over the shards. Returns the seconds the puts took; ``tips`` (when given) gets each
    shard's last sequence number, ``positions`` every record's sequence number by shard
    (sorted)."""
    create_stream(endpoint, stream, shards)
    began = time.perf_counter()
    done = asyncio.run(
        _put_all(
            endpoint,
            stream,
            records,
            payload or default_payload(size),
            concurrency,
            shards,
            tips,
            positions,
        )
    )
    if positions is not None:
        for seqs in positions.values():
            seqs.sort()
    if done != records:
        raise RuntimeError(f"put {done} of {records} records")
    return time.perf_counter() - began


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="npm install kinesalite into .cache/kinesalite")
    serve = sub.add_parser("serve", help="run kinesalite in the foreground until Ctrl-C")
    serve.add_argument("--port", type=int, default=0, help="0 = a free port")
    load = sub.add_parser("load", help="create a stream and put records into it")
    load.add_argument("--endpoint", required=True)
    load.add_argument("--stream", default="bench")
    load.add_argument("--shards", type=int, default=4)
    load.add_argument("--records", type=int, default=200_000)
    load.add_argument("--size", type=int, default=200)
    args = parser.parse_args(argv)
    if args.command == "install":
        print(ensure_installed())
    elif args.command == "serve":
        with Kinesalite(args.port) as k:
            print(k.endpoint, flush=True)
            try:
                assert k.proc is not None
                k.proc.wait()
            except KeyboardInterrupt:
                pass
    else:
        seconds = load_stream(
            args.endpoint, args.stream, shards=args.shards, records=args.records, size=args.size
        )
        print(f"put {args.records} records in {seconds:.1f}s ({args.records / seconds:,.0f}/s)")


if __name__ == "__main__":
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    main(sys.argv[1:])
