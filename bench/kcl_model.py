"""What the KCL's lease management asks of its lease table in steady state, per minute: requests
and DynamoDB capacity units, written down from its source so benchmarks can compare with it.

KCL 3.x (awslabs/amazon-kinesis-client v3.5.1, a new application: one table, client version 3X;
paths under ``src/main/java/software/amazon/kinesis/``, ``LMC`` = ``leases/LeaseManagementConfig``):

* renewal: one conditional UpdateItem per held lease every ``failover / 3 - epsilon`` (3.308 s at
  10 s; ``common/CommonCalculations``, ``DynamoDBLeaseCoordinator``, ``DynamoDBLeaseRefresher
  .renewLease``), ``throughputKBps`` in the same request;
* lease discovery, every worker: one Query of ``LeaseOwnerToLeaseKeyIndex`` (KEYS_ONLY) every
  ``leaseAssignmentInterval / 2 - epsilon`` = ``failover - epsilon`` (``DynamoDBLeaseCoordinator``,
  ``DynamoDBLeaseDiscoverer``); a GetItem only per key it does not hold yet (none in steady state);
* worker metrics, every worker: one UpdateItem every 30 s (``workerMetricsReporterFreqInMillis``,
  ``WorkerMetricStatsReporter``);
* leader lock (DynamoDB lock client, ``leader/DynamoDBLockBasedLeaderDecider``): the leader
  heartbeats with one UpdateItem every 30 s; a non-leader's ``isLeader`` is cached for 30 s,
  then costs two consistent GetItems (``getLock`` and ``tryAcquireLock``): about 4 per minute;
* lease assignment, the leader only: one eventually consistent Scan of the whole table every
  ``leaseAssignmentIntervalMillis`` = ``2 * failover`` (``LMC``, ``LeaseAssignmentManager``), no
  write while balanced;
* periodic shard sync, the leader only: one eventually consistent Scan every 120 s
  (``leasesRecoveryAuditorExecutionFrequencyMillis``, ``PeriodicShardSyncManager``).

KCL 2.x: the renewals above and one Scan of the whole table per worker every ``(failover +
epsilon) * 2`` (the lease taker).

Units follow checkpoint.stores.capacity (DynamoDB's rules). Sizes the KCL's items have that we
cannot read from a run (a worker-metrics item, a lock item) are taken as under 1 KB: 1 unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from checkpoint.stores.capacity import read_units, write_units

EPSILON = 0.025
# Bytes of one index entry of a KEYS_ONLY Query: leaseKey and leaseOwner, names and values.
INDEX_ENTRY_BYTES = 60


@dataclass(frozen=True)
class Cost:
    """Per minute: requests, read units, write units."""

    requests: float
    read_units: float
    write_units: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.requests + other.requests,
            self.read_units + other.read_units,
            self.write_units + other.write_units,
        )

    def per(self, n: float) -> Cost:
        return Cost(self.requests / n, self.read_units / n, self.write_units / n)


def _every(seconds: float, requests: float = 1.0, reads: float = 0.0, writes: float = 0.0) -> Cost:
    per_minute = 60.0 / seconds
    return Cost(requests * per_minute, reads * per_minute, writes * per_minute)


def kcl3(leases: int, workers: int, failover: float, lease_bytes: int) -> Cost:
    """The whole application's steady-state cost per minute under KCL 3.x."""
    table_bytes = leases * lease_bytes + workers * 512  # the leases, and a metrics item per worker
    scan = read_units([table_bytes], consistent=False)
    query = read_units([leases // max(workers, 1) * INDEX_ENTRY_BYTES], consistent=False)
    renewals = _every(failover / 3 - EPSILON, leases, writes=leases * write_units(lease_bytes, 0))
    per_worker = _every(failover - EPSILON, reads=query) + _every(30.0, writes=1.0)
    non_leader_lock = _every(30.0, 2.0, reads=2.0)
    leader = _every(30.0, writes=1.0) + _every(2 * failover, reads=scan) + _every(120.0, reads=scan)
    total = renewals + leader
    for _ in range(workers):
        total = total + per_worker
    for _ in range(workers - 1):
        total = total + non_leader_lock
    return total


def kcl2(leases: int, workers: int, failover: float, lease_bytes: int) -> Cost:
    """The same under KCL 2.x: renewals and every worker's Scan every (failover + epsilon) * 2."""
    scan = read_units([leases * lease_bytes], consistent=False)
    renewals = _every(failover / 3 - EPSILON, leases, writes=leases * write_units(lease_bytes, 0))
    return renewals + _every((failover + EPSILON) * 2, workers, reads=workers * scan)
