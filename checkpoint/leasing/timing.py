"""Lease timing: every interval of lease renewal and taking, derived from one failover time.

The KCL derives its intervals from ``failoverTimeMillis`` (the lease duration) and a small epsilon:

* renew every ``failover / 3 - epsilon``, so a holder gets three tries at renewing before anyone may
  judge its lease expired (the epsilon keeps the third try strictly inside the duration).
  kclpy-spark (``skip_checkpointed_renewals``, default true) instead renews a lease at the first
  round after its counter is 0.44 failover time old, from rounds every twelfth of it
  (``renew_round_interval``): every half failover time (``renewal_period``) when renewals alone move
  the counter, 0.44-0.52 of it after a checkpoint moved it; a try that fails is tried again at every
  later round, five or six more before the lease could expire, where the KCL's rounds leave two
  (checkpoint.leasing.renewal_rules.renewal_due). Idle, that is two renewals where the KCL makes
  three;
* take every ``(failover + epsilon) * 2``: a lease needs a full duration without a counter change to
  expire, so scanning more often than that only costs lease-table reads;
* kclpy-spark scans every ``(failover + epsilon) * take_interval_multiplier`` with a multiplier of
  0.55 by default (5.5 s at failover 10 s), not the KCL's 2 (20.05 s). Between scans, a lease of
  another worker is read once more (one GetItem) at the moment it would expire unless its counter
  moved, dated by the write stamps (kclpy_spark.moves.rules.observer), and taken at once if it did
  not move. A live lease's counter moves at least every 0.52 lease duration, so the next scan sees a
  newer counter before that moment comes (the stamp + 11 s, or the scan that saw it + 10 s when the
  scan came within the skew allowance of the write), and no extra read is made unless a renewal runs
  more than about a quarter of a second late; a dead worker's leases move ``failover +
  max_clock_skew`` (11 s by default) after its last write, whether records were flowing or not. The
  KCL (and earlier versions here, with 5 s scans and no stamps) take a lease one or two scan
  intervals after the failover time has passed since the scan that first saw its last counter. Set
  the multiplier to 2 for the KCL's scan rate (the extra reads then come about once per lease per
  lease duration, and a moment with more than eight leases due starts a scan instead);
* a lease is "very old" after ``3 * failover`` without a counter change, and is then taken first;
* the shard-sync leader record expires after ``3 * failover`` (30 s by default) and is renewed
  at half that (every 15 s, from the leader's ticks every 5 s, so a failed write is tried again
  5 s later): leadership only decides who syncs shards and cleans up, which a 30 s gap after a
  leader's crash delays by that much (a stopping leader resigns at once), while a renewal per
  lease interval cost every worker a read, and the leader a write, every 3.3 s. A leader that
  assigns leases (shard_sync.leader, kclpy_spark.moves.assigning) lives one failover time,
  renewed every third. The KCL 3.x leader lock: 120 s, heartbeat every 30 s;
* a worker's status record is written at its control round (every failover time) when it
  changed or the worker holds no lease, else every ``3 * failover`` (the KCL 3.x worker metrics:
  every 30 s); readers count a worker as running ``2 * failover + max_clock_skew`` after its
  status, or as long as the record says (``live_for``: ``4 * failover + max_clock_skew``, from a
  worker that may write quietly next).

Seconds as floats throughout; the KCL's milliseconds are accepted only by ``from_failover_millis``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from checkpoint.base.errors import ConfigError

# The KCL's epsilonMillis (25 ms): margin so the last renewal lands before the lease could expire.
DEFAULT_EPSILON = 0.025
# The KCL's veryOldLeaseDurationNanosMultiplier.
DEFAULT_VERY_OLD_MULTIPLIER = 3.0
# Not in the KCL: how many take intervals a worker waits before it steals again after one of its
# leases was taken by another worker (see kclpy_spark.moves.rules.take_rule). Two intervals let
# every other worker's taker run at least once whatever its phase, so the counts we steal on have
# settled.
DEFAULT_STEAL_COOLDOWN_INTERVALS = 2.0
# The shard-sync leader's record lives this many failover times without a renewal.
LEADER_DURATION_MULTIPLIER = 3.0
# kclpy-spark's renewal schedule, in failover times: rounds every twelfth; a lease is renewed at
# the first round after its counter is RENEW_AFTER old
# (checkpoint.leasing.renewal_rules.renewal_due).
ROUNDS_PER_DURATION = 12
RENEW_AFTER = 0.44
# Lease durations between two status writes of a worker whose status did not change.
STATUS_QUIET_DURATIONS = 3.0


def renewal_round_interval(failover: float, lazy: bool, epsilon: float = DEFAULT_EPSILON) -> float:
    """How often a holder's renewal rounds come: every ``1 / ROUNDS_PER_DURATION`` failover
    time with ``lazy`` (kclpy-spark's schedule), else the KCL's renewal interval, a third less
    ``epsilon`` (kept above a quarter for durations too short for the epsilon)."""
    if lazy:
        return failover / ROUNDS_PER_DURATION
    return max(failover / 3 - epsilon, failover / 4)


@dataclass(frozen=True)
class LeaseTiming:
    """Lease timing derived from ``failover`` (seconds), the KCL's ``failoverTimeMillis``."""

    failover: float = 10.0
    epsilon: float = DEFAULT_EPSILON
    very_old_multiplier: float = DEFAULT_VERY_OLD_MULTIPLIER
    steal_cooldown_intervals: float = DEFAULT_STEAL_COOLDOWN_INTERVALS
    take_interval_multiplier: float = 0.55
    # The largest difference between two workers' wall clocks that write stamps allow for (see
    # kclpy_spark.moves.rules.observer): a dead worker's lease moves this much after the lease
    # duration.
    max_clock_skew: float = 1.0
    # Failover times a leader record lives without a renewal (renewed three times as often):
    # 3 when leadership only syncs shards; 1 when the leader also assigns leases, so a dead
    # leader's own leases move about as fast as any worker's.
    leader_duration_multiplier: float = LEADER_DURATION_MULTIPLIER

    def __post_init__(self) -> None:
        if not (math.isfinite(self.failover) and self.failover > 0):
            raise ConfigError(
                f"failover time must be a positive number of seconds: {self.failover}"
            )
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ConfigError(f"lease timing epsilon must be >= 0 seconds: {self.epsilon}")
        if self.renew_interval <= 0:
            raise ConfigError(
                f"failover time {self.failover} s is too short: the renewal interval "
                f"failover/3 - {self.epsilon} s would not be positive"
            )
        if not 0.1 <= self.take_interval_multiplier <= 10:
            raise ConfigError(
                f"take interval multiplier must be within 0.1..10: {self.take_interval_multiplier}"
            )
        if not (math.isfinite(self.max_clock_skew) and self.max_clock_skew >= 0):
            raise ConfigError(f"max clock skew must be >= 0 seconds: {self.max_clock_skew}")
        if not 1 <= self.leader_duration_multiplier <= 100:
            raise ConfigError(
                f"leader duration multiplier must be within 1..100: "
                f"{self.leader_duration_multiplier}"
            )
        if not self.very_old_multiplier >= 1:
            raise ConfigError(f"very-old multiplier must be >= 1: {self.very_old_multiplier}")
        if not self.steal_cooldown_intervals >= 0:
            raise ConfigError(
                f"steal cooldown must be >= 0 take intervals: {self.steal_cooldown_intervals}"
            )

    @classmethod
    def from_failover_millis(
        cls, failover_time_millis: float, *, epsilon_millis: float = DEFAULT_EPSILON * 1000
    ) -> LeaseTiming:
        """From the KCL's ``failoverTimeMillis`` (and ``epsilonMillis``) properties."""
        return cls(failover=failover_time_millis / 1000.0, epsilon=epsilon_millis / 1000.0)

    @property
    def lease_duration(self) -> float:
        """A lease whose counter has not moved for longer than this is expired."""
        return self.failover

    @property
    def renew_interval(self) -> float:
        """How often a holder renews each lease it holds."""
        return self.failover / 3 - self.epsilon

    @property
    def renewal_period(self) -> float:
        """How often kclpy-spark's renewals move a lease's counter when no checkpoint does: at
        the first round after RENEW_AFTER."""
        rounds = math.ceil(RENEW_AFTER * ROUNDS_PER_DURATION)
        return rounds * self.renew_round_interval

    @property
    def renew_round_interval(self) -> float:
        """How often kclpy-spark's holder looks for leases due a renewal (and tries failed ones
        again)."""
        return renewal_round_interval(self.failover, True, self.epsilon)

    @property
    def take_interval(self) -> float:
        """How often a worker scans the lease table and takes or steals leases."""
        return (self.failover + self.epsilon) * self.take_interval_multiplier

    @property
    def leader_duration(self) -> float:
        """A leader record whose version has not moved for longer than this may be taken."""
        return self.leader_duration_multiplier * self.failover

    @property
    def leader_renew_interval(self) -> float:
        """How often every worker looks at the leader record (and the leader renews it)."""
        return self.leader_duration / 3

    @property
    def very_old(self) -> float:
        """A lease whose counter has not moved for longer than this is taken before any other."""
        return self.very_old_multiplier * self.failover

    @property
    def quiet_after(self) -> float:
        """A worker none of whose leases moved for this long is given no lease (a leader's
        assignment, a stopping worker's handoff: ``Suspects``), killed a moment ago: a live
        holder's counters move at most ``RENEW_AFTER`` and a round apart (0.52 of a lease
        duration), and a quarter of a duration more allows for a slow write."""
        return (RENEW_AFTER + 1 / ROUNDS_PER_DURATION + 0.25) * self.lease_duration

    @property
    def status_max_age(self) -> float:
        """How long a worker's status record says it runs after it was written (by the writer's
        clock): two status intervals (one lease duration each) and the clock skew allowed."""
        return 2 * self.lease_duration + self.max_clock_skew

    @property
    def status_quiet_interval(self) -> float:
        """How often a worker holding leases writes its status record while nothing in it
        changed that a reader acts on (kclpy_spark.runtime.publish.StatusCadence): three lease
        durations, the KCL 3.x worker-metrics cadence (30 s) at the default failover time. A
        change is written at the next control round, one lease duration at most."""
        return STATUS_QUIET_DURATIONS * self.lease_duration

    @property
    def status_quiet_max_age(self) -> float:
        """How long a status record that may be followed by a quiet one says its worker runs
        (its ``live_for``): the quiet interval, one control round more (a failed write is tried
        again at the next one) and the clock skew allowed."""
        return self.status_quiet_interval + self.lease_duration + self.max_clock_skew

    @property
    def cpu_move_memory(self) -> float:
        """How long the observer remembers that a lease came to or left a worker (for the CPU
        load rule): a worker's status record counts as running for at most
        ``status_quiet_max_age`` and describes a window of one lease duration before it, so an
        older move can no longer fall inside a figure the rule would use."""
        return (
            self.status_quiet_max_age + self.lease_duration + self.max_clock_skew
            + self.renew_interval
        )  # fmt: skip

    @property
    def steal_cooldown(self) -> float:
        """After a lease was taken from us, do not steal for this long (kclpy-spark's damping)."""
        return self.steal_cooldown_intervals * self.take_interval
