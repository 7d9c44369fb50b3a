"""Logging for the daemon: lease context on every line, optional JSON, secrets redacted.

A ``contextvars`` context carries application, stream and shard; asyncio tasks and
``asyncio.to_thread`` copy it, so a line logged anywhere while a shard's consumer runs names the
shard. A filter scrubs anything that looks like an AWS credential from every message.
"""

from __future__ import annotations

import argparse
import atexit
import contextvars
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kclpy_spark.log_writer import LogWriter

_app: contextvars.ContextVar[str | None] = contextvars.ContextVar("kclpy_app", default=None)
_stream: contextvars.ContextVar[str | None] = contextvars.ContextVar("kclpy_stream", default=None)
_shard: contextvars.ContextVar[str | None] = contextvars.ContextVar("kclpy_shard", default=None)
_worker: contextvars.ContextVar[str | None] = contextvars.ContextVar("kclpy_worker", default=None)

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(context)s%(message)s"

# Access key ids (AKIA/ASIA...), 40-character secret keys, and long base64 session tokens.
_SECRET_PATTERNS = [
    re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA)[A-Z0-9]{16}\b"),
    re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"),
    re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{100,}={0,2}"),  # after a key's "=" too
    # A URL's user and password: https://user:pass@host (no quote, comma or "?" inside, so a URL
    # and an address beside it, or "@" in a query, are left alone).
    re.compile(r"(?<=://)[^/@\s\"',?:]+:[^/@\s\"',?]+(?=@)"),
]
# The value of a key that names a secret: SecretAccessKey=..., fs.s3a.secret.key=...,
# fs.s3a.session.token=..., X-Amz-Security-Token=..., password: ..., {'password': '...'},
# X-Amz-Signature=..., a Spark Connect URL's ;token=... (the key is kept: group 1). The key's
# prefix is bounded (no quadratic scan of a long dotted run); after a ":" the value must follow a
# blank or a quote (an ARN's ":secret:name" is a name, not a secret).
_KEYED_SECRET = re.compile(
    r"(?i)((?:(?<![\w.-])[\w.:-]{0,160}?(?:secret(?:[_.-]?access)?(?:[_.-]?key)?"
    r"|session[_.-]?token|security[_.-]?token|password|passwd|signature)|(?<=[;&?])token)"
    r"['\"]?(?:\s*=|\s*:(?=[\s'\"]))\s*['\"]?)[^\s\"',&;)]+"
)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def set_application(application: str, stream: str, worker: str | None = None) -> None:
    _app.set(application)
    _stream.set(stream)
    _worker.set(worker)


def set_shard(shard_id: str | None) -> None:
    """Name the shard for every line logged from the current task (and threads it starts)."""
    _shard.set(shard_id)


@contextmanager
def shard_context(shard_id: str) -> Iterator[None]:
    token = _shard.set(shard_id)
    try:
        yield
    finally:
        _shard.reset(token)


def redact(text: str) -> str:
    for value in (os.environ.get(name) for name in _SECRET_ENV):
        if value and len(value) >= 8:
            text = text.replace(value, "[redacted]")
    text = _KEYED_SECRET.sub(r"\1[redacted]", text)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub("[redacted]", text)
    return text


class ContextFilter(logging.Filter):
    """Adds application/stream/shard/worker attributes and redacts secrets from the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = {"application": _app.get(), "stream": _stream.get(), "shard": _shard.get()}
        for key, value in context.items():
            setattr(record, key, value)
        record.worker = _worker.get()  # a field of JSON lines (text lines stay short)
        parts = [f"{k}={v}" for k, v in context.items() if v]
        record.context = f"[{' '.join(parts)}] " if parts else ""
        try:
            text = record.getMessage()
        except Exception as exc:  # an argument whose str() raises (py4j's, the JVM gone)
            text = f"{record.msg} (its arguments could not be shown: {exc!r})"
        message = redact(text)
        record.msg, record.args = message, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("application", "stream", "shard", "worker"):
            value = getattr(record, key, None)
            if value:
                out[key] = value
        if record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out)


_configured = {"level": "INFO", "format": "text"}


def configured() -> tuple[str, str]:
    """The level and format ``configure`` was given (Spark's JVM logs follow them)."""
    return _configured["level"], _configured["format"]


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_argument(text: str) -> str:
    """A ``--log-level`` flag's value, upper-cased; any other word is a usage error."""
    if text.upper() not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"must be one of {', '.join(LEVELS)} (any case), got {text!r}"
        )
    return text.upper()


# How long the exit waits for the queued lines to be written (a stderr nobody reads any more
# must not hold it).
DRAIN_AT_EXIT = 2.0
_writer: LogWriter | None = None


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Set up the root logger for the daemon: stderr, written by a thread of its own
    (``log_writer.py``), whose queued lines are written at exit."""
    global _writer
    _configured.update(level=level.upper(), format=fmt)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    if _writer is None:
        atexit.register(drain)
    else:
        _writer.close(DRAIN_AT_EXIT)
    _writer = LogWriter(handler)
    _writer.queued.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [_writer.queued]
    root.setLevel(level.upper())
    for noisy in ("botocore", "aiobotocore", "urllib3", "py4j", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Python warnings and a thread's uncaught exception come out as log lines too (in the
    # chosen format, redacted), not as plain text beside them.
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception
    sys.excepthook = _log_uncaught


def drain(timeout: float = DRAIN_AT_EXIT) -> None:
    """Write the queued lines (waiting at most ``timeout`` seconds); lines logged after are
    written by the thread that logs them (the process is ending)."""
    global _writer
    writer, _writer = _writer, None
    if writer is None:
        return
    if not writer.close(timeout):
        return  # stderr is not read: later lines are dropped, counted, and nothing waits
    writer.queued.write_directly(writer.write_now, writer.write_left)


def _log_uncaught(kind: type[BaseException], value: BaseException, tb: Any) -> None:
    """An uncaught exception of the main thread is a log line as a thread's is (its format,
    redacted), after the lines queued before it."""
    if issubclass(kind, KeyboardInterrupt):
        drain()
        sys.__excepthook__(kind, value, tb)
        return
    logging.getLogger("kclpy_spark").critical("uncaught exception", exc_info=(kind, value, tb))
    drain()


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("kclpy_spark").error(
        "uncaught exception in thread %s",
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )
