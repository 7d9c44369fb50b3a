"""Plain arguments go to the driver's JVM without the search through py4j's converters.

PySpark's gateway converts arguments automatically: before an argument that is not a Java object
is sent, py4j asks each registered input converter in turn (lists, sets, maps, NumPy arrays and
scalars, dates, times, intervals: ten of them, some through ``inspect.getattr_static``) whether it
takes it. For a string that search is ~16 us of the driver's Python CPU an argument (a call with
one string argument: 53 us, 37 without; ``bench/bench_jvm_arguments.py``), and the calls the
daemon makes each batch and read round pass mostly strings: column names, SQL text, options, job
tags and descriptions (a read job's plan, a batch's frame, the Parquet writer: 0.72x-0.89x). No
converter takes a ``str``, ``int``, ``float``, ``bool`` or ``None``, so one registered first that
claims exactly those types (not their subclasses: a NumPy scalar still reaches its converter)
and hands them on unchanged sends the JVM the same command, sooner.

``py4j.protocol.register_input_converter`` is py4j's own way to add one; the list is the process's
(every gateway with automatic conversion), so the user's calls from a ``foreachBatch`` function
take the same shortcut, with the same results.
"""

from __future__ import annotations

import threading
from typing import Any

PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


class PlainArguments:
    """An input converter that claims plain Python values and returns them unchanged."""

    def can_convert(self, value: Any) -> bool:
        return type(value) in PLAIN_TYPES

    def convert(self, value: Any, gateway_client: Any) -> Any:
        return value


PLAIN_ARGUMENTS = PlainArguments()
_lock = threading.Lock()


def pass_plain_arguments() -> bool:
    """Put ``PLAIN_ARGUMENTS`` first among py4j's input converters, once per process; False when
    py4j is not installed (a Spark Connect client has no JVM to call)."""
    try:
        from py4j import protocol  # type: ignore[import-untyped]
    except ImportError:
        return False
    with _lock:
        if not any(c is PLAIN_ARGUMENTS for c in protocol.INPUT_CONVERTER):
            protocol.register_input_converter(PLAIN_ARGUMENTS, prepend=True)
    return True
