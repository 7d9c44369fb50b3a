"""The record-processor API user code implements, in amazon-kclpy v3's shape.

A program written for ``amazon_kclpy.v3.processor.RecordProcessorBase`` ports by changing its base
class to ``RecordProcessor``: the method names, the input objects and their attribute names, the
``Record`` fields, the checkpointer's ``checkpoint(sequence_number=None, sub_sequence_number=None)``
and ``CheckpointError(value).value`` are amazon-kclpy's. Differences:

* any method may be ``async def``; the worker awaits it (see ``is_async``);
* default implementations instead of amazon-kclpy's abstract-in-name-only methods (only
  ``process_records`` must be written; the others are chosen so that the defaults never lose data):

  - ``initialize``, ``lease_lost``, ``shutdown_requested``: do nothing. ``shutdown_requested`` does
    not checkpoint by default: a processor that buffers records would otherwise commit records it
    has not written yet. Override it to flush and checkpoint for a faster hand-over.
  - ``shard_ended``: ``checkpointer.checkpoint()``. The KCL requires a SHARD_END checkpoint before
    the child shards may start, and retries shard end until it is made. A processor that buffers
    records must override this to flush first, then checkpoint.
"""

from __future__ import annotations

import abc
import base64
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

import msgspec

from checkpoint.base.errors import KclpySparkError
from checkpoint.checkpointer import CheckpointError

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "InitializeInput",
    "LeaseLostInput",
    "ProcessRecordsInput",
    "Record",
    "RecordProcessor",
    "RedeliverFromCheckpoint",
    "ShardEndedInput",
    "ShutdownRequestedInput",
    "is_async",
]


class Checkpointer(Protocol):
    """What a processor is given to record its progress in a shard (amazon_kclpy.kcl.Checkpointer).

    ``checkpoint()`` with no argument records everything delivered so far (at shard end: SHARD_END);
    with a sequence number (and optional sub-sequence number) it records that position, which must
    lie between the last checkpoint and the last record delivered. Raises ``CheckpointError``, whose
    ``value`` is the Java exception name (``ShutdownException`` once the lease is lost,
    ``ThrottlingException``, ``KinesisClientLibDependencyException``, ``InvalidStateException``,
    ``IllegalArgumentException``).
    """

    def checkpoint(
        self, sequence_number: str | None = None, sub_sequence_number: int | None = None
    ) -> None: ...


_MISSING: Any = object()


