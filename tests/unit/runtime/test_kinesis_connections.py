"""The worker's asynchronous Kinesis client never makes a call wait for a pooled connection.

A fan-out subscription holds its connection for up to five minutes. With a pool of 50, the 51st
lease's subscription, and every other Kinesis call of the worker (shard-end checks, retention
checks), waited for one to end, without a deadline. A local HTTP server stands in for Kinesis:
it answers ListShards at once and holds every SubscribeToShard open."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from kclpy_spark.aws import aio_client
from kclpy_spark.config import WorkerConfig

SUBSCRIPTIONS = 60  # more than the old pool's 50


@contextlib.asynccontextmanager
async def kinesis_stand_in() -> AsyncIterator[tuple[str, list[int]]]:
    held: list[int] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        target = request.headers.get("X-Amz-Target", "")
        await request.read()
        if target.endswith(".SubscribeToShard"):
            held.append(1)
            response = web.StreamResponse(
                status=200, headers={"Content-Type": "application/vnd.amazon.eventstream"}
            )
            await response.prepare(request)
            await asyncio.sleep(3600)  # a subscription's life: the connection stays taken
            return response
        return web.json_response({"Shards": []}, content_type="application/x-amz-json-1.1")

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", held
    finally:
        await runner.cleanup()


def test_a_call_never_waits_for_a_connection_held_by_subscriptions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")

    async def scenario() -> Any:
        async with kinesis_stand_in() as (endpoint, held):
            cfg = WorkerConfig(stream_name="s", endpoint_url=endpoint, region="us-east-1")
            async with aio_client("kinesis", cfg) as kinesis:
                subscribe = [
                    asyncio.create_task(
                        kinesis.subscribe_to_shard(
                            ConsumerARN="arn:aws:kinesis:us-east-1:000000000000:stream/s/consumer/c:1",
                            ShardId=f"shardId-{n:012d}",
                            StartingPosition={"Type": "LATEST"},
                        )
                    )
                    for n in range(SUBSCRIPTIONS)
                ]
                try:
                    for _ in range(250):  # until every connection a pool of 50 has is taken
                        if len(held) >= 50:
                            break
                        await asyncio.sleep(0.02)
                    assert len(held) >= 50, f"only {len(held)} subscriptions reached the server"
                    return await asyncio.wait_for(kinesis.list_shards(StreamName="s"), 10)
                finally:
                    for task in subscribe:
                        task.cancel()
                    await asyncio.gather(*subscribe, return_exceptions=True)

    assert asyncio.run(scenario())["Shards"] == []
    # (with a pool of 50, list_shards waited for a subscription to end: TimeoutError)
