"""Every lease-table call has a deadline shorter than the lease it protects (issue 14, finding 2).

The budget is checked as configured (pure), and against a real silent endpoint: a TCP server that
accepts connections and never answers stands in for a hung DynamoDB.
"""

from __future__ import annotations

import inspect
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkpoint.base.errors import (
    DependencyError,
    InvalidStateError,
    ResourceNotFoundError,
    ThrottledError,
)
from checkpoint.base.retry import DEFAULT_FAILOVER_TIME, RetryPolicy
from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from checkpoint.stores.dynamodb import DynamoDBLeaseTable
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.lease_store import (
    START_POLICY,
    CallBudget,
    open_lease_store,
    ready_at_start,
)


@pytest.mark.parametrize("failover", [0.5, 0.8, 1.1, 3.0, 10.0, 60.0, 600.0])
def test_a_call_with_its_retries_ends_within_half_the_lease(failover: float) -> None:
    """Below 1.2 s of failover a floor of 0.2 s per connect and per read let one attempt run
    0.4 s, past half the lease (the renewal it carried came too late)."""
    budget = CallBudget.for_failover(failover)
    policy = budget.retry_policy()
    assert policy.max_elapsed <= failover / 2
    # One attempt (connect + read) fits in the budget, so at least one is always made.
    assert policy.attempt_timeout <= policy.max_elapsed
    assert budget.attempt <= 5.0


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """http://127.0.0.1:<port>: accepts connections, reads the request, never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2.0)
    for conn in held:
        conn.close()
    server.close()


def test_a_silent_dynamodb_endpoint_fails_the_call_instead_of_hanging(
    silent_endpoint: str, tmp_path: Path
) -> None:
    cfg = WorkerConfig(
        stream_name="s",
        lease_store="dynamodb",
        endpoint_url=silent_endpoint,
        failover_time=1.2,
    )
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            open_lease_store(cfg)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30.0)  # not a timing assertion: only a hang fails here
    assert outcome, "the lease-table call hung past 30 s against a silent endpoint"
    assert isinstance(outcome[0], DependencyError), outcome[0]


def test_a_store_made_without_a_budget_gives_up_within_half_a_default_lease(
    tmp_path: Path,
) -> None:
    """Library use and the bench scripts make stores without the daemon's budget. Their default
    retry loop ran for 20 s with no bound on an attempt (SQLite waited 5 s for a lock each
    time), twice the lease a renewal protects. Another process's write transaction holds the
    file here for the whole call."""
    path = tmp_path / "leases.db"
    store = SQLiteLeaseTable(path, namespace="app")
    store.ensure_table()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # holds the write lock, as a stuck writer would
    try:
        started = time.monotonic()
        with pytest.raises(DependencyError):
            store.create_lease_if_absent(Lease(lease_key="shardId-0", checkpoint=TRIM_HORIZON))
        elapsed = time.monotonic() - started
    finally:
        blocker.rollback()
        blocker.close()
        store.close()
    # A bound the store promises, not a speed: the call may not outlast half a default lease.
    assert elapsed <= DEFAULT_FAILOVER_TIME / 2 + 1.0, elapsed


@pytest.mark.parametrize("store", [SQLiteLeaseTable, DynamoDBLeaseTable])
def test_the_stores_default_budget_fits_half_a_default_lease(store: type) -> None:
    retry = inspect.signature(store).parameters["retry"].default
    assert retry.max_elapsed <= DEFAULT_FAILOVER_TIME / 2
    assert 0 < retry.attempt_timeout <= retry.max_elapsed


class _SlowToAnswer:
    """A store whose ``ensure_table`` raises the given errors first, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def ensure_table(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


def test_a_start_tries_a_lease_table_that_does_not_answer_again() -> None:
    """A daemon's start gave up on its lease table after half a failover time (a table being
    made on a busy DynamoDB, an endpoint a moment from up), though no lease was at stake yet."""
    store = _SlowToAnswer(DependencyError("connection refused"), ThrottledError("slow down"))
    slept: list[float] = []
    ready_at_start(store, sleep=slept.append)  # type: ignore[arg-type]
    assert store.calls == 3 and len(slept) == 2
    assert START_POLICY.max_elapsed >= 30  # a start's patience is not a lease's budget


@pytest.mark.parametrize(
    "error", [ResourceNotFoundError("no table"), InvalidStateError("not a lease table")]
)
def test_a_start_fails_at_once_where_trying_again_cannot_help(error: Exception) -> None:
    store = _SlowToAnswer(error)
    slept: list[float] = []
    with pytest.raises(type(error)):
        ready_at_start(store, sleep=slept.append)  # type: ignore[arg-type]
    assert store.calls == 1 and slept == []


def test_a_start_gives_up_when_its_patience_runs_out() -> None:
    store = _SlowToAnswer(*[DependencyError(f"refused {i}") for i in range(100)])
    policy = RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=4, max_elapsed=60.0)
    with pytest.raises(DependencyError, match="refused 3"):
        ready_at_start(store, policy, sleep=lambda s: None)  # type: ignore[arg-type]
    assert store.calls == 4
