"""#45: the worker's HTTP port and ``status --serve`` answer only for this machine's names, so a
page whose domain was re-pointed at 127.0.0.1 (DNS rebinding) cannot read the status or the
metrics. The rule table first, then a real server on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from checkpoint.counters import CoordinationCounters
from kclpy_spark.board.routes import host_allowed, own_names
from kclpy_spark.runtime.metrics import StatusServer, WorkerMetrics

NAMES = own_names(["status.example.com"])


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("127.0.0.1:9000", True),
        ("127.0.0.1", True),
        ("10.1.2.3:9100", True),  # Prometheus scraping by address
        ("[::1]:9000", True),
        ("::1", True),
        ("localhost:9000", True),
        ("LOCALHOST", True),
        (f"{socket.gethostname()}:9000", True),
        ("status.example.com:443", True),  # configured
        ("status.example.com.", True),
        ("evil.example:9000", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example:9000", False),
        ("", False),
    ],
)
def test_which_hosts_are_this_server(host: str, allowed: bool) -> None:
    assert host_allowed(host, NAMES) is allowed


def _get(port: int, path: str, host: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def serving(board: Any, **kwargs: Any) -> AsyncIterator[int]:
    """A real status server on a free port of 127.0.0.1 showing ``board``: its port."""
    metrics = WorkerMetrics(CoordinationCounters(), application="app", worker="w1", stream="s")
    server = StatusServer(metrics, lambda: (True, "ready"), "127.0.0.1", 0, board=board, **kwargs)
    await server.start()
    try:
        assert server.port is not None
        yield server.port
    finally:
        await server.stop()


def test_a_rebound_name_is_refused_on_every_route() -> None:
    async def main() -> None:
        async def snapshot() -> dict[str, object]:
            return {"leases": []}

        async with serving(snapshot, host_names=("status.example.com",)) as port:
            for path in ("/metrics", "/status.json", "/", "/readyz", "/healthz"):
                refused = await asyncio.to_thread(_get, port, path, "evil.example")
                assert refused[0] == 421, path
                for host in (f"127.0.0.1:{port}", "localhost", "status.example.com"):
                    status, _ = await asyncio.to_thread(_get, port, path, host)
                    assert status == 200, (path, host)
            _, body = await asyncio.to_thread(_get, port, "/status.json", "localhost")
            assert b"leases" in body

    asyncio.run(main())


def test_status_json_answers_503_when_its_snapshot_does_not_come_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow lease table held each page poll (every 3 s) on the snapshot's lock without end."""
    from kclpy_spark.board import routes

    monkeypatch.setattr(routes, "STATUS_DEADLINE", 0.1)

    async def main() -> None:
        async def stuck() -> dict[str, object]:
            await asyncio.sleep(30)
            return {}

        async with serving(stuck) as port:
            status, body = await asyncio.to_thread(_get, port, "/status.json", "localhost")
            assert status == 503 and b"did not answer" in body

    asyncio.run(main())


def test_polls_during_a_slow_snapshot_share_it_instead_of_starting_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelled at the deadline, the snapshot's table read went on in its thread, its result
    thrown away: every later poll started another full Scan, and none ever answered. The
    snapshot here ends when the test lets it (a slept 0.35 s failed under the suite's load:
    polls late enough found it ended and too old, so every one began another)."""
    from kclpy_spark.board import routes

    monkeypatch.setattr(routes, "STATUS_DEADLINE", 0.1)
    started: list[float] = []
    ended: list[float] = []

    async def main() -> None:
        gate = asyncio.Event()

        async def slow() -> dict[str, object]:
            started.append(1.0)
            await gate.wait()  # slow, but it answers once let through
            ended.append(1.0)
            return {"leases": []}

        async with serving(slow) as port:

            async def poll() -> int:
                return (await asyncio.to_thread(_get, port, "/status.json", "localhost"))[0]

            assert [await poll() for _ in range(3)] == [503, 503, 503]
            assert len(started) == 1  # one snapshot served the polls made while it ran
            monkeypatch.setattr(routes, "STATUS_DEADLINE", 30.0)
            answer = asyncio.ensure_future(poll())
            gate.set()
            assert await answer == 200 and len(started) == 1
            # A snapshot a poll gave up on, finished long before the next poll: not shown as
            # current (the tab closed for hours, then opened).
            monkeypatch.setattr(routes, "STATUS_DEADLINE", 0.1)
            gate.clear()
            assert await poll() == 503 and len(started) == 2  # the served one is not reused
            gate.set()

            async def second_ended() -> None:
                while len(ended) < 2:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(second_ended(), 10.0)
            await asyncio.sleep(0.3)  # it ended, then aged past the deadline
            gate.clear()
            assert await poll() == 503 and len(started) == 3  # a fresh one was begun
            gate.set()

    asyncio.run(main())


def test_a_connection_that_sends_nothing_is_closed() -> None:
    """aiohttp's default kept a silent connection open for an hour: enough of them from a peer
    that reaches the port (metrics_host 0.0.0.0) took the worker's file descriptors."""
    import socket
    import time

    async def main() -> None:
        async def snapshot() -> dict[str, object]:
            return {"leases": []}

        async with serving(snapshot, idle_seconds=0.3) as port:
            silent = socket.create_connection(("127.0.0.1", port))
            silent.settimeout(0.1)
            closed, deadline = False, time.monotonic() + 20
            while not closed and time.monotonic() < deadline:
                try:
                    closed = await asyncio.to_thread(silent.recv, 1) == b""
                except TimeoutError:
                    await asyncio.sleep(0.1)
            silent.close()
            assert closed

    asyncio.run(main())


