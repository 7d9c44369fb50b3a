"""Open the lease store a WorkerConfig names: SQLite (embedded default), DynamoDB, or memory.

Every lease-table call gets a deadline shorter than the lease it protects (``CallBudget``): one
attempt may take at most ``attempt`` seconds to connect and as long to read, and a call with its
retries gives up after ``total`` seconds, half the failover time. So a hung table costs a renewal
at most half a lease, never the lease: the next renewal round still lands in time once the table
answers again, and a table that stays silent lets the lease expire on our own clock first.

A daemon's start is patient where no lease is at stake yet: making the table ready (found, or made
and waited for) is tried again for about a minute (no new try after it), as the daemon waits for
its stream, and as the KCL tries its initialization again 20 times. Operator commands protect
no lease: they give a call seconds and a few tries (``ops.commands.OPERATOR_CALLS``), and their
start is one such call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from checkpoint.base.errors import ConfigError
from checkpoint.base.retry import CallBudget, RetryPolicy, call_with_retry
from checkpoint.port import CoordinationStore, LeaseTable, TableReader
from shard_sync.discovery import LIST_SHARDS_POLICY

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig


__all__ = ["CallBudget", "LeaseStore", "open_lease_store", "ready_at_start"]

# A start's patience with its lease table: the same as with its stream (the stream lister's
# policy, about a minute), each try with the store's own budget and retries.
START_POLICY = LIST_SHARDS_POLICY
ONCE = RetryPolicy(max_attempts=1)  # the store's own budget and retries only


class LeaseStore(LeaseTable, CoordinationStore, TableReader, Protocol):
    """A lease table that also keeps the application's coordination records."""


def open_lease_store(
    cfg: WorkerConfig,
    *,
    create_records: bool | None = None,
    records_optional: bool = False,
    reads_only: bool = False,
    patient: bool = False,
    budget: CallBudget | None = None,
) -> LeaseStore:
    """The store, with its table ensured (created if allowed). Raises ResourceNotFoundError or
    InvalidStateError naming the table when it is missing (and creation is off) or malformed.
    DynamoDB's coordination table: ``create_records`` and ``records_optional`` as in
    DynamoDBLeaseTable (the operator commands'). ``patient``: a daemon's start, which tries a
    table that does not answer again (``ready_at_start``). ``budget``: each call's (by default
    a daemon's, within half a lease: ``CallBudget.for_failover``)."""
    budget = budget or CallBudget.for_failover(cfg.failover_time)
    store: LeaseStore
    if cfg.lease_store == "memory":
        from checkpoint.stores.memory import MemoryLeaseTable

        store = MemoryLeaseTable()
    elif cfg.lease_store == "dynamodb":
        from checkpoint.stores.dynamodb import DynamoDBLeaseTable
        from kclpy_spark.aws import lease_table_client

        store = DynamoDBLeaseTable(
            lease_table_client(cfg, budget.attempt),
            cfg.application_name,
            create_if_missing=cfg.create_lease_table,
            kcl_application=cfg.kcl_application_name,
            retry=budget.retry_policy(),
            create_records=create_records,
            records_optional=records_optional,
        )
    else:
        from checkpoint.stores.sqlite import SQLiteLeaseTable

        path = cfg.sqlite_path
        assert path is not None  # the config checked the form
        if cfg.create_lease_table:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file where a folder should be, no permission
                raise ConfigError(
                    f"config 'lease_store': cannot make the folder for {path}: {exc.strerror} "
                    f"({exc.filename})"
                ) from None
        sqlite = SQLiteLeaseTable(
            path,
            namespace=cfg.application_name,
            create_if_missing=cfg.create_lease_table,
            retry=budget.retry_policy(),
            busy_timeout=budget.attempt,
        )
        if reads_only:  # a file it may only read will do
            sqlite.check_table()
            return sqlite
        store = sqlite
    ready_at_start(store, START_POLICY if patient else ONCE)
    return store


def ready_at_start(
    store: LeaseTable,
    policy: RetryPolicy = START_POLICY,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """``store.ensure_table()``, tried again while it fails in a way a retry may fix (an endpoint
    not answering yet, throttling, a table still being made): each failure is a WARNING line, and
    the last one is raised when the policy runs out. Other errors are raised at once."""
    call_with_retry(store.ensure_table, what="making the lease table ready", policy=policy,
                    sleep=sleep)  # fmt: skip
