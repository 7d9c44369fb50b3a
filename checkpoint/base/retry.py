"""The one backoff of kclpy-spark, and the retry loop built on it (tenacity).

``Backoff`` is full-jitter exponential backoff: the n-th consecutive failure waits a uniform time in
``[0, min(cap, base * 2**n)]``. Loops that retry by hand (the fetchers, the shard consumer's
processor retries) count failures on a ``Backoff``; ``call_with_retry`` runs tenacity with the same
delays for one-attempt functions: the retry loop outside, one attempt inside.

Only exceptions of this package whose ``retriable`` flag is True (``ThrottledError``,
``DependencyError``) are retried; a lost race is a return value, so it never reaches the retry
logic, and non-retriable errors (``CorruptLeaseError``, ``ResourceNotFoundError``...) propagate at
once.

A retry loop has a deadline, not only a count: ``RetryPolicy.max_elapsed`` bounds the whole call,
*including* the attempt that would come next. Given ``attempt_timeout`` (the longest one attempt can
take, e.g. the SDK's connect + read timeouts), the loop gives up when the next backoff plus one more
attempt would end past ``max_elapsed``. That is what lets a lease renewal promise to finish before
the lease it protects expires.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from checkpoint.base.errors import KclpySparkError, ThrottledError

T = TypeVar("T")

# The jitter of every backoff given no generator of its own: a new ``random.Random`` costs
# ~13 us (seeded from the OS) and 2.5 KB, and a lease-table call or checkpoint makes a backoff.
_JITTER = random.Random()
os.register_at_fork(after_in_child=_JITTER.seed)  # a forked child draws jitter of its own

log = logging.getLogger(__name__)


class Backoff:
    """Full-jitter exponential backoff: failure n waits uniform ``[0, min(cap, base * 2**n)]``.

    ``next_delay`` counts one more failure and returns the wait; ``reset`` after a success.
    """

    def __init__(
        self, rng: random.Random | None = None, *, base: float = 0.5, cap: float = 10.0
    ) -> None:
        if base < 0 or cap < base:
            raise ValueError(f"bad backoff: base {base}, cap {cap}")
        self._rng = rng or _JITTER
        self.base = base
        self.cap = cap
        self.failures = 0

    def bound(self, failures: int) -> float:
        """The longest wait after ``failures`` consecutive failures."""
        return float(min(self.cap, self.base * 2 ** min(max(failures - 1, 0), 30)))

    def delay(self, failures: int) -> float:
        """A wait after ``failures`` consecutive failures (does not count anything)."""
        return self._rng.uniform(0, self.bound(failures))

    def next_delay(self) -> float:
        """Count one more failure and return how long to wait before the next attempt."""
        self.failures += 1
        return self.delay(self.failures)

    def reset(self) -> None:
        self.failures = 0


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry. Seconds as floats.

    The defaults suit a lease-table call made from a renewer thread: six attempts sleep at most
    0.1 + 0.2 + 0.4 + 0.8 + 1.6 = 3.1 s in all, about one renewer interval (3.3 s with the KCL's
    10 s failover time), so a throttled renewal still lands before the lease can expire elsewhere.
    ``max_elapsed`` bounds the whole call; ``attempt_timeout`` (0: unknown) is how long a single
    attempt may take at most, so the loop can stop before an attempt that could not end in time.
    """

    base_delay: float = 0.1
    max_delay: float = 5.0
    max_attempts: int = 6
    max_elapsed: float = 20.0
    attempt_timeout: float = 0.0

    def __post_init__(self) -> None:
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ValueError(f"bad retry delays: base {self.base_delay}, cap {self.max_delay}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.max_elapsed <= 0:
            raise ValueError(f"max_elapsed must be > 0, got {self.max_elapsed}")
        if self.attempt_timeout < 0:
            raise ValueError(f"attempt_timeout must be >= 0, got {self.attempt_timeout}")

    def backoff(self, rng: random.Random | None = None) -> Backoff:
        return Backoff(rng, base=self.base_delay, cap=self.max_delay)


DEFAULT_POLICY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)

# The KCL's default failoverTimeMillis, in seconds: how long a lease lasts unrenewed.
DEFAULT_FAILOVER_TIME = 10.0


@dataclass(frozen=True)
class CallBudget:
    """Seconds one lease-table call may take: per attempt (connect, and read, each) and in all,
    and at most how many attempts."""

    attempt: float
    total: float
    attempts: int = 8

    @classmethod
    def for_failover(cls, failover_time: float) -> CallBudget:
        # A sixth of the failover time per connect and per read (10 s -> 1.7 s, far above a
        # DynamoDB request's usual tens of milliseconds), at most 5 s; half of it in all. No
        # floor: one attempt must fit in half the lease, however short a failover is set.
        return cls(attempt=min(5.0, failover_time / 6), total=failover_time / 2)

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            base_delay=0.05,
            max_delay=min(1.0, self.total / 4),
            max_attempts=self.attempts,
            max_elapsed=self.total,
            attempt_timeout=2 * self.attempt,
        )


# A lease-table store's budget when its maker gives none (library use): a call with its retries
# ends within half a lease of the default failover time. The daemon budgets its stores by the
# configured failover time (kclpy_spark.runtime.lease_store).
DEFAULT_CALL_BUDGET = CallBudget.for_failover(DEFAULT_FAILOVER_TIME)
LEASE_TABLE_POLICY = DEFAULT_CALL_BUDGET.retry_policy()


def is_retriable(exc: BaseException) -> bool:
    """True for this package's exceptions that say a retry may succeed."""
    return isinstance(exc, KclpySparkError) and exc.retriable


class _Wait:
    """The policy's backoff, but never shorter than a throttle's ``retry_after``."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._cap = policy.max_delay
        self._backoff = policy.backoff()

    def __call__(self, state: RetryCallState) -> float:
        delay = self._backoff.delay(state.attempt_number)
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, ThrottledError) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self._cap))
        return delay


class _Deadline(stop_base):
    """Stop when the upcoming sleep plus one more attempt would end past ``max_elapsed``."""

    def __init__(self, policy: RetryPolicy, *, before: float = 0.0) -> None:
        self._policy = policy
        self._before = before  # seconds spent before the loop began (its first attempt)

    def __call__(self, state: RetryCallState) -> bool:
        elapsed = (state.seconds_since_start or 0.0) + self._before
        upcoming = state.upcoming_sleep or 0.0
        return elapsed + upcoming + self._policy.attempt_timeout >= self._policy.max_elapsed


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

    started = time.monotonic()
    try:  # the first attempt without a retry loop: most calls need none, and one costs ~15 us
        return fn()
    except Exception as exc:
        if policy.max_attempts <= 1 or not is_retriable(exc):
            raise
        first: list[Exception] = [exc]

    def attempt() -> T:  # the loop's first attempt is the one just made
        if first:
            raise first.pop()
        return fn()

    retrying = Retrying(
        retry=retry_if_exception(is_retriable),
        wait=_Wait(policy),
        stop=stop_after_attempt(policy.max_attempts)
        | _Deadline(policy, before=time.monotonic() - started),
        before_sleep=log_retry,
        sleep=sleep,
        reraise=True,
    )
    return retrying(attempt)
