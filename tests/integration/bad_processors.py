"""Processors that a user might write by mistake (for test_bad_input.py). Not a test module."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from kclpy_spark.demo.samples import JsonLinesProcessor
from kclpy_spark.processor import InitializeInput, ProcessRecordsInput, Record, RecordProcessor

log = logging.getLogger(__name__)


class NeedsArguments(RecordProcessor):
    def __init__(self, path: str) -> None:
        self.path = path

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        return None


class DuckTyped:
    """Has process_records, but neither subclasses RecordProcessor nor has its other methods."""

    def initialize(self, initialize_input: object) -> None:
        return None

    def process_records(self, process_records_input: object) -> None:
        return None


class FailsToInitialize(RecordProcessor):
    """Starts fine; every lease's initialize fails (a database it needs is down)."""

    def initialize(self, initialize_input: object) -> None:
        raise RuntimeError("no database")

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        return None


class Yields(RecordProcessor):
    """process_records written as a generator: calling it runs none of its body."""

    def process_records(self, process_records_input: ProcessRecordsInput) -> Iterator[Record]:
        yield from process_records_input.records


class ExitsInInit(RecordProcessor):
    """``sys.exit(0)`` in ``__init__``: it ended the daemon with status 0."""

    def __init__(self) -> None:
        raise SystemExit(0)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        return None


class YieldsAsync(RecordProcessor):
    """An ``async def`` process_records that yields: an async generator, whose body never ran."""

    async def process_records(self, process_records_input: ProcessRecordsInput) -> Any:
        for record in process_records_input.records:
            yield record


class LogsItsCredentials(JsonLinesProcessor):
    """Writes records as the demo's processor does, and logs the credentials it runs with at
    each lease's start, in a message and in an exception's (test_operations.py: the log shows
    them redacted)."""

    def initialize(self, initialize_input: InitializeInput) -> None:
        super().initialize(initialize_input)
        key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
        log.warning("running as %s with secret %s", key, secret)
        try:
            raise RuntimeError(f"login failed for {key}:{secret}")
        except RuntimeError:
            log.exception("a lookup of %s failed", secret)
