"""DynamoDB expressions with ``#aN`` name and ``:vN`` value placeholders, for the lease table's
conditional writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores.dynamo_codec import (
    CHECKPOINT,
    CHECKPOINT_OWNER,
    CHECKPOINT_SUB,
    LEASE_COUNTER,
    LEASE_KEY,
    LEASE_OWNER,
    n_value,
    s_value,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef


class Expr:
    """Builds one request's expressions with ``#aN`` name and ``:vN`` value placeholders."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, AttributeValueTypeDef] = {}

    def name(self, attribute: str) -> str:
        placeholder = f"#a{len(self.names)}"
        self.names[placeholder] = attribute
        return placeholder

    def value(self, value: AttributeValueTypeDef) -> str:
        placeholder = f":v{len(self.values)}"
        self.values[placeholder] = value
        return placeholder

    def absent(self, attribute: str) -> str:
        return f"attribute_not_exists({self.name(attribute)})"

    def equals(self, attribute: str, value: AttributeValueTypeDef) -> str:
        return f"{self.name(attribute)} = {self.value(value)}"

    def exists(self) -> str:
        return f"attribute_exists({self.name(LEASE_KEY)})"

    def counter_is(self, counter: int) -> str:
        return self.equals(LEASE_COUNTER, n_value(counter))

    def checkpoint_is(self, checkpoint: ExtendedSequenceNumber) -> str:
        """The stored checkpoint is ``checkpoint`` (an absent sub-sequence number counts as 0)."""
        sub = checkpoint.sub_sequence_number
        sub_ok = self.equals(CHECKPOINT_SUB, n_value(sub))
        if sub == 0:
            sub_ok = f"({sub_ok} OR {self.absent(CHECKPOINT_SUB)})"
        return f"{self.equals(CHECKPOINT, s_value(checkpoint.sequence_number))} AND {sub_ok}"

    def owner_is(self, owner: str | None) -> str:
        """The stored lease owner equals ``owner`` (None: the lease has no owner)."""
        return (
            self.absent(LEASE_OWNER) if owner is None else self.equals(LEASE_OWNER, s_value(owner))
        )

    def checkpoint_owner_is(self, owner: str | None) -> str:
        """The stored checkpoint owner equals ``owner`` (None: no handoff pending)."""
        if owner is None:
            return self.absent(CHECKPOINT_OWNER)
        return self.equals(CHECKPOINT_OWNER, s_value(owner))

    def actual_owner_is(self, owner: str | None) -> str:
        """The worker processing the lease is ``owner``: the checkpoint owner during a handoff,
        else the lease owner (``Lease.actual_owner``)."""
        if owner is None:
            return f"{self.owner_is(None)} AND {self.checkpoint_owner_is(None)}"
        return (
            f"({self.checkpoint_owner_is(owner)} OR "
            f"({self.checkpoint_owner_is(None)} AND {self.owner_is(owner)}))"
        )

    def update(self, sets: dict[str, AttributeValueTypeDef], removes: list[str]) -> str:
        expression = "SET " + ", ".join(self.equals(k, v) for k, v in sets.items())
        if removes:
            expression += " REMOVE " + ", ".join(self.name(k) for k in removes)
        return expression

    def kwargs(self) -> dict[str, Any]:
        """ExpressionAttributeNames/Values for the request (boto3 rejects empty maps)."""
        out: dict[str, Any] = {}
        if self.names:
            out["ExpressionAttributeNames"] = self.names
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        return out
