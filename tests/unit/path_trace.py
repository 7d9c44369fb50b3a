"""Which of the project's modules a piece of data passes through: a profile hook on every thread
(installed before the parts start their threads) that, while on, notes each call into a module
of the three packages and each call from one of them into another (a crossing).

The two scenarios drive the real parts the way the runtime does, with the test helpers of
tests/unit/runtime/test_consumer.py and tests/unit/spark/test_sink_processor.py (a memory lease
table, a scripted record source, a sink that keeps rows): one batch of records from the source's
queue to its checkpoint, and one micro-batch from ``process_records`` to its checkpoint."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kclpy_spark", "shard_sync", "checkpoint")


@dataclass
class PathTrace:
    on: bool = False
    modules: set[str] = field(default_factory=set)
    crossings: int = 0
    _names: dict[str, str | None] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The scenario's threads: the one that installed the hook and those started from them. A
    # thread another test left running in this process may start threads meanwhile (its pool
    # growing, its watchdog): they carry the hook too, and their calls counted under load.
    _threads: set[threading.Thread] = field(default_factory=set)

    def _module(self, filename: str) -> str | None:
        if filename not in self._names:
            name = None
            path = Path(filename)
            if path.is_absolute() and path.is_relative_to(ROOT):
                parts = path.relative_to(ROOT).with_suffix("").parts
                if parts and parts[0] in PACKAGES:
                    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            self._names[filename] = name
        return self._names[filename]

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        callee = self._module(frame.f_code.co_filename)
        if callee is None:
            return
        back = frame.f_back
        caller = None if back is None else self._module(back.f_code.co_filename)
        if threading.current_thread() not in self._threads:
            return
        with self._lock:
            self.modules.add(callee)
            if caller is not None and caller != callee:
                self.crossings += 1

    @contextmanager
    def installed(self) -> Iterator[PathTrace]:
        """The hook on this thread and on every thread started meanwhile (off until ``on``),
        counting on this thread and the threads it starts, and they start, only."""
        start = threading.Thread.start
        traced = self._threads

        def started_by_a_traced_thread(thread: threading.Thread) -> None:
            if threading.current_thread() in traced:
                traced.add(thread)
            start(thread)

        traced.add(threading.current_thread())
        threading.Thread.start = started_by_a_traced_thread  # type: ignore[method-assign]
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        try:
            yield self
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            threading.Thread.start = start  # type: ignore[method-assign]


def record_path() -> PathTrace:
    """A batch of two records from the source's queue to the checkpoint the processor makes
    (the second run: the first imports what the path imports lazily, module code that counted
    calls only where no earlier test of the process had imported it)."""
    _record_path_once()
    return _record_path_once()


def _record_path_once() -> PathTrace:
    from tests.unit.runtime import test_consumer as tc

    trace = PathTrace()

    class Checkpoints(tc.Recorder):
        def process_records(self, process_records_input: Any) -> None:
            super().process_records(process_records_input)  # checkpoints
            trace.on = False

    with trace.installed():
        env = tc.Env(processor=Checkpoints())
        env.lease()
        start = lambda: setattr(trace, "on", True)  # noqa: E731 (a script step)
        consumer = env.consumer(tc.FakeSources([start, tc.batch(10, 20)]))
        env.run(consumer, until=lambda: bool(env.processor.seen))
    assert env.stored().checkpoint.sequence_number == "20"
    return trace


def micro_batch_path() -> PathTrace:
    """Five records handed to the Spark sink's processor, cut into one micro-batch (its record
    limit), written by the sink and acknowledged: until the lease's checkpoint is at the last
    (the second run, as ``record_path``)."""
    _micro_batch_path_once()
    return _micro_batch_path_once()


def _micro_batch_path_once() -> PathTrace:
    from tests.unit.spark import test_sink_processor as ts

    trace = PathTrace()
    with trace.installed():
        sink = ts.Sink()
        batcher = ts.MicroBatcher(sink, ts.BatcherSettings(max_records=5, max_wait=3600.0))
        factory = ts.SparkSinkProcessorFactory(batcher, "stream", shutdown_timeout=5.0)
        try:
            c = ts.consumer(factory)
            trace.on = True
            c.deliver(5)
            deadline = time.monotonic() + 30.0
            while c.checkpoint().sequence_number != "50":
                assert time.monotonic() < deadline, "the micro-batch was never acknowledged"
                time.sleep(0.001)
            trace.on = False
        finally:
            factory.close()
    assert sink.rows == ["10", "20", "30", "40", "50"]
    return trace


if __name__ == "__main__":  # counts for another tree: PYTHONPATH=<tree> python path_trace.py
    for name, run in (("record -> checkpoint", record_path), ("micro-batch", micro_batch_path)):
        t = run()
        print(f"{name}: {len(t.modules)} modules, {t.crossings} crossings: {sorted(t.modules)}")
