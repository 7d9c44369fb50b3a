"""The retry policy of the fetchers: full-jitter exponential backoff on retriable AWS errors.

One place for both polling and fan-out: what is retried (throttling and transient dependency
errors), how long to wait (uniform in [0, min(cap, base * 2**failures)]), and what is raised at
once (a vanished stream or shard, bad credentials, invalid requests).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from checkpoint.base.errors import DependencyError, ThrottledError, map_aws_error

log = logging.getLogger(__name__)

# Half a second doubling to ten: ProvisionedThroughputExceeded clears within a second or two on a
# shard read by a few consumers; ten seconds caps the wait after a longer outage.
BACKOFF_BASE = 0.5
BACKOFF_CAP = 10.0


class Backoff:
    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        base: float = BACKOFF_BASE,
        cap: float = BACKOFF_CAP,
    ) -> None:
        self._rng = rng or random.Random()
        self._base = base
        self._cap = cap
        self.failures = 0

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        return self._rng.uniform(0, min(self._cap, self._base * 2 ** min(self.failures, 10)))

    def reset(self) -> None:
        self.failures = 0


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
