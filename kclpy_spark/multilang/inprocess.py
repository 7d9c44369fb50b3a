"""Run a processor written against amazon_kclpy's base classes inside the worker: the fast path.

``KclpyProcessorAdapter`` wraps one instance of the application's class (chosen by its
``version`` attribute, as ``amazon_kclpy.kcl.KCLProcess`` does) and presents it as our
RecordProcessor, so no child process, JSON or base64 round trip is involved:

* version 3: each method gets the same input with the same attributes as under amazon-kclpy
  (duck-typed equivalents: our InitializeInput, ProcessRecordsInput, ... and Record, which has
  amazon-kclpy's properties and its ``record["partitionKey"]`` access);
* version 2: as amazon-kclpy's V2toV3Processor: ``lease_lost`` -> ``shutdown(ShutdownInput
  ZOMBIE)`` with a checkpointer that always raises, ``shard_ended`` -> ``shutdown(ShutdownInput
  TERMINATE)`` with the real one;
* version 1: as V1toV2Processor in front of that: ``initialize(shard_id)``,
  ``process_records(records, checkpointer)``, ``shutdown(checkpointer, reason)``,
  ``shutdown_requested(checkpointer)``.

The checkpointer handed to the application raises ``amazon_kclpy.kcl.CheckpointError`` (same
``.value``) when amazon_kclpy is importable, so ``except kcl.CheckpointError`` works unchanged;
without amazon_kclpy it raises our ``CheckpointError``. As the KCL does after a graceful-shutdown
request, the worker follows ``shutdown_requested`` with the lease-lost call (consumer.py).

Errors: amazon-kclpy's KCLProcess catches every exception from the application, prints it and
reports the call done, so the daemon moves on. The adapter does the same by default (logging the
traceback with the shard id), so applications behave as they did; ``retry_failed_batches=True``
lets an exception reach the worker instead, whose policy offers the batch again and parks the
lease after repeated failures (no record is skipped).

Methods run in a worker thread (they are plain methods), one lease per instance, several leases
at once in one process: module-level state in the application is shared between its shards here,
unlike under the MultiLangDaemon's process per shard.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from checkpoint.base.errors import ConfigError
from checkpoint.checkpointer import LeaseLostCheckpointer
from kclpy_spark.multilang.protocol import coerce_sequence, coerce_sub_sequence
from kclpy_spark.processor import (
    Checkpointer,
    CheckpointError,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    ShardEndedInput,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)

ZOMBIE = "ZOMBIE"
TERMINATE = "TERMINATE"


def _kclpy_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def kclpy_checkpoint_error() -> type[Exception] | None:
    """amazon_kclpy's CheckpointError class, or None if amazon_kclpy is not importable."""
    module = _kclpy_module("amazon_kclpy.checkpoint_error")
    return None if module is None else module.CheckpointError


class KclpyCheckpointer:
    """Our checkpointer behind amazon_kclpy's ``Checkpointer`` API and exception class."""

    def __init__(self, inner: Checkpointer, error_class: type[Exception] | None) -> None:
        self._inner = inner
        self._error_class = error_class

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None:
        """As the subprocess path: the values as the daemon would read them from the app's
        JSON (a sequence number given as an int is its digits)."""
        seq, sub = coerce_sequence(sequence_number), coerce_sub_sequence(sub_sequence_number)
        try:
            self._inner.checkpoint(seq, sub)
        except CheckpointError as exc:
            if self._error_class is None:
                raise
            raise self._error_class(exc.value) from exc


@dataclass(frozen=True)
class ShutdownInput:
    """amazon_kclpy.messages.ShutdownInput's shape, used when amazon_kclpy is not importable."""

    reason: str
    checkpointer: Any
    action: ClassVar[str] = "shutdown"


