"""The status page's HTTP routes: ``/`` and ``/status`` (the page, one self-contained HTML file
with its script: no CDN, no library) and ``/status.json`` (what it draws). GET only: nothing
served here changes any state.

``host_guard`` answers 421 to a request whose ``Host`` is not this machine: a page on another
site whose name was re-pointed at 127.0.0.1 (DNS rebinding) would otherwise read the status and
the metrics as if it were served here. Accepted: any IP address, ``localhost``, this machine's
host name and fully qualified name, and the names configured (``metrics_host_names``,
``status --serve --allow-host``); a request without ``Host`` (no browser sends one) too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable
from importlib import resources
from typing import Any

Snapshot = Callable[[], Awaitable[dict[str, Any]]]
# How long /status.json waits for its snapshot (a table read when the last scan is old).
STATUS_DEADLINE = 10.0


def page_html() -> str:
    return resources.files("kclpy_spark.board").joinpath("page.html").read_text("utf-8")


def add_routes(app: Any, snapshot: Snapshot) -> None:
    from aiohttp import web

    html = page_html()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html", charset="utf-8")

    # The snapshot being made (or made, not yet served): one at a time, shared by the polls
    # that come meanwhile and never cancelled, so a slow lease table makes a 503 after the
    # deadline and then the answer, not a new table read each poll.
    pending: list[asyncio.Future[dict[str, Any]]] = []
    ended: list[float] = []  # when it ended (the loop's clock)

    def start() -> None:
        future = asyncio.ensure_future(snapshot())
        future.add_done_callback(lambda _: ended.append(asyncio.get_running_loop().time()))
        pending[:], ended[:] = [future], []

    async def status_json(_: web.Request) -> web.Response:
        if not pending:
            start()
        elif ended and asyncio.get_running_loop().time() - ended[0] > STATUS_DEADLINE:
            start()  # made for a poll that gave up long ago: too old to show as current
        try:
            view = await asyncio.wait_for(asyncio.shield(pending[0]), STATUS_DEADLINE)
        except TimeoutError:
            error = {"error": f"the lease table did not answer within {STATUS_DEADLINE:.0f}s"}
            return web.json_response(error, status=503, headers={"Cache-Control": "no-store"})
        finally:
            if pending and pending[0].done():
                pending.clear()  # served (or failed): the next poll makes a fresh one
        body = json.dumps(view, default=str)
        return web.Response(
            text=body, content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    app.router.add_get("/", page)
    app.router.add_get("/status", page)
    app.router.add_get("/status.json", status_json)


def host_allowed(host: str, names: frozenset[str]) -> bool:
    """Whether a request's ``Host`` header (``name[:port]``, ``[v6]:port``) names this server."""
    name = host.strip().lower()
    if name.startswith("["):  # [::1]:8080
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    try:
        ipaddress.ip_address(name)
        return True  # an address cannot be re-pointed: the browser went to it by number
    except ValueError:
        return name.rstrip(".") in names


def own_names(configured: Iterable[str] = ()) -> frozenset[str]:
    names = {"localhost", socket.gethostname(), socket.getfqdn(), *configured}
    return frozenset(n.strip().lower().rstrip(".") for n in names if n.strip())


def host_guard(configured: Iterable[str] = ()) -> Any:
    """An aiohttp middleware that refuses requests for other host names (421)."""
    from aiohttp import web

    names = own_names(configured)

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host is not None and not host_allowed(host, names):
            return web.Response(status=421, text="this server does not answer for that Host\n")
        response: web.StreamResponse = await handler(request)
        return response

    return guard
