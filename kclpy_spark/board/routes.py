"""The status page's HTTP routes: ``/`` and ``/status`` (the page, one self-contained HTML file
with its script: no CDN, no library) and ``/status.json`` (what it draws). GET only: nothing
served here changes any state."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

Snapshot = Callable[[], Awaitable[dict[str, Any]]]


def page_html() -> str:
    return resources.files("kclpy_spark.board").joinpath("page.html").read_text("utf-8")


def add_routes(app: Any, snapshot: Snapshot) -> None:
    from aiohttp import web

    html = page_html()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html", charset="utf-8")

    async def status_json(_: web.Request) -> web.Response:
        body = json.dumps(await snapshot(), default=str)
        return web.Response(
            text=body, content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    app.router.add_get("/", page)
    app.router.add_get("/status", page)
    app.router.add_get("/status.json", status_json)