class KclpyProcessorAdapter(RecordProcessor):
    """One amazon_kclpy-style processor instance (version 1, 2 or 3) as our RecordProcessor."""

    def __init__(self, processor: Any, *, retry_failed_batches: bool = False) -> None:
        version = getattr(processor, "version", None)
        if version not in (1, 2, 3):
            raise ConfigError(
                f"{type(processor).__name__} is not an amazon_kclpy record processor: its "
                f"'version' attribute is {version!r} (1, 2 or 3 expected)"
            )
        self.processor = processor
        self.kclpy_version: int = version
        self._retry = retry_failed_batches
        self._error_class = kclpy_checkpoint_error()
        self._messages = _kclpy_module("amazon_kclpy.messages")
        self._shard_id = "?"

    # --- helpers ---------------------------------------------------------------------------------

    def _cp(self, checkpointer: Checkpointer) -> KclpyCheckpointer:
        return KclpyCheckpointer(checkpointer, self._error_class)

    def _shutdown_input(self, reason: str, checkpointer: Any) -> Any:
        if self._messages is not None:
            if reason == ZOMBIE:
                return self._messages.ShutdownInput.zombie()
            return self._messages.ShutdownInput.terminate(checkpointer)
        if reason == ZOMBIE:
            return ShutdownInput(ZOMBIE, LeaseLostCheckpointer())
        return ShutdownInput(TERMINATE, checkpointer)

    def _zombie_checkpointer(self) -> Any:
        if self._messages is not None:
            return self._messages.LeaseLostCheckpointer()
        return LeaseLostCheckpointer()

    def _dispatch(self, name: str, *args: Any, always_swallow: bool = False) -> None:
        method: Callable[..., Any] | None = getattr(self.processor, name, None)
        if method is None:
            log.debug("shard %s: the processor has no %s method", self._shard_id, name)
            return
        try:
            method(*args)
        except Exception:
            if self._retry and not always_swallow:
                raise
            log.exception(
                "shard %s: the processor's %s raised; as under amazon-kclpy, the call counts as "
                "done",
                self._shard_id,
                name,
            )

    # --- the RecordProcessor API -----------------------------------------------------------------

    def initialize(self, initialize_input: InitializeInput) -> None:
        self._shard_id = initialize_input.shard_id
        if self.kclpy_version == 1:
            self._dispatch("initialize", initialize_input.shard_id)
        else:
            self._dispatch("initialize", initialize_input)

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        checkpointer = self._cp(process_records_input.checkpointer)
        # A list of its own, as amazon-kclpy parses each call's: an app may empty it (the
        # consumer's own list then lost its last record, and a retry had none to offer).
        records = list(process_records_input.records)
        if self.kclpy_version == 1:
            self._dispatch("process_records", records, checkpointer)
        else:
            self._dispatch(
                "process_records",
                ProcessRecordsInput(records, process_records_input.millis_behind_latest,
                                    checkpointer),
            )  # fmt: skip

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        if self.kclpy_version == 3:
            self._dispatch("lease_lost", lease_lost_input, always_swallow=True)
        elif self.kclpy_version == 2:
            self._dispatch("shutdown", self._shutdown_input(ZOMBIE, None), always_swallow=True)
        else:
            self._dispatch("shutdown", self._zombie_checkpointer(), ZOMBIE, always_swallow=True)

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        checkpointer = self._cp(shard_ended_input.checkpointer)
        if self.kclpy_version == 3:
            self._dispatch("shard_ended", ShardEndedInput(checkpointer))
        elif self.kclpy_version == 2:
            self._dispatch("shutdown", self._shutdown_input(TERMINATE, checkpointer))
        else:
            self._dispatch("shutdown", checkpointer, TERMINATE)

    def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        checkpointer = self._cp(shutdown_requested_input.checkpointer)
        if self.kclpy_version == 1:
            self._dispatch("shutdown_requested", checkpointer, always_swallow=True)
        else:
            self._dispatch(
                "shutdown_requested", ShutdownRequestedInput(checkpointer), always_swallow=True
            )


def processor_factory(
    cls: Callable[[], Any], *, retry_failed_batches: bool = False
) -> Callable[[], RecordProcessor]:
    """A worker ProcessorFactory: a new instance of ``cls`` per lease, adapted."""

    def make() -> RecordProcessor:
        return KclpyProcessorAdapter(cls(), retry_failed_batches=retry_failed_batches)

    return make
