"""What the lease loops (``taking.Taker`` and its leader-assignment part ``assigning.Led``) read
of the worker they serve: its parts, by role. The worker (``worker.Worker``, the composition
root) is one; the loops never import it, and change none of its fields (what they learn goes to
``reports``, which the worker routes to health, the events, the metrics and counters and the
status page, or to the part that owns it: ``caught_up``)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from checkpoint.base.clock import Clock
    from checkpoint.lease import Lease
    from checkpoint.leasing.held_lease import HeldLease
    from checkpoint.leasing.holder import LeaseHolder
    from checkpoint.leasing.timing import LeaseTiming
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.moves.reports import TakeReports
    from kclpy_spark.runtime.caught_up import CaughtUp
    from kclpy_spark.runtime.consumer_set import ConsumerSet
    from kclpy_spark.runtime.lease_store import LeaseStore
    from kclpy_spark.runtime.run_state import RunView
    from kclpy_spark.runtime.streams import StreamContext, StreamSet
    from shard_sync.leader import LeaderElection


class Placement:
    """Where a lease taken goes (its stream's context, then a consumer) and which leases run
    here: all the lease loops use of the worker's ``StreamSet`` and ``ConsumerSet``."""

    def __init__(self, streams: StreamSet, consumers: ConsumerSet) -> None:
        self._streams = streams
        self._consumers = consumers

    def context_of(self, lease: Lease) -> StreamContext | None:
        """The context of the lease's stream; None for a stream this worker does not consume."""
        return self._streams.context_of(lease)

    def running(self, key: str) -> bool:
        """Whether a consumer runs the lease here."""
        return key in self._consumers

    def start(self, held: HeldLease, context: StreamContext) -> None:
        self._consumers.start(held, context)


class LeaseWorker(Protocol):
    """The worker as its lease loops see it."""

    # Who and when: configuration, lease timing, clocks, randomness.
    @property
    def cfg(self) -> WorkerConfig: ...
    @property
    def timing(self) -> LeaseTiming: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def rng(self) -> random.Random: ...

    # The lease table and the leases held.
    @property
    def store(self) -> LeaseStore: ...
    @property
    def holder(self) -> LeaseHolder: ...
    @property
    def leader(self) -> LeaderElection: ...

    # Where a lease taken goes: its stream's context and a consumer.
    @property
    def placement(self) -> Placement: ...

    # What the loops report to: what happened, and a job's progress.
    @property
    def reports(self) -> TakeReports: ...
    @property
    def caught_up(self) -> CaughtUp | None: ...

    # Whether the worker runs on: suspended, stopping (a job's end asks it to stop).
    @property
    def run_state(self) -> RunView: ...
