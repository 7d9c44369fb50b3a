"""The DynamoDB lease table's own setup: create it if allowed (the KCL's schema, on-demand, with
the owner index), wait until it and its index are ACTIVE, check its key schema, set its TTL; and
the name of the coordination table beside it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from checkpoint.base.clock import Clock
from checkpoint.base.errors import DependencyError, InvalidStateError, ResourceNotFoundError
from checkpoint.stores import dynamo_codec as codec

log = logging.getLogger(__name__)

# How often to poll DescribeTable while a new table and its index become ACTIVE.
_POLL_SECONDS = 0.5

Call = Callable[..., Any]

# kclpy-spark's coordination records live in a table of their own beside the lease table.
COORDINATION_SUFFIX = "-KclpySparkState"


def coordination_table_of(lease_table: str) -> str:
    """The coordination table beside ``lease_table``."""
    return lease_table + COORDINATION_SUFFIX


class TableSetup:
    """One ensure-table pass over ``call`` (the store's single-attempt client call)."""

    def __init__(
        self,
        name: str,
        call: Call,
        *,
        create: bool,
        ttl_attribute: str | None,
        clock: Clock,
        sleep: Callable[[float], None],
        create_timeout: float,
        definition: dict[str, Any] | None = None,
        what: str = "lease table",
    ) -> None:
        self.name = name
        self._definition = codec.TABLE_DEFINITION if definition is None else definition
        self._what = what
        self._call = call
        self._create = create
        self._ttl_attribute = ttl_attribute
        self._clock = clock
        self._sleep = sleep
        self._create_timeout = create_timeout

    def _describe(self) -> dict[str, Any] | None:
        response = self._call("DescribeTable", tolerate=frozenset({"ResourceNotFoundException"}))
        return None if response is None else dict(response["Table"])

    def ensure(self) -> None:
        table = self._describe()
        if table is None:
            if not self._create:
                raise ResourceNotFoundError(
                    f"{self._what} {self.name!r} does not exist and creating it is disabled"
                )
            self._create_table()
            table = self._wait_active()
        problem = codec.key_schema_problem(table)
        if problem is not None:
            raise InvalidStateError(f"table {self.name!r} is not a {self._what}: {problem}")
        if table.get("TableStatus") != "ACTIVE":
            self._wait_active()
        if self._ttl_attribute is not None:
            self._ensure_ttl(self._ttl_attribute)

    def _create_table(self) -> None:
        created = self._call(
            "CreateTable",
            tolerate=frozenset({"ResourceInUseException"}),  # another worker is creating it
            **self._definition,
        )
        if created is not None:
            log.info("created %s %r", self._what, self.name)

    def _wait_active(self) -> dict[str, Any]:
        deadline = self._clock.monotonic() + self._create_timeout
        while True:
            table = self._describe()
            if table is not None and table.get("TableStatus") == "ACTIVE":
                indexes = table.get("GlobalSecondaryIndexes", [])
                if all(i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes):
                    return table
            if self._clock.monotonic() >= deadline:
                raise DependencyError(
                    f"{self._what} {self.name!r} is not ACTIVE after {self._create_timeout:.0f}s"
                )
            self._sleep(_POLL_SECONDS)

    def _ensure_ttl(self, attribute: str) -> None:
        description = self._call("DescribeTimeToLive").get("TimeToLiveDescription", {})
        if description.get("TimeToLiveStatus") in {"ENABLED", "ENABLING"}:
            if description.get("AttributeName") != attribute:
                raise InvalidStateError(
                    f"table {self.name!r} has TTL on attribute "
                    f"{description.get('AttributeName')!r}, not {attribute!r}"
                )
            return
        self._call(
            "UpdateTimeToLive",
            TimeToLiveSpecification={"Enabled": True, "AttributeName": attribute},
        )