def test_a_request_sent_a_byte_at_a_time_is_closed_at_the_idle_timeout() -> None:
    """A slot of the capped server is held at most the idle timeout by a request that never
    ends (aiohttp counts it from the connection's start, not from its last byte)."""
    import time

    async def main() -> float:
        async def snapshot() -> dict[str, object]:
            return {"leases": []}

        async with serving(snapshot, idle_seconds=0.5) as port:
            conn = socket.create_connection(("127.0.0.1", port))
            conn.settimeout(0.05)
            began, closed = time.monotonic(), False
            try:
                for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400:
                    try:
                        conn.sendall(bytes([byte]))
                        closed = await asyncio.to_thread(conn.recv, 1) == b""
                    except TimeoutError:
                        pass
                    except OSError:  # reset once closed
                        closed = True
                    if closed:
                        break
            finally:
                conn.close()
            assert closed, "a trickling request kept its connection"
            return time.monotonic() - began

    assert asyncio.run(main()) < 10


def test_connections_past_the_cap_are_closed_and_those_open_still_served() -> None:
    """Requests that never end, as many as the cap, are served no further connection until one
    closes (each is closed at the idle timeout at most): a peer could otherwise hold connections
    until the worker ran out of file descriptors (then every AWS call failed)."""
    from kclpy_spark.runtime.http_site import MAX_CONNECTIONS

    def slow_request(port: int) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", port))
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        return conn

    def closed_at_once(port: int) -> bool:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.settimeout(5)
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                return conn.recv(64) == b""
            except ConnectionResetError:
                return True

    async def main() -> None:
        async def snapshot() -> dict[str, object]:
            return {"leases": []}

        async with serving(snapshot) as port:
            held = [await asyncio.to_thread(slow_request, port) for _ in range(MAX_CONNECTIONS)]
            try:
                await asyncio.sleep(0.2)
                assert await asyncio.to_thread(closed_at_once, port)
                held[0].sendall(b"\r\n")  # one of them finishes its request: served
                held[0].settimeout(5)
                answer = await asyncio.to_thread(held[0].recv, 64)
                assert answer.startswith(b"HTTP/1.1 200")
                held.pop(0).close()
                answered = None
                for _ in range(50):  # its place is free once the server saw it close
                    with contextlib.suppress(http.client.HTTPException, ConnectionError):
                        answered = await asyncio.to_thread(_get, port, "/healthz", "127.0.0.1")
                        break
                    await asyncio.sleep(0.1)
                assert answered is not None and answered[0] == 200
            finally:
                for conn in held:
                    conn.close()

    asyncio.run(main())


def test_a_peer_that_never_reads_its_answer_loses_its_connection_at_its_lifetime() -> None:
    """A large answer never read (a zero receive window) held its connection, and its slot, for
    ever: with the cap's worth of them no probe was answered, and the stop waited aiohttp's
    minute for each unread answer (two minutes past a pod's termination grace)."""
    import time

    from aiohttp import web

    from kclpy_spark.runtime.http_site import CappedSite, status_runner

    def never_reading(port: int) -> socket.socket:
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        conn.connect(("127.0.0.1", port))
        conn.sendall(b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return conn

    async def main() -> tuple[bool, float]:
        async def big(_: web.Request) -> web.Response:
            return web.Response(body=b"x" * 8_000_000)

        async def small(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_get("/big", big)
        app.router.add_get("/healthz", small)
        runner = status_runner(app, idle_seconds=0.5)
        await runner.setup()
        site = CappedSite(runner, "127.0.0.1", 0, max_connections=2, lifetime=0.5, abort_after=1)
        await site.start()
        port = site.sockets[0].getsockname()[1]
        held = [await asyncio.to_thread(never_reading, port) for _ in range(2)]
        try:
            await asyncio.sleep(3.0)  # past their lifetime and the abort: their slots free
            answered = False
            for _ in range(30):
                with contextlib.suppress(http.client.HTTPException, ConnectionError):
                    answered = (await asyncio.to_thread(_get, port, "/healthz", "127.0.0.1"))[
                        0
                    ] == 200
                    break
                await asyncio.sleep(0.1)
            more = [await asyncio.to_thread(never_reading, port) for _ in range(2)]
            held += more
            began = time.monotonic()
            await runner.cleanup()  # two answers unread: the stop waits STOP_SECONDS, not minutes
            return answered, time.monotonic() - began
        finally:
            for conn in held:
                conn.close()

    answered, stop_took = asyncio.run(main())
    assert answered
    assert stop_took < 10.0
