"""What the lease loops (``taking.Taker`` and its leader-assignment part ``assigning.Led``) read
of the worker they serve: its parts, by role. The worker (``worker.Worker``, the composition
root) is one; the loops never import it, and change none of its fields (what they learn goes to
the part that owns it: ``health``, ``caught_up``, ``events``, the metrics and counters)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from checkpoint import coordination
    from checkpoint.base.clock import Clock
    from checkpoint.counters import CoordinationCounters
    from checkpoint.leasing.holder import LeaseHolder
    from checkpoint.leasing.timing import LeaseTiming
    from kclpy_spark.board.feed import WorkerBoard
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.runtime.caught_up import CaughtUp
    from kclpy_spark.runtime.consumer_set import ConsumerSet
    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.health import Health
    from kclpy_spark.runtime.lease_store import LeaseStore
    from kclpy_spark.runtime.metrics import WorkerMetrics
    from kclpy_spark.runtime.streams import StreamSet
    from shard_sync.leader import LeaderElection


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
    @property
    def suspend_flag(self) -> coordination.SuspendFlag: ...

    # Where a lease taken goes: its stream's context and a consumer.
    @property
    def streams(self) -> StreamSet: ...
    @property
    def consumers(self) -> ConsumerSet: ...

    # What the loops report to.
    @property
    def health(self) -> Health: ...
    @property
    def events(self) -> EventLog: ...
    @property
    def metrics(self) -> WorkerMetrics: ...
    @property
    def counters(self) -> CoordinationCounters: ...
    @property
    def board(self) -> WorkerBoard: ...
    @property
    def caught_up(self) -> CaughtUp | None: ...

    # The worker's state the loops act on.
    @property
    def suspended(self) -> bool: ...
    @property
    def resumed_at(self) -> float: ...
    @property
    def may_take(self) -> bool: ...
    def request_shutdown(self) -> None: ...
