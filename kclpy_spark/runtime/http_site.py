"""Where the status server (the worker's, and ``status --serve``) listens: aiohttp's TCP site with
a cap on open connections.

Without one, any peer that reaches the port (``metrics_host = "0.0.0.0"``, as Prometheus needs)
could open connections faster than the idle timeout closes them (it closes a connection whose
request has not ended that long after it opened, or after its last answer) until the process ran
out of file descriptors, and then every AWS call of the worker failed (its leases lost). Past
``MAX_CONNECTIONS`` a new connection is closed as soon as it is accepted; those open are served
as before: a peer that opens as many again each idle timeout still holds the port (probes are
refused meanwhile, and the worker goes on). Connections accepted in one pass of the event loop,
up to its listen backlog of 128, are counted together once made: the bound is
``MAX_CONNECTIONS`` plus that backlog.

The idle timeout watches requests, not answers: a peer that asks for a large answer and never
reads it (a zero receive window) held its connection, and its slot, for ever, and the server's
stop waited aiohttp's minute for each such answer. ``CONNECTION_LIFETIME`` after it opened a
connection is closed once its answer in flight is written (a keep-alive client such as
Prometheus connects again), and aborted ``ABORT_AFTER`` later if still open; a stop waits
``STOP_SECONDS`` for answers in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

MAX_CONNECTIONS = 64
CONNECTION_LIFETIME = 60.0  # seconds a connection is kept open (then closed once it has answered)
ABORT_AFTER = 10.0  # seconds past its lifetime a connection still open is aborted (unread answer)
STARTING_SECONDS = 1.0  # a connection just made is among the server's within this
STOP_SECONDS = 2.0  # a stop's wait for the answers in flight


def status_runner(app: web.Application, idle_seconds: float) -> web.AppRunner:
    """The runner of a status server: no access log, ``idle_seconds`` for a request to come,
    a stop that waits ``STOP_SECONDS`` for answers in flight (a pod's termination grace is
    short; aiohttp's own minute for each unread answer took two minutes past it)."""
    return web.AppRunner(
        app, access_log=None, keepalive_timeout=idle_seconds, shutdown_timeout=STOP_SECONDS
    )


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class CappedSite(web.BaseSite):
    """``web.TCPSite(runner, host, port)`` serving at most ``max_connections`` at once."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        max_connections: int = MAX_CONNECTIONS,
        lifetime: float = CONNECTION_LIFETIME,
        abort_after: float = ABORT_AFTER,
    ) -> None:
        super().__init__(runner)
        self._host, self._port, self._cap = host, port, max_connections
        self._lifetime, self._abort_after = lifetime, abort_after
        self._listening: asyncio.Server | None = None
        self._opened: dict[Any, float] = {}  # the connections served -> when (loop time)
        self._sweeping: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def sockets(self) -> list[Any]:
        return list(self._listening.sockets) if self._listening is not None else []

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None

        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= self._cap:
                return _Refused()
            handler = server()
            self._opened[handler] = loop.time()
            return handler

        def sweep() -> None:
            """Close the connections past their lifetime once their answer is written, abort
            those still open ``abort_after`` later; forget the closed ones. A connection is
            counted open from its first sight among the server's (aiohttp adds it a turn of the
            loop after it is made: forgotten then, it escaped its lifetime)."""
            now, open_now = loop.time(), set(server.connections)
            for handler, opened in list(self._opened.items()):
                age = now - opened
                if handler not in open_now:
                    if age >= STARTING_SECONDS:  # closed (or never started)
                        del self._opened[handler]
                elif age >= self._lifetime + self._abort_after:
                    del self._opened[handler]
                    _abort(handler)
                elif age >= self._lifetime:
                    handler.close()  # after the answer in flight: a scrape is not cut
            self._sweeping = loop.call_later(min(5.0, self._lifetime / 4), sweep)

        sweep()
        self._listening = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog
        )
        self._server = self._listening  # what the site's stop closes

    async def stop(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        self._opened.clear()
        await super().stop()


def _abort(handler: Any) -> None:
    """End a connection at its lifetime, unsent bytes and all (a close waits for them)."""
    transport = getattr(handler, "transport", None)
    if transport is not None:
        transport.abort()
