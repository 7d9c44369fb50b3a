"""Counting the commands a thread sends to the driver's JVM (py4j), for tests that bound them:
each costs the driver's Python tens of microseconds, on every batch and read round."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def jvm_calls(spark: Any) -> Iterator[list[int]]:
    """Counts the commands this thread sends to the driver's JVM inside the block. Python's
    collector is off meanwhile: it would free earlier objects' JVM twins there, a command each."""
    client = spark.sparkContext._gateway._gateway_client
    count = [0]
    real = client.send_command
    gc.collect()
    gc.disable()

    me = threading.get_ident()

    def counted(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:  # not another test's threads still at work
            count[0] += 1
        return real(*args, **kwargs)

    client.send_command = counted
    try:
        yield count
    finally:
        del client.send_command  # the class's method again
        gc.enable()
