"""Retry a single-attempt call on retriable errors: the retry loop outside, one attempt inside.

Only exceptions of this package whose ``retriable`` flag is True (``ThrottledError``,
``DependencyError``) are retried, with exponential backoff and full jitter, bounded both in attempts
and in total time. A lost race is a return value (``None``/``False``), so it never reaches the retry
logic; non-retriable errors (``CorruptLeaseError``, ``ResourceNotFoundError``...) propagate at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from checkpoint.base.errors import KclpySparkError, ThrottledError

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry. Seconds as floats.

    The defaults suit a lease-table call made from a renewer thread: six attempts sleep at most
    0.1 + 0.2 + 0.4 + 0.8 + 1.6 = 3.1 s in all, about one renewer interval (3.3 s with the KCL's
    10 s failover time), so a throttled renewal still lands before the lease can expire elsewhere.
    ``max_elapsed`` bounds calls that are slow (timeouts) rather than quick to fail.
    """

    base_delay: float = 0.1
    max_delay: float = 5.0
    max_attempts: int = 6
    max_elapsed: float = 20.0

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError(f"bad retry delays: base {self.base_delay}, cap {self.max_delay}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_elapsed <= 0:
            raise ValueError(f"max_elapsed must be > 0, got {self.max_elapsed}")


DEFAULT_POLICY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


def is_retriable(exc: BaseException) -> bool:
    """True for this package's exceptions that say a retry may succeed."""
    return isinstance(exc, KclpySparkError) and exc.retriable


class _Wait:
    """Full-jitter exponential backoff, but never shorter than a throttle's ``retry_after``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._cap = policy.max_delay
        self._jitter = wait_random_exponential(multiplier=policy.base_delay, max=policy.max_delay)

    def __call__(self, state: RetryCallState) -> float:
        delay = float(self._jitter(state))
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, ThrottledError) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self._cap))
        return delay


def call_with_retry(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = DEFAULT_POLICY,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` (one attempt per call) until it returns or raises a non-retriable error.

    ``what`` names the operation in the WARNING logged before each retry. When the attempts or
    the time run out, the last retriable exception is re-raised unchanged.
    """

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "retrying %s in %.2fs (attempt %d of %d failed): %s",
            what,
            delay,
            state.attempt_number,
            policy.max_attempts,
            exc,
        )

    retrying = Retrying(
        retry=retry_if_exception(is_retriable),
        wait=_Wait(policy),
        stop=stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.max_elapsed),
        before_sleep=log_retry,
        sleep=sleep,
        reraise=True,
    )
    return retrying(fn)
