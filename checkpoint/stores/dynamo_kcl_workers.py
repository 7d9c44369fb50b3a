"""KCL 3.x workers as their metrics entities show them (read only; kclpy-spark writes none).

A Java KCL 3.x worker writes its metrics every 30 s: in the lease table since KCL 3.5 (the
single-table format: ``leaseKey`` = worker id, ``entityType`` = ``WORKER_METRIC_STATS``), else in
``<application>-WorkerMetricStats`` (key ``wid``; KCL 3.0-3.4, or 3.5 before its table migration
completed). Both carry ``lut``, the last update in epoch seconds. The lease-table form comes with
the lease Scan; the separate table, when it exists, is one more Scan of a table of one small item
per worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from checkpoint.base.errors import KclpySparkError, ResourceNotFoundError
from checkpoint.base.retry import RetryPolicy
from checkpoint.port import KclWorkerSighting
from checkpoint.stores import dynamo_codec as codec
from checkpoint.stores.dynamo_calls import DynamoCalls

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

log = logging.getLogger(__name__)

_MISSING = "ResourceNotFoundException"
KCL_WORKER_METRICS_ENTITY = "WORKER_METRIC_STATS"  # KCL 3.5's entityType in the lease table
METRICS_TABLE_SUFFIX = "-WorkerMetricStats"  # the separate table's, after the application name
METRICS_TABLE_KEY = "wid"


# The KCL 3.x fleet's migration state: ``cv`` of the ``Migration3.0`` item, in the lease table
# since KCL 3.5 (``entityType`` CLIENT_VERSION_MIGRATION), else in the table
# ``<application>-CoordinatorState`` (key attribute ``key``).
MIGRATION_KEY = "Migration3.0"
MIGRATION_ENTITY = "CLIENT_VERSION_MIGRATION"
MIGRATION_VERSION = "cv"
COORDINATOR_TABLE_SUFFIX = "-CoordinatorState"
COORDINATOR_KEY = "key"


def client_version_of(item: dict[str, Any]) -> str | None:
    """The client version a KCL 3.5 lease table's migration entity holds; None for any other
    item."""
    if item.get(codec.ENTITY_TYPE) != {"S": MIGRATION_ENTITY}:
        return None
    version = item.get(MIGRATION_VERSION, {}).get("S")
    return str(version) if version is not None else None


def kcl_worker_of(item: dict[str, Any], key: str = codec.LEASE_KEY) -> KclWorkerSighting | None:
    """A KCL 3.x worker's metrics entity (its id and ``lut``), or None for any other item or one
    without a readable ``lut`` (the KCL's leader counts such a worker as expired too). ``key``:
    the id's attribute (``wid`` in the separate table, whose items carry no ``entityType``)."""
    if key == codec.LEASE_KEY and item.get(codec.ENTITY_TYPE) != {"S": KCL_WORKER_METRICS_ENTITY}:
        return None
    worker, lut = item.get(key, {}).get("S"), item.get("lut", {}).get("N")
    try:
        return None if worker is None or lut is None else KclWorkerSighting(worker, float(lut))
    except ValueError:
        return None


# While the table is missing, it is looked for again this often (seconds): a KCL 3.0-3.4 fleet
# started after ours (a migration that starts the Java side later, a rollback) is then seen within
# this time, where a look at start only missed it for good. DescribeTable costs no capacity.
PROBE_EVERY = 300.0


class _KclSideTable(DynamoCalls):
    """A table a KCL 3.0-3.4 application keeps beside its lease table, if it exists (looked for
    at ``probe``, and again every ``PROBE_EVERY`` seconds while it is missing), named
    ``<application><SUFFIX>``."""

    SUFFIX = ""

    def __init__(
        self,
        client: DynamoDBClient,
        application: str,
        retry: RetryPolicy,
        sleep: Callable[[float], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, application + self.SUFFIX, retry, sleep)
        self.present = False
        self.unseen = False  # the last look failed (not permitted, throttled): none can tell
        self._clock = clock
        self._probed_at: float | None = None
        self._warned = False

    def probe(self) -> None:
        """Look whether the table exists (a KCL 3.0-3.4 application's does). A failed look (no
        IAM permission on it, say) only leaves what it holds unseen: logged, never fatal."""
        self._probed_at = self._clock()
        try:
            response = self._retried(
                f"describe {self._table!r}",
                lambda: self._call("DescribeTable", tolerate=frozenset({_MISSING})),
            )
        except KclpySparkError as exc:  # said once; the looks every PROBE_EVERY after quietly
            log.log(logging.DEBUG if self._warned else logging.WARNING,
                    "KCL 3.0-3.4 table %r unseen: %s", self._table, exc)  # fmt: skip
            self._warned = True
            self.unseen = True
            self.present = False
            return
        self.unseen = False
        self.present = response is not None

    def _looked_for(self) -> bool:
        """Whether the table is there to read (looked for again when a look is due)."""
        if not self.present:
            due = self._probed_at is None or self._clock() - self._probed_at >= PROBE_EVERY
            if due:
                self.probe()
        return self.present


class KclMetricsTable(_KclSideTable):
    """``<application>-WorkerMetricStats``: the KCL 3.0-3.4 workers' metrics."""

    SUFFIX = METRICS_TABLE_SUFFIX

    def sightings(self) -> list[KclWorkerSighting]:
        """Every worker in the table (none if it is absent, or was deleted since the probe)."""
        if not self._looked_for():
            return []

        try:
            items = self._every_item(f"scan {self._table!r}", "Scan", ConsistentRead=False)
            found = (kcl_worker_of(i, METRICS_TABLE_KEY) for i in items)
            return [s for s in found if s is not None]
        except ResourceNotFoundError:  # the KCL fleet is gone and its table with it
            self.present = False
        except KclpySparkError as exc:  # a round without them: a steal is then a KCL 2.x take
            log.warning("KCL 3.0-3.4 workers unseen this round: %s", exc)
        return []


class KclCoordinatorTable(_KclSideTable):
    """``<application>-CoordinatorState``: a KCL 3.0-3.4 fleet's ``Migration3.0`` item."""

    SUFFIX = COORDINATOR_TABLE_SUFFIX

    # What a failed read answers when none succeeded before: not a version whose workers follow
    # hand-offs (None would say "a fleet started on 3.x", and a fleet still in 2.x mode would be
    # handed leases it never looks for).
    UNREAD = "unread"

    _last: str | None = UNREAD

    def client_version(self) -> str | None:
        """The fleet's client version (``cv``), or None (no table, no item); after a failed
        read, the last one read (``UNREAD`` when none was)."""
        if not self._looked_for():  # absent: a fleet started on 3.x; unseen: cannot tell
            return self._last if self.unseen else None
        key = {COORDINATOR_KEY: {"S": MIGRATION_KEY}}
        try:
            response = self._retried(
                f"get {MIGRATION_KEY!r} from {self._table!r}",
                lambda: self._call("GetItem", Key=key, ConsistentRead=False),
            )
        except ResourceNotFoundError:
            self.present = False
            return None
        except KclpySparkError as exc:
            log.warning("the KCL 3.x fleet's client version unread this round: %s", exc)
            return self._last
        item = response.get("Item") or {}
        version = item.get(MIGRATION_VERSION, {}).get("S")
        self._last = str(version) if version is not None else None
        return self._last