class Record(msgspec.Struct, frozen=True, gc=False):
    """One Kinesis record (a KPL sub-record after de-aggregation), as amazon-kclpy presents it:
    ``Record(binary_data, partition_key, sequence_number, sub_sequence_number=0,
    timestamp_millis=0)``, read-only. It holds the decoded fields (``bytes`` data, integer
    milliseconds); amazon-kclpy's other views are made when asked for: ``data`` (the base64 text)
    and ``approximate_arrival_timestamp`` (a naive local-time datetime, made with
    ``datetime.fromtimestamp`` exactly as amazon-kclpy does, for compatibility).

    Dict-style access uses amazon-kclpy's raw JSON keys: ``record["data"]``,
    ``record.get("partitionKey")``; as in amazon-kclpy an unknown key raises KeyError, unless a
    default is given to ``get``.

    Python's cyclic collector never tracks a record (a msgspec struct with ``gc=False``: it holds
    only bytes, text and numbers, so it can be in no reference cycle). A worker keeps up to
    ``prefetch_batches`` pages of records per shard waiting, and a collector walking them all
    (about a million at 24 shards) took close to half the daemon's CPU (BENCHMARKS.md). A
    subclass inherits that: it must hold no list, dict or object that could lead back to it.
    """

    binary_data: bytes
    partition_key: str
    sequence_number: str
    sub_sequence_number: int = 0  # the KPL sub-record index; 0 for a record not aggregated
    timestamp_millis: int = 0  # approximate arrival, milliseconds since the Unix epoch

    # amazon-kclpy's raw record keys -> attribute names.
    _JSON_KEYS: ClassVar[Mapping[str, str]] = {
        "data": "data",
        "partitionKey": "partition_key",
        "sequenceNumber": "sequence_number",
        "subSequenceNumber": "sub_sequence_number",
        "approximateArrivalTimestamp": "timestamp_millis",
        "action": "action",
    }
    action: ClassVar[str] = "record"

    @classmethod
    def from_base64(
        cls,
        data: str,
        partition_key: str,
        sequence_number: str,
        sub_sequence_number: int = 0,
        timestamp_millis: int = 0,
    ) -> Record:
        """A record whose data is base64 text (as in a raw GetRecords body)."""
        payload = base64.b64decode(data)
        return cls(payload, partition_key, sequence_number, sub_sequence_number, timestamp_millis)

    @classmethod
    def from_json(cls, json_dict: Mapping[str, Any]) -> Record:
        """From amazon-kclpy's raw record dict (the MultiLangDaemon's JSON keys)."""
        return cls.from_base64(
            json_dict["data"],
            json_dict["partitionKey"],
            json_dict["sequenceNumber"],
            int(json_dict.get("subSequenceNumber") or 0),
            int(json_dict["approximateArrivalTimestamp"]),
        )

    @property
    def data_size(self) -> int:
        """The payload's length in bytes."""
        return len(self.binary_data)

    def head(self, n: int) -> bytes:
        """The payload's first ``n`` bytes."""
        return self.binary_data[:n]

    @property
    def data(self) -> str:
        """The payload as base64 text (amazon-kclpy's ``data``); prefer ``binary_data``."""
        return base64.b64encode(self.binary_data).decode("ascii")

    @property
    def approximate_arrival_timestamp(self) -> datetime:
        """Approximate arrival time as a naive datetime in the local time zone (as amazon-kclpy)."""
        return datetime.fromtimestamp(self.timestamp_millis / 1000.0)

    def get(self, field: str, default: Any = _MISSING) -> Any:
        """The value under amazon-kclpy's raw JSON key ``field``; KeyError if unknown and no
        ``default`` is given."""
        name = self._JSON_KEYS.get(field)
        if name is None:
            if default is _MISSING:
                raise KeyError(field)
            return default
        return getattr(self, name)

    def __getitem__(self, field: str) -> Any:
        return self.get(field)

    def __contains__(self, field: object) -> bool:
        return field in self._JSON_KEYS

    def __hash__(self) -> int:
        return hash((self.sequence_number, self.sub_sequence_number, self.partition_key))

    def __repr__(self) -> str:
        return (
            f"Record(sequence_number={self.sequence_number!r}, "
            f"sub_sequence_number={self.sub_sequence_number}, "
            f"partition_key={self.partition_key!r}, {len(self.binary_data)} bytes, "
            f"timestamp_millis={self.timestamp_millis})"
        )


class RedeliverFromCheckpoint(KclpySparkError):
    """Raised by a processor that lost the records given to it since its last checkpoint (a
    MultiLang child that died holding them): the consumer counts a failure and delivers again
    from the lease's checkpoint, as the lease's next owner would, instead of going on after
    them."""


@dataclass(frozen=True, slots=True)
class InitializeInput:
    """Given once before any records. ``sequence_number`` is the lease's checkpoint: a sequence
    number, a sentinel (``TRIM_HORIZON``, ``LATEST``, ``AT_TIMESTAMP``, ``SHARD_END``) or None."""

    shard_id: str
    sequence_number: str | None
    sub_sequence_number: int = 0
    action: ClassVar[str] = "initialize"


@dataclass(frozen=True, slots=True)
class ProcessRecordsInput:
    """A batch of records, how far behind the stream's tip they are, and the checkpointer."""

    records: list[Record]
    millis_behind_latest: int
    checkpointer: Checkpointer
    action: ClassVar[str] = "processRecords"


@dataclass(frozen=True, slots=True)
class LeaseLostInput:
    """The lease was lost to another worker: no checkpointer; checkpointing is impossible now."""

    action: ClassVar[str] = "leaseLost"


@dataclass(frozen=True, slots=True)
class ShardEndedInput:
    """Every record of a closed shard was delivered: checkpoint (SHARD_END) to release children."""

    checkpointer: Checkpointer
    action: ClassVar[str] = "shardEnded"


