"""What the lease table costs: requests and DynamoDB capacity units, counted per operation.

The DynamoDB store asks every data-plane request for its consumed capacity and adds what DynamoDB
answers to a ``CapacityMeter``. A write whose condition failed gets no such answer, though
DynamoDB charges it; it is counted with ``write_units`` of the item found (DynamoDB's own rule
for the units of a write). The same sizing rules let the other stores, or a simulation, estimate
what a request of theirs would cost on DynamoDB (``item_size``, ``read_units``, ``write_units``).

Sizes follow the DynamoDB developer guide ("Item sizes and formats"; "Read/write capacity
mode"): an attribute costs its name's UTF-8 length plus its value's size; a read unit is 4 KB read
strongly consistent (half for an eventually consistent read), a Scan or Query page rounded up
once over the sum of its items; a write unit is 1 KB of the larger of the item before and after.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

READ_UNIT_BYTES = 4096
WRITE_UNIT_BYTES = 1024

# Operations whose units are read units; every other one counted here writes.
READ_OPERATIONS = frozenset({"GetItem", "Scan", "Query", "BatchGetItem", "TransactGetItems"})


def _value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one attribute value in DynamoDB's wire shape (``{"S": ...}``, ``{"N": ...}``)."""
    kind, inner = next(iter(value.items()))
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        return _number_size(str(inner))
    if kind == "B":
        return len(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(s).encode()) for s in inner)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in inner)
    if kind == "BS":
        return sum(len(b) for b in inner)
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in inner)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + _value_size(v) for k, v in inner.items())
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")


def _number_size(text: str) -> int:
    """About one byte per two significant digits, plus one."""
    digits = text.lstrip("+-").split("e")[0].split("E")[0].replace(".", "").strip("0") or "0"
    return math.ceil(len(digits) / 2) + 1


def item_size(item: Mapping[str, Mapping[str, Any]]) -> int:
    """The size DynamoDB bills for an item: every attribute's name and value."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def read_units(sizes: Iterable[int], *, consistent: bool = True) -> float:
    """Units of one GetItem (one size, 0 for an absent item) or one Scan or Query page (the sizes of
    every item it read): the total rounded up to 4 KB, at least one unit; half if not
    consistent."""
    units = max(1, math.ceil(sum(sizes) / READ_UNIT_BYTES))
    return float(units) if consistent else units / 2


def write_units(before: int, after: int) -> float:
    """Units of one PutItem, UpdateItem or DeleteItem: the larger item, rounded up to 1 KB, at
    least one unit (a write whose condition failed: the item found as both)."""
    return float(max(1, math.ceil(max(before, after) / WRITE_UNIT_BYTES)))


def split_units(usage: Mapping[str, Usage]) -> tuple[float, float]:
    """(read units, write units) of usage by operation."""
    reads = sum(u.units for op, u in usage.items() if op in READ_OPERATIONS)
    writes = sum(u.units for op, u in usage.items() if op not in READ_OPERATIONS)
    return reads, writes


@dataclass(frozen=True)
class Usage:
    """Totals of one operation."""

    requests: int = 0
    units: float = 0.0

    def plus(self, units: float) -> Usage:
        return Usage(self.requests + 1, self.units + units)


class CapacityMeter:
    """Thread-safe totals of requests and capacity units by operation (``"UpdateItem"``, ...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, Usage] = {}

    def add(self, operation: str, units: float) -> None:
        with self._lock:
            self._usage[operation] = self._usage.get(operation, Usage()).plus(units)

    def add_consumed(self, operation: str, response: Mapping[str, Any] | None) -> None:
        """One answered request: its ``ConsumedCapacity`` (0 units if DynamoDB gave none)."""
        consumed = (response or {}).get("ConsumedCapacity") or {}
        self.add(operation, float(consumed.get("CapacityUnits", 0.0)))

    def snapshot(self) -> dict[str, Usage]:
        with self._lock:
            return dict(self._usage)
