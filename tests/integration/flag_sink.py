"""A Spark sink function for worker processes in tests: it fails while the file named by
``KCLPY_TEST_FLAG`` exists (an output folder remounted read-only, a dependency down) and
otherwise appends each row's data to ``KCLPY_TEST_OUT`` (one line per row)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def fails_while_flagged(df: Any, batch_id: int) -> None:
    if Path(os.environ["KCLPY_TEST_FLAG"]).exists():
        raise RuntimeError("the output is not writable (the test's flag file exists)")
    rows = df.select("data").collect()
    with open(os.environ["KCLPY_TEST_OUT"], "a", encoding="utf-8") as out:
        out.writelines(bytes(row["data"]).decode() + "\n" for row in rows)
