"""``status --serve [HOST:]PORT``: where the page listens (this machine only unless a host is
given), and a one-line error for anything else."""

from __future__ import annotations

import pytest

from checkpoint.base.errors import ConfigError
from kclpy_spark.board.standalone import parse_address


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9000", ("0.0.0.0", 9000)),
        (":9000", ("127.0.0.1", 9000)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "http", "host:port", "70000", "-1", "host:"])
def test_bad_addresses_are_one_line(text: str) -> None:
    with pytest.raises(ConfigError, match="expected PORT or HOST:PORT"):
        parse_address(text)
