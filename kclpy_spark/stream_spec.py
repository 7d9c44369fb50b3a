"""One stream of a multi-stream application (a ``[[streams]]`` table of the configuration)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition

STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
# arn:<partition>:kinesis:<region>:<account>:stream/<name> (the name as STREAM_NAME)
STREAM_ARN = re.compile(r"^arn:[a-z-]+:kinesis:[a-z0-9-]+:\d{12}:stream/([a-zA-Z0-9_.-]{1,128})$")


def arn_stream_name(arn: object) -> str | None:
    """The stream name a Kinesis stream ARN carries; None for anything else."""
    match = STREAM_ARN.match(arn) if isinstance(arn, str) else None
    return match.group(1) if match else None


def check_stream(
    name: object, arn: object, where: str, keys: tuple[str, str] = ("stream_name", "stream_arn")
) -> None:
    """Raise ConfigError (one line, naming ``where`` and the ``keys`` as the user wrote them)
    unless ``name`` and ``arn`` are each None or a valid stream name / Kinesis stream ARN, and
    name the same stream when both are given."""
    name_key, arn_key = keys
    if name is not None and (not isinstance(name, str) or not STREAM_NAME.match(name)):
        raise ConfigError(f"{where} {name_key!r} is not a valid stream name: {name!r}")
    if arn is None:
        return
    match = STREAM_ARN.match(arn) if isinstance(arn, str) else None
    if match is None:
        raise ConfigError(
            f"{where} {arn_key!r} is not a Kinesis stream ARN "
            f"(arn:aws:kinesis:<region>:<account>:stream/<name>): {arn!r}"
        )
    if name is not None and match.group(1) != name:
        raise ConfigError(
            f"{where} {name_key!r} {name!r} and {arn_key!r} {arn!r} name different streams: "
            "give one of them"
        )


@dataclass(frozen=True)
class StreamSpec:
    """One stream of a multi-stream application, as configured."""

    stream_name: str | None = None
    stream_arn: str | None = None
    initial_position: InitialPosition | None = None  # None: the application's

    def __post_init__(self) -> None:
        for name in ("stream_name", "stream_arn"):  # "" is no value, as at the top level
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        if not self.stream_name and not self.stream_arn:
            raise ConfigError("each [[streams]] entry needs 'stream_name' or 'stream_arn'")
        check_stream(self.stream_name, self.stream_arn, "[[streams]]")

    @property
    def label(self) -> str:
        return self.stream_arn or str(self.stream_name)

    @property
    def name(self) -> str:
        """The stream's name (from its ARN when only that is given)."""
        name = self.stream_name or arn_stream_name(self.stream_arn)
        assert name is not None  # checked in __post_init__
        return name

    @property
    def account(self) -> str | None:
        """The stream's account, when its ARN names it."""
        return str(self.stream_arn).split(":")[4] if self.stream_arn else None

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
