"""The DynamoDB plumbing under the lease table: one client call on the table with its errors
mapped, a conditional write retried (and judged after an unknown outcome), paged reads."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from checkpoint.base.errors import (
    DependencyError,
    MalformedAnswerError,
    ResourceNotFoundError,
    ThrottledError,
    error_code,
    map_aws_error,
)
from checkpoint.base.retry import RetryPolicy, call_with_retry
from checkpoint.stores.capacity import CapacityMeter, item_size, write_units
from checkpoint.stores.dynamo_expr import Expr

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

T = TypeVar("T")

# Requests on items, which report the capacity they consumed (the table's own calls do not).
_METERED = frozenset({"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Scan", "Query"})

log = logging.getLogger(__name__)


class DynamoCalls:
    """Calls on one table through boto3's low-level (thread-safe) client."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        retry: RetryPolicy,
        sleep: Callable[[float], None],
    ) -> None:
        self._client = client
        self._table = table_name
        self._retry = retry
        self._sleep = sleep
        self.capacity = CapacityMeter()  # what this table's requests cost, by operation

    @property
    def table_name(self) -> str:
        return self._table

    def _retried(self, what: str, attempt: Callable[[], T]) -> T:
        return call_with_retry(attempt, what=what, policy=self._retry, sleep=self._sleep)

    def _call(
        self, operation: str, *, tolerate: frozenset[str] = frozenset(), **kwargs: Any
    ) -> Any:
        """One client call on this table; an error whose code is in ``tolerate`` returns None,
        a failed ConditionExpression returns a ``_Lost``."""
        method = getattr(self._client, _snake(operation))
        metered = operation in _METERED
        if metered:
            kwargs["ReturnConsumedCapacity"] = "TOTAL"
        try:
            response = method(TableName=self._table, **kwargs)
        except ClientError as exc:
            code = error_code(exc)
            if code in tolerate:
                return None
            if code == "ConditionalCheckFailedException" and "ConditionExpression" in kwargs:
                retried = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
                found: Any = exc.response.get("Item")
                size = item_size(found) if found else 0  # charged, but not reported
                self.capacity.add(operation, write_units(size, size))
                return _Lost(found, bool(retried))
            error = map_aws_error(exc, f"{operation} on table {self._table!r}")
            if isinstance(error, ResourceNotFoundError):
                error.resource = self._table
            raise error from exc
        except BotoCoreError as exc:
            raise map_aws_error(exc, f"{operation} on table {self._table!r}") from exc
        if metered:
            self.capacity.add_consumed(operation, response)
        return response

    def _write(
        self,
        what: str,
        operation: str,
        build: Callable[[Expr], dict[str, Any]],
        won: Callable[[dict[str, Any]], T],
        landed: Callable[[dict[str, Any] | None], T | None],
    ) -> T | None:
        """A conditional write, retried; None if it lost. ``build`` makes the request, ``won``
        reads the response of a win, ``landed`` judges the item found by a failed condition
        after an unknown outcome (a result if it holds this write, else None)."""
        unknown = False

        def once() -> T | None:
            nonlocal unknown
            expr = Expr()
            request = build(expr)
            try:
                response = self._call(
                    operation, ReturnValuesOnConditionCheckFailure="ALL_OLD", **request,
                    **expr.kwargs(),
                )  # fmt: skip
            except DependencyError as exc:
                # A throttle refused the write before it was applied, unless botocore had tried
                # it before (a client with SDK retries): an earlier try may have landed.
                throttled = isinstance(exc, ThrottledError) and not _tried_before(exc)
                unknown = unknown or not throttled
                raise
            if not isinstance(response, _Lost):
                try:
                    return won(response)
                except MalformedAnswerError:  # a 200 without the item (a proxy's {}): the
                    unknown = True  # write may have landed; the retry judges it as after a
                    raise  # timeout
            if not (unknown or response.retried):
                return None
            result = landed(response.item)
            if result is not None:
                log.info("%s: an earlier attempt had landed", what)
            return result

        return self._retried(what, once)

    def _every_item(self, what: str, operation: str, **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a Scan or Query, retried page by page: a page that fails is asked
        again, not the pages before it (a throttled scan of a big table read its first pages
        again at each retry, spending the read units that throttled it, and a retry budget
        counted whole scans)."""
        items: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None

        def rest() -> list[dict[str, Any]]:
            nonlocal start
            while True:
                if start is not None:
                    kwargs["ExclusiveStartKey"] = start
                page = self._call(operation, **kwargs)
                items.extend(page.get("Items", []))
                start = page.get("LastEvaluatedKey") or None
                if start is None:
                    return items

        return self._retried(what, rest)

    def _pages(self, operation: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Every item of a Scan or Query, page by page, as they are asked for (a failed page
        fails the whole: for a reader that may stop early, ``is_empty``)."""
        while True:
            page = self._call(operation, **kwargs)
            yield from page.get("Items", [])
            kwargs["ExclusiveStartKey"] = page.get("LastEvaluatedKey")
            if not kwargs["ExclusiveStartKey"]:
                return


def written_item(response: dict[str, Any]) -> dict[str, Any]:
    """The item an UpdateItem with ReturnValues=ALL_NEW returns. Raises MalformedAnswerError for
    a 200 without it (``{}`` or an HTML page from a proxy): the write's outcome is unknown."""
    item = response.get("Attributes")
    if not isinstance(item, dict):
        raise MalformedAnswerError("UpdateItem answered without the item it wrote")
    return item


class _Lost:
    """A failed condition: the item as it stood (None if absent), and whether botocore had
    retried the request internally (so an earlier try of it may have landed)."""

    def __init__(self, item: dict[str, Any] | None, retried: bool) -> None:
        self.item = item
        self.retried = retried


def _snake(operation: str) -> str:
    """``UpdateItem`` -> ``update_item``: boto3's method for an API operation."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")


def _tried_before(exc: BaseException) -> bool:
    """Whether botocore sent the call more than once before ``exc`` (its own retries)."""
    cause = exc.__cause__
    if not isinstance(cause, ClientError):
        return False
    return bool(cause.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))
