"""Counts of what a test owns, for the tests that bound resources: the suite's test processes
run many files, and other tests' leftovers (a Spark gateway's pooled sockets, threads that end
late) come and go in the same process."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def descriptors_under(folder: Path) -> int:
    """The process's descriptors open on files under ``folder`` (a store's database and log)."""
    prefix = f"{folder.resolve()}/"
    count = 0
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            count += os.readlink(f"/proc/self/fd/{name}").startswith(prefix)
    return count
