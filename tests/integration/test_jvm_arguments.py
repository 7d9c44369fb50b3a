"""Plain arguments reach the driver's JVM without py4j's search through its input converters
(``py4j_args``), unchanged; collections and NumPy values still go through their converters."""

from __future__ import annotations

from typing import Any

from kclpy_spark.spark.py4j_args import PLAIN_ARGUMENTS, pass_plain_arguments


class Spy:
    """A converter last in line: it sees every argument no converter before it claimed."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def can_convert(self, value: Any) -> bool:
        self.seen.append(value)
        return False

    def convert(self, value: Any, gateway_client: Any) -> Any:
        raise AssertionError("never claims")


def test_plain_arguments_skip_the_converters_and_arrive_unchanged(spark: Any) -> None:
    import numpy as np
    from py4j import protocol

    jvm = spark.sparkContext._jvm
    converters = spark.sparkContext._gateway._gateway_client.converters
    assert converters[0] is PLAIN_ARGUMENTS  # the session fixture started as the sink's do
    spy = Spy()
    protocol.register_input_converter(spy)  # appended: last
    try:
        text = jvm.java.lang.StringBuilder()
        for value in ("x", 7, 2**40, 2.5, True):
            text.append(value)
        assert text.toString() == f"x7{2**40}2.5true"
        assert jvm.java.util.Objects.isNull(None)
        assert spy.seen == [], "a plain argument went through the converters"
        # What the converters are for still reaches them.
        assert jvm.java.util.ArrayList([1, 2, 3]).size() == 3
        assert jvm.java.util.HashMap({"a": 1}).get("a") == 1
        text.append(np.int64(5))  # NumPy's converter, before the spy, takes it
        assert text.toString().endswith("5")
        assert spy.seen == []  # their own calls to the JVM (ArrayList.add ...) passed too
    finally:
        protocol.INPUT_CONVERTER.remove(spy)


def test_the_converter_is_registered_once(spark: Any) -> None:
    from py4j import protocol

    assert pass_plain_arguments() and pass_plain_arguments()
    assert sum(c is PLAIN_ARGUMENTS for c in protocol.INPUT_CONVERTER) == 1
    assert protocol.INPUT_CONVERTER[0] is PLAIN_ARGUMENTS
