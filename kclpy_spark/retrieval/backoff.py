"""What the fetchers retry: one place for both polling and fan-out decides what is retried
(throttling and transient dependency errors, after ``checkpoint.base.retry.Backoff``'s delay) and
what is raised at once (a vanished stream or shard, bad credentials, invalid requests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from checkpoint.base.errors import DependencyError, ThrottledError, map_aws_error
from checkpoint.base.retry import Backoff

log = logging.getLogger(__name__)


async def wait_or_raise(
    exc: BaseException,
    what: str,
    backoff: Backoff,
    sleep: Callable[[float], Awaitable[None]],
    *,
    retrying: str = "retrying",
) -> None:
    """After ``exc`` from the call described by ``what``: sleep a backoff delay if a retry may
    help, else raise the mapped error (the one place fetchers decide that)."""
    if isinstance(exc, asyncio.CancelledError):
        raise exc
    mapped = map_aws_error(exc, what)
    if not isinstance(mapped, ThrottledError | DependencyError):
        raise mapped from exc
    delay = backoff.next_delay()
    level = logging.DEBUG if isinstance(mapped, ThrottledError) else logging.WARNING
    log.log(level, "%s; %s in %.2fs", mapped, retrying, delay)
    await sleep(delay)
