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
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

MAX_CONNECTIONS = 64


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class CappedSite(web.BaseSite):
    """``web.TCPSite(runner, host, port)`` serving at most ``max_connections`` at once."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, max_connections: int = MAX_CONNECTIONS
    ) -> None:
        super().__init__(runner)
        self._host, self._port, self._cap = host, port, max_connections
        self._listening: asyncio.Server | None = None

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

        def protocol() -> asyncio.BaseProtocol:
            return _Refused() if len(server.connections) >= self._cap else server()

        loop = asyncio.get_running_loop()
        self._listening = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog
        )
        self._server = self._listening  # what the site's stop closes