@dataclass(frozen=True, slots=True)
class ShutdownRequestedInput:
    """The worker is shutting down: a last chance to checkpoint before the lease is released.
    ``caught_up``: not a stop but the end of the lease's part in an ``--until-caught-up`` job:
    nothing waits for the lease, so there is no hurry (the Spark sink waits for its writes' own
    deadlines, not ``shutdown_timeout``)."""

    checkpointer: Checkpointer
    caught_up: bool = False
    action: ClassVar[str] = "shutdownRequested"


# A processor method returns None, or an awaitable when written as ``async def``.
MaybeAwaitable = Awaitable[None] | None


class RecordProcessor(abc.ABC):
    """Subclass this; one instance processes one shard at a time. Any method may be ``async``."""

    # amazon-kclpy's processor-version attribute; this API is its version 3.
    version: ClassVar[int] = 3
    # The KCL's callProcessRecordsEvenForEmptyRecordList: True, ``process_records`` is also
    # called, with no records, after each read that found none (as the KCL; not at the shard's
    # end), e.g. to flush or checkpoint on a quiet shard; instead of ``no_records`` for an
    # IdleAware one. Set on the class or an instance.
    call_process_records_even_for_empty_record_list: bool = False

    def initialize(self, initialize_input: InitializeInput) -> MaybeAwaitable:
        """Called once before any ``process_records``. Default: nothing."""
        return None

    @abc.abstractmethod
    def process_records(self, process_records_input: ProcessRecordsInput) -> MaybeAwaitable:
        """Called with each batch of records, in order; checkpoint with its ``checkpointer``."""

    def lease_lost(self, lease_lost_input: LeaseLostInput) -> MaybeAwaitable:
        """The lease is gone; clean up. Checkpointing is impossible now. Default: nothing."""
        return None

    def shard_ended(self, shard_ended_input: ShardEndedInput) -> MaybeAwaitable:
        """The shard is closed and fully delivered. Default: checkpoint SHARD_END, which the KCL
        requires before child shards start. Override to flush buffered records first."""
        shard_ended_input.checkpointer.checkpoint()
        return None

    def shutdown_requested(
        self, shutdown_requested_input: ShutdownRequestedInput
    ) -> MaybeAwaitable:
        """The worker is stopping (or handing the lease over); checkpoint here to hand over
        without replays. ``lease_lost`` follows, as in the KCL (then the lease is released).
        Default: nothing (a default checkpoint could commit records a buffering processor has
        not written yet)."""
        return None


@runtime_checkable
class IdleAware(Protocol):
    """A processor that is also called after a read that returned no records (kclpy-spark's
    own; the Spark sink's processor is one). It may raise to fail like
    ``process_records`` does (counted, then the lease parked): a sink that gave up on a batch
    parks its lease even while no records come."""

    def no_records(self) -> MaybeAwaitable: ...


@runtime_checkable
class ReportsReadiness(Protocol):
    """A processor factory that can make its worker not ready (the Spark sink's, while its
    writes hang); the worker asks it after its own checks passed."""

    def readiness(self) -> tuple[bool, str]: ...


@runtime_checkable
class ReportsSinkLanes(Protocol):
    """A processor factory with a lane per lease (the Spark sink's): each lane's figures by lease
    key, which the worker's status record carries for ``status`` and the status page."""

    def sink_lanes(self) -> dict[str, dict[str, Any]]: ...


@runtime_checkable
class ExportsMetrics(Protocol):
    """A processor factory with figures of its own (the Spark sink's): a Prometheus collector
    the worker registers beside its metrics."""

    def metrics_collector(self) -> Any: ...


def is_async(method: Callable[..., object]) -> bool:
    """True if calling ``method`` returns a coroutine to await (an ``async def`` function or bound
    method, a ``functools.partial`` of one, or an object with an ``async def __call__``).

    A sync wrapper around an async function looks sync here; callers should still await a result
    for which ``inspect.isawaitable`` is true.
    """
    if inspect.iscoroutinefunction(method):
        return True
    call = getattr(method, "__call__", None)  # noqa: B004 - an async __call__, not callability
    return call is not None and inspect.iscoroutinefunction(call)
