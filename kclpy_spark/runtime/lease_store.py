"""Open the lease store a WorkerConfig names: SQLite (embedded default), DynamoDB, or memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from checkpoint.port import CoordinationStore, LeaseTable

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig


class LeaseStore(LeaseTable, CoordinationStore, Protocol):
    """A lease table that also keeps the application's coordination records."""


def open_lease_store(cfg: WorkerConfig) -> LeaseStore:
    """The store, with its table ensured (created if allowed). Raises ResourceNotFoundError or
    InvalidStateError naming the table when it is missing (and creation is off) or malformed."""
    store: LeaseStore
    if cfg.lease_store == "memory":
        from checkpoint.stores.memory import MemoryLeaseTable

        store = MemoryLeaseTable()
    elif cfg.lease_store == "dynamodb":
        from checkpoint.stores.dynamodb import DynamoDBLeaseTable
        from kclpy_spark.aws import boto3_client

        store = DynamoDBLeaseTable(
            boto3_client("dynamodb", cfg),
            cfg.application_name,
            create_if_missing=cfg.create_lease_table,
        )
    else:
        from checkpoint.stores.sqlite import SQLiteLeaseTable

        path = cfg.sqlite_path
        assert path is not None  # the config checked the form
        if cfg.create_lease_table:
            path.parent.mkdir(parents=True, exist_ok=True)
        store = SQLiteLeaseTable(
            path, namespace=cfg.application_name, create_if_missing=cfg.create_lease_table
        )
    store.ensure_table()
    return store
