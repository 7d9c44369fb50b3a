"""The registered stream consumer enhanced fan-out reads through: found or registered once per
(stream, name) in a process, waited for until ACTIVE, and deregistered on request. The control
plane of fan-out; ``fanout.FanOutFetcher`` reads shards through the ARN it gives."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from checkpoint.base.errors import (
    DependencyError,
    KclpySparkError,
    MalformedAnswerError,
    RequestError,
    error_code,
    map_aws_error,
)
from checkpoint.base.retry import Backoff

log = logging.getLogger(__name__)

# A consumer takes seconds (LocalStack) to tens of seconds (AWS) to become ACTIVE.
CONSUMER_POLL_INTERVAL = 0.5
# RegisterStreamConsumer refused with LimitExceededException this many times in a row: the stream
# has its 20 registered consumers (no retry helps), not only calls that came too fast.
REGISTER_REFUSALS = 8

Sleep = Callable[[float], Awaitable[None]]


async def stream_arn(client: Any, stream: dict[str, str]) -> str:
    """The stream's ARN (RegisterStreamConsumer needs it) from ``{"StreamName"}`` or
    ``{"StreamARN"}``."""
    if "StreamARN" in stream:
        return stream["StreamARN"]
    try:
        resp = await client.describe_stream_summary(**stream)
    except Exception as exc:
        raise map_aws_error(exc, f"DescribeStreamSummary on {stream}") from exc
    try:
        return str(resp["StreamDescriptionSummary"]["StreamARN"])
    except (KeyError, TypeError) as exc:  # a 200 without it (a proxy's page): retried
        raise MalformedAnswerError(f"DescribeStreamSummary on {stream} named no ARN") from exc


class ConsumerRegistry:
    """Registers (or finds) one stream consumer per (stream, name) and remembers its ARN, so the
    fetchers of one process share one registration instead of each calling the control plane."""

    def __init__(self) -> None:
        self._arns: dict[tuple[str, str], str] = {}
        # A stream's ARN by the client that asked (its region, endpoint and credentials) and the
        # stream's name: asked once (DescribeStreamSummary allows 20 calls a second per account,
        # and every fan-out fetcher that started or restarted asked it).
        self._stream_arns: weakref.WeakKeyDictionary[Any, dict[str, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._subscribed: dict[tuple[str, str], float] = {}  # note_subscribed
        self._locks: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, ...], asyncio.Lock]
        ] = weakref.WeakKeyDictionary()

    def subscribed_at(self, consumer_arn: str, shard_id: str) -> float | None:
        """When a SubscribeToShard of this consumer on this shard was last answered (by the
        fetchers' monotonic clock), if noted since the last pruning (older ones are kept only
        until the next note: they ask for no wait)."""
        return self._subscribed.get((consumer_arn, shard_id))

    def note_subscribed(self, consumer_arn: str, shard_id: str, at: float, keep: float) -> None:
        """A subscription was answered ``at``: Kinesis refuses another for ``keep`` seconds,
        whichever fetcher asks (a lease's source started again is a new fetcher). Only the
        last ``keep`` seconds' are kept."""
        self._subscribed = {k: t for k, t in self._subscribed.items() if t > at - keep}
        self._subscribed[(consumer_arn, shard_id)] = at

    def forget(self, arn: str, name: str) -> None:
        self._arns.pop((arn, name), None)

    async def stream_arn(
        self, client: Any, stream: dict[str, str], *, sleep: Sleep = asyncio.sleep
    ) -> str:
        """``stream``'s ARN, asked once per stream name; throttling and other transient failures
        are retried with backoff (they ended the fetcher before, and its lease's budget with
        them), what cannot succeed (a stream that does not exist, no permission) is raised."""
        name = stream.get("StreamName")
        if name is None:  # given by its ARN: no call
            return await stream_arn(client, stream)
        try:
            arns = self._stream_arns.setdefault(client, {})
        except TypeError:  # a client that cannot be referred to weakly: asked each time
            arns = {}
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault(("stream", name), asyncio.Lock()):  # one ask at a time
            known = arns.get(name)
            if known is not None:
                return known
            backoff = Backoff()
            while True:
                try:
                    arn = await stream_arn(client, stream)
                except KclpySparkError as exc:
                    if not exc.retriable:
                        raise
                    delay = backoff.next_delay()
                    log.info("%s; retrying in %.2fs", exc, delay)
                    await sleep(delay)
                    continue
                arns[name] = arn
                return arn

    async def ensure(
        self, client: Any, stream: dict[str, str], name: str, *, sleep: Sleep = asyncio.sleep
    ) -> str:
        """The ARN of consumer ``name`` on ``stream``, registered if absent, once ACTIVE.
        Raises ResourceNotFoundError if the stream does not exist, other mapped errors if the
        control plane refuses; retries throttling and transient failures."""
        arn = await self.stream_arn(client, stream, sleep=sleep)
        key = (arn, name)
        known = self._arns.get(key)
        if known is not None:
            return known
        locks = self._locks.setdefault(asyncio.get_running_loop(), {})
        async with locks.setdefault(key, asyncio.Lock()):
            known = self._arns.get(key)
            if known is None:
                known = self._arns[key] = await _register_and_wait(client, arn, name, sleep)
            return known


# Fetchers share this unless given another (tests give their own).
CONSUMERS = ConsumerRegistry()


# Describes that may not yet find a consumer just registered (DescribeStreamConsumer is
# eventually consistent) before it is taken for deleted and registered again.
NOT_VISIBLE_POLLS = 20
REGISTRATIONS = 3  # registered, then gone before ACTIVE, this often: an error


class _OurRegistration:
    """Whether we registered the consumer, and whether it vanished since (deleted before it
    was ACTIVE: another worker's deregistration at its stop, an operator)."""

    def __init__(self, name: str, arn: str) -> None:
        self._what = f"stream consumer {name} on {arn}"
        self.live = False
        self._made = 0
        self._unseen = 0  # describes since our registration that did not find it
        self._was_seen = False

    def made(self) -> None:
        self.live, self._made, self._unseen, self._was_seen = True, self._made + 1, 0, False

    def seen(self) -> None:
        self._was_seen = self.live  # seen once, gone later is deleted

    def not_found(self, exc: BaseException) -> None:
        """A describe did not find it: after our registration, taken for deleted when it was
        seen before or for NOT_VISIBLE_POLLS describes (``live`` False: register again)."""
        if not self.live:
            return
        self._unseen += 1
        if not self._was_seen and self._unseen < NOT_VISIBLE_POLLS:
            return  # registered, not yet visible
        if self._made >= REGISTRATIONS:
            raise DependencyError(
                f"{self._what}: registered {self._made} times, gone each time before it was ACTIVE"
            ) from exc
        log.warning("%s: gone after it was registered (deregistered meanwhile?); registering "
                    "it again", self._what)  # fmt: skip
        self.live, self._unseen = False, 0


async def _register_and_wait(client: Any, arn: str, name: str, sleep: Sleep) -> str:
    backoff = Backoff()
    ours = _OurRegistration(name, arn)
    refused = 0  # LimitExceededException answers to RegisterStreamConsumer in a row
    while True:
        try:
            desc = (await client.describe_stream_consumer(StreamARN=arn, ConsumerName=name))[
                "ConsumerDescription"
            ]
            status = desc["ConsumerStatus"]
            if status == "ACTIVE":
                log.info("stream consumer %s is ACTIVE (%s)", name, desc["ConsumerARN"])
                return str(desc["ConsumerARN"])
            delay = CONSUMER_POLL_INTERVAL  # CREATING, or DELETING before a new registration
            ours.seen()
        except Exception as exc:
            code = error_code(exc)
            if code == "ResourceNotFoundException":
                ours.not_found(exc)
            if code == "ResourceNotFoundException" and not ours.live:
                try:
                    await client.register_stream_consumer(StreamARN=arn, ConsumerName=name)
                    log.info("registered stream consumer %s on %s", name, arn)
                    ours.made()
                    continue
                except Exception as reg_exc:
                    exc, code = reg_exc, error_code(reg_exc)
                    refused = refused + 1 if code == "LimitExceededException" else 0
                    if refused >= REGISTER_REFUSALS:
                        raise RequestError(
                            f"registering stream consumer {name} on {arn} was refused "
                            f"{refused} times in a row (LimitExceededException): the stream "
                            "may have its 20 registered consumers (ListStreamConsumers names "
                            "them); deregister one, or read by polling"
                        ) from reg_exc
            if code == "ResourceNotFoundException" and ours.live:
                delay = CONSUMER_POLL_INTERVAL  # registered, not yet visible
            else:
                mapped = map_aws_error(exc, f"registering stream consumer {name} on {arn}")
                if not mapped.retriable:
                    raise mapped from exc
                delay = backoff.next_delay()
                log.log(
                    logging.WARNING if refused else logging.INFO,
                    "%s; retrying in %.2fs",
                    mapped,
                    delay,
                )
        await sleep(delay)


async def deregister_consumer(
    client: Any,
    stream: dict[str, str],
    consumer_name: str,
    *,
    registry: ConsumerRegistry | None = None,
) -> bool:
    """Deregister consumer ``consumer_name`` from ``stream`` (a worker's shutdown option; every
    worker of the application shares the consumer, so only the last one should call this).
    True if it was deregistered, False if it did not exist. Raises mapped errors otherwise."""
    arn = await stream_arn(client, stream)
    (registry or CONSUMERS).forget(arn, consumer_name)
    try:
        await client.deregister_stream_consumer(StreamARN=arn, ConsumerName=consumer_name)
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise map_aws_error(exc, f"deregistering stream consumer {consumer_name}") from exc
    log.info("deregistered stream consumer %s from %s", consumer_name, arn)
    return True
