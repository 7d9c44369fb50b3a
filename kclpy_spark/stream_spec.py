"""One stream of a multi-stream application (a ``[[streams]]`` table of the configuration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition


@dataclass(frozen=True)
class StreamSpec:
    """One stream of a multi-stream application, as configured."""

    stream_name: str | None = None
    stream_arn: str | None = None
    initial_position: InitialPosition | None = None  # None: the application's

    def __post_init__(self) -> None:
        if not self.stream_name and not self.stream_arn:
            raise ConfigError("each [[streams]] entry needs 'stream_name' or 'stream_arn'")

    @property
    def label(self) -> str:
        return self.stream_arn or str(self.stream_name)

    @property
    def request(self) -> dict[str, str]:
        """The stream argument of Kinesis calls."""
        return (
            {"StreamARN": self.stream_arn}
            if self.stream_arn
            else {"StreamName": str(self.stream_name)}
        )

    @classmethod
    def parse(cls, value: Any, where: str) -> StreamSpec:
        if isinstance(value, StreamSpec):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: each [[streams]] entry must be a table")
        unknown = set(value) - {"stream_name", "stream_arn", "initial_position"}
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) in [[streams]]: {', '.join(sorted(unknown))}"
            )
        position = value.get("initial_position")
        try:
            parsed = InitialPosition.parse(str(position)) if position is not None else None
        except ValueError as exc:
            raise ConfigError(f"{where}: [[streams]] initial_position: {exc}") from None
        return cls(value.get("stream_name"), value.get("stream_arn"), parsed)
