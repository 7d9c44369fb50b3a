"""The readStream source's lease worker on its thread (``QueryWorker``): one that starts after
its start timed out, or after a stop, stops at once instead of holding leases nobody reads."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from checkpoint.base.errors import KclpySparkError
from kclpy_spark.readstream import query_worker
from kclpy_spark.readstream.query_worker import QueryWorker


class _SlowWorker:
    """``run_worker`` that starts once the test lets it (``go``; a fixed delay raced a test
    thread held up under the suite's load) and runs until asked to stop."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.stopped = threading.Event()

    async def run_worker(self, cfg: Any, processors: Any, *, on_started: Any, **_: Any) -> None:
        await asyncio.to_thread(self.go.wait, 30.0)
        stop = asyncio.Event()
        me = self

        class Worker:
            def request_shutdown(self) -> None:
                me.stopped.set()
                stop.set()

        await on_started(Worker())
        self.started.set()
        await stop.wait()


def test_a_worker_that_starts_after_its_start_timed_out_stops_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = _SlowWorker()
    monkeypatch.setattr("kclpy_spark.runtime.daemon.run_worker", slow.run_worker)
    monkeypatch.setattr(query_worker, "START_SECONDS", 0.05)
    worker = QueryWorker(SimpleNamespace(worker_id="query-worker"))
    try:
        with pytest.raises(KclpySparkError, match="did not start"):
            worker.start()
        assert not worker.running()
    finally:
        slow.go.set()
    assert slow.started.wait(5.0) and slow.stopped.wait(5.0)  # it came up late, and stopped
    assert not worker.running()
    worker.stop(timeout=5.0)


def test_a_worker_stopped_while_it_starts_stops_when_it_does() -> None:
    """A stop while start() waited: start() then said started, and running() yes, while the
    worker handed its leases out."""
    slow = _SlowWorker()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("kclpy_spark.runtime.daemon.run_worker", slow.run_worker)
        worker = QueryWorker(SimpleNamespace(worker_id="query-worker"))
        outcome: list[BaseException | None] = []

        def start() -> None:
            try:
                worker.start()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        starting = threading.Thread(target=start)
        starting.start()
        worker.stop(timeout=0.0)  # before it started
        slow.go.set()
        starting.join(10.0)
        assert slow.stopped.wait(5.0)  # it came up and stopped at once
        assert isinstance(outcome[0], KclpySparkError) and not worker.running()
        worker.stop(timeout=5.0)
