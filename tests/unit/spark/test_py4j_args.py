"""Which arguments skip py4j's converters (``py4j_args.PlainArguments``): exactly the plain types,
never a subclass or a collection, which their own converters must still see."""

from __future__ import annotations

import datetime
import enum
from typing import Any

import pytest

from kclpy_spark.spark.py4j_args import PLAIN_ARGUMENTS


class Colour(enum.StrEnum):
    RED = "red"


class Count(int):
    pass


@pytest.mark.parametrize("value", ["", "text", 0, -7, 2**70, 1.5, True, False, None])
def test_plain_values_are_claimed_and_passed_on_unchanged(value: Any) -> None:
    assert PLAIN_ARGUMENTS.can_convert(value)
    assert PLAIN_ARGUMENTS.convert(value, object()) is value


@pytest.mark.parametrize(
    "value",
    [Colour.RED, Count(3), b"bytes", bytearray(b"x"), [1], (1,), {1}, {"a": 1},
     datetime.date(2026, 12, 4), datetime.datetime(2026, 12, 4), datetime.timedelta(1)],
)  # fmt: skip
def test_anything_else_is_left_to_py4js_own_converters(value: Any) -> None:
    assert not PLAIN_ARGUMENTS.can_convert(value)


def test_a_numpy_scalar_is_left_to_its_converter() -> None:
    np = pytest.importorskip("numpy")
    assert not PLAIN_ARGUMENTS.can_convert(np.float64(1.0))  # a float subclass
    assert not PLAIN_ARGUMENTS.can_convert(np.int64(1))
