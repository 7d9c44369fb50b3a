"""Fault-injecting wrappers around the real clients, and a TCP proxy that can make an endpoint
unreachable (connection refused) or silent (connections accepted, never answered)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from botocore.exceptions import ClientError

from checkpoint.base.errors import ThrottledError


def client_error(code: str, operation: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": f"injected {code}"},
         "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )  # fmt: skip


class FaultyKinesis:
    """Wraps an aiobotocore Kinesis client; ``fault(operation, call_number)`` returns an exception
    to raise instead of calling, or None."""

    def __init__(self, inner: Any, fault: Callable[[str, int], BaseException | None]) -> None:
        self._inner = inner
        self._fault = fault
        self.calls: dict[str, int] = {}
        self.injected: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            n = self.calls[name] = self.calls.get(name, 0) + 1
            exc = self._fault(name, n)
            if exc is not None:
                self.injected[name] = self.injected.get(name, 0) + 1
                raise exc
            return await target(*args, **kwargs)

        return call


class FaultyStore:
    """Wraps a lease store: ``fault(method, call_number)`` returns "lose" (the conditional write
    loses: None/False), an exception to raise, or None to pass through."""

    _CONDITIONAL: ClassVar[set[str]] = {"renew_lease", "take_lease", "evict_lease", "update_lease",
                    "update_checkpoint", "create_lease_if_absent", "delete_lease"}  # fmt: skip

    def __init__(self, inner: Any, fault: Callable[[str, int], object]) -> None:
        self._inner = inner
        self._fault = fault
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}
        self.injected: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._inner, name)
        if not callable(target) or name.startswith("_"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                n = self.calls[name] = self.calls.get(name, 0) + 1
            what = self._fault(name, n)
            if what is not None:
                with self._lock:
                    self.injected[name] = self.injected.get(name, 0) + 1
                if what == "lose" and name in self._CONDITIONAL:
                    return False if name in {"create_lease_if_absent", "delete_lease"} else None
                if isinstance(what, BaseException):
                    raise what
            return target(*args, **kwargs)

        return call


def throttled() -> ThrottledError:
    return ThrottledError("injected ProvisionedThroughputExceededException")


class Proxy:
    """A TCP proxy on 127.0.0.1 in a background thread. Modes: "up" (forward), "refuse" (the
    listening socket is closed: connection refused), "silent" (accept, read, never answer),
    "fake200" (answer every HTTP request itself with 200 and the next of ``FAKE_BODIES``: what a
    broken proxy or captive portal sends; ``fake_answers`` counts them)."""

    FAKE_BODIES = (
        (b"{}", "application/x-amz-json-1.1"),
        (b"<html><body>Service Unavailable</body></html>", "text/html"),
    )

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.mode = "up"
        self.port = 0
        self.fake_answers = 0
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            if self.mode == "silent":
                with contextlib.suppress(Exception):
                    while await reader.read(65536):
                        pass
                return
            if self.mode == "fake200":
                await self._answer_fake(reader, writer)
                return
            up_reader, up_writer = await asyncio.open_connection(*self._target)
            self._conns.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except Exception:
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer_fake(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Read HTTP requests on a keep-alive connection and answer each with a fake 200."""
        with contextlib.suppress(Exception):
            while self.mode == "fake200":
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                await reader.readexactly(length)
                body, kind = self.FAKE_BODIES[self.fake_answers % len(self.FAKE_BODIES)]
                self.fake_answers += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: " + kind.encode()
                    + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )  # fmt: skip
                await writer.drain()

    async def _set(self, mode: str) -> None:
        self.mode = mode
        # Cut every open connection so pooled keep-alive connections see the change at once.
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.close()
        self._conns.clear()
        if mode == "refuse" and self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        elif mode != "refuse" and self._server is None:
            await self._listen()

    def set(self, mode: str) -> None:
        self._call(self._set(mode))

    def close(self) -> None:
        self._call(self._set("refuse"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
