"""Run a worker as a long-lived process: open the store and clients, handle signals.

SIGTERM, SIGINT and SIGHUP shut the worker down gracefully (every processor gets
``shutdown_requested``, leases are released); a signal that arrives during start-up, before any
lease is held, ends the process at once instead of waiting out start-up retries. SIGUSR1 logs the
worker's state (leases, readiness) and changes nothing. A worker that gives up because its lease
table or stream has been gone too long raises ``DependencyGoneError`` (the CLI exits 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from checkpoint.base.errors import ConfigError, KclpySparkError
from kclpy_spark.config import WorkerConfig, load_toml
from kclpy_spark.logs import drain as drain_log_lines
from kclpy_spark.processor import RecordProcessor
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.runtime.loop_executor import LoopExecutor
from kclpy_spark.runtime.loop_executor import install as install_loop_executor
from kclpy_spark.runtime.streams import RecordSourcesFor
from kclpy_spark.runtime.worker import ProcessorFactory, Worker
from kclpy_spark.stream_spec import StreamSpec
from kclpy_spark.user_code import import_user_module

# What the worker calls on a processor (amazon-kclpy v3's methods).
PROCESSOR_METHODS = (
    "initialize",
    "process_records",
    "lease_lost",
    "shard_ended",
    "shutdown_requested",
)

# Threads for processor calls (and the checkpoints they write): one per running consumer at a time
# (a call blocks its consumer), started as needed and ended after IDLE_SECONDS without work, so
# bounded by the calls in flight lately (at most the leases held) and this cap. The worker's own
# blocking calls have a pool of their own (loop_executor.py).
PROCESSOR_THREADS = 128


class DependencyGoneError(KclpySparkError):
    """The lease table or a stream has been gone longer than missing_dependency_timeout."""


class NotCaughtUpError(KclpySparkError):
    """until_caught_up: the job ended with shards not (or not all) committed."""


log = logging.getLogger(__name__)


def _yields(method: object) -> bool:
    """A generator function, plain or async: calling it runs none of its body."""
    return inspect.isgeneratorfunction(method) or inspect.isasyncgenfunction(method)


def load_processor_factory(path: str) -> ProcessorFactory:
    """``"package.module:Class"`` -> a factory of processor instances; ConfigError if unusable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"processor {path!r} must look like 'package.module:Class'")
    target: object = import_user_module(module_name, "processor")
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"module {module_name!r} has no {attr!r} (processor {path!r})"
            ) from None
    if not inspect.isclass(target):
        raise ConfigError(f"processor {path!r} is not a class")
    return factory_of(target, path)


def factory_of(target: type, path: str) -> ProcessorFactory:
    """A factory of ``target``'s instances, ``path`` naming it in errors: behind the amazon_kclpy
    adapter for a class written for amazon_kclpy, else as a RecordProcessor (ConfigError if it
    cannot be one)."""
    if _kclpy_style(target):
        return _kclpy_factory(path, target)
    if not callable(getattr(target, "process_records", None)):
        raise ConfigError(f"processor {path!r} has no process_records method")
    if inspect.isabstract(target):
        raise ConfigError(f"processor {path!r} is abstract: implement process_records")
    missing = [m for m in PROCESSOR_METHODS if not callable(getattr(target, m, None))]
    if missing:
        raise ConfigError(
            f"processor {path!r} lacks {', '.join(missing)}: subclass kclpy_spark.RecordProcessor "
            "(it has defaults for every method but process_records)"
        )
    methods = [*PROCESSOR_METHODS, *(["no_records"] if hasattr(target, "no_records") else [])]
    yielding = [m for m in methods if _yields(getattr(target, m))]
    if yielding:  # calling one only makes a generator: its body would never run
        raise ConfigError(
            f"processor {path!r}: {', '.join(yielding)} yield(s); a processor method must not "
            "be a generator (its body would never run): return instead"
        )
    cls: type[RecordProcessor] = target
    try:
        cls()  # the worker makes one per lease with no arguments: find out now, not per lease
    except (Exception, SystemExit) as exc:  # sys.exit() in __init__ would end the daemon with it
        raise ConfigError(
            f"processor {path!r} cannot be created with no arguments: {exc!r} (the worker makes "
            "one per lease as Class(); read settings from the environment or a file instead)"
        ) from None

    def factory() -> RecordProcessor:
        return cls()

    return factory


def _kclpy_style(cls: type) -> bool:
    """A class written on amazon_kclpy's bases (or an amazon_kclpy v1/v2 shape: its ``version``
    and not our methods) rather than ours: it runs behind the adapter, whose checkpointer raises
    amazon_kclpy's CheckpointError (an app's ``except kcl.CheckpointError`` retry loop caught
    nothing of ours)."""
    if issubclass(cls, RecordProcessor):
        return False
    on_kclpy = any(c.__module__.split(".")[0] == "amazon_kclpy" for c in cls.__mro__)
    ours = all(callable(getattr(cls, m, None)) for m in PROCESSOR_METHODS)
    return on_kclpy or (getattr(cls, "version", None) in (1, 2, 3) and not ours)


def _kclpy_factory(path: str, cls: type) -> ProcessorFactory:
    from kclpy_spark.multilang.inprocess import processor_factory

    # A batch whose process_records raised is offered again, then the lease parked, as for
    # every processor of the daemon (amazon-kclpy's KCLProcess would log it and move on: the
    # next checkpoint then passed over the failed records).
    make = processor_factory(cls, retry_failed_batches=True)
    try:
        make()  # one per lease with no arguments, as for our processors: find out now
    except (Exception, SystemExit) as exc:
        raise ConfigError(f"processor {path!r} (an amazon_kclpy processor): {exc}") from None
    log.info("processor %s is an amazon_kclpy processor: it runs behind its adapter", path)
    return make


async def run_worker(
    cfg: WorkerConfig,
    factory: ProcessorFactory,
    *,
    on_started: Callable[[Worker], Awaitable[None]] | None = None,
    install_signal_handlers: bool = True,
    wrap_store: Callable[[LeaseStore], LeaseStore] | None = None,
    wrap_kinesis: Callable[[Any], Any] | None = None,
    stream_tracker: Callable[[], tuple[StreamSpec, ...]] | None = None,
    record_sources: RecordSourcesFor | None = None,
    patient_start: bool = True,
) -> None:
    """Run one worker until SIGTERM/SIGINT/SIGHUP (or ``worker.request_shutdown()``).

    ``wrap_store`` / ``wrap_kinesis`` wrap the real lease store and asyncio Kinesis client (tests
    inject faults through them); ``record_sources``: where records come from instead of the
    worker's own reads (the Spark sink reading on the executors); ``patient_start``: a lease
    table that does not answer yet is tried again for about a minute (``ready_at_start``), else
    the start fails within half a failover time. Raises DependencyGoneError when the worker gave
    up."""
    from kclpy_spark.aws import aio_client, kinesis_control_client
    from kclpy_spark.runtime.lease_store import open_lease_store

    _tune_gc()
    _warn_shared_default(cfg)
    loop = asyncio.get_running_loop()
    threads = install_loop_executor(loop, PROCESSOR_THREADS)
    signals = _Signals(loop) if install_signal_handlers else None
    try:
        kinesis_sync = kinesis_control_client(cfg)
        if cfg.lease_store == "dynamodb" and not cfg.streams and stream_tracker is None:
            # One stream: it must exist before a DynamoDB table is made for it (a missing stream
            # left a new table behind). Local stores open first: their checks cost nothing.
            # Several streams come and go while running.
            await asyncio.to_thread(_stream_lister(kinesis_sync, cfg).wait_until_active)
        store = await asyncio.to_thread(open_lease_store, cfg, patient=patient_start)
        if wrap_store is not None:
            store = wrap_store(store)
        async with aio_client("kinesis", cfg) as kinesis:
            if wrap_kinesis is not None:
                kinesis = wrap_kinesis(kinesis)
            worker = Worker(
                cfg,
                factory,
                store=store,
                kinesis_sync=kinesis_sync,
                kinesis_async=kinesis,
                stream_tracker=stream_tracker,
                record_sources=record_sources,
            )
            if signals is not None:
                signals.worker = worker
            await _run(worker, on_started)
    finally:
        if signals is not None:
            signals.remove()
        _leave_hung_calls(loop, threads)
    if worker.exit_reason is not None:
        raise DependencyGoneError(worker.exit_reason)
    _job_result(worker)


# After the worker stopped, how long the processor threads still running may take to finish.
HUNG_CALL_GRACE = 5.0


def _leave_hung_calls(loop: asyncio.AbstractEventLoop, threads: LoopExecutor) -> None:
    """A processor call that never returns must not hold the process: asyncio.run's close
    joined the loop's default executor without a deadline, and interpreter exit joined its
    threads again (only SIGKILL ended it). The pools are abandoned after a short grace, and the
    loop gets a fresh executor for what is left to close."""
    left = threads.abandon(HUNG_CALL_GRACE)
    if left:
        log.warning("%d processor call(s) still running after the stop: exiting without them", left)
    loop.set_default_executor(ThreadPoolExecutor(2, thread_name_prefix="kclpy-spark-closing"))


def _job_result(worker: Worker) -> None:
    """until_caught_up: raise NotCaughtUpError unless every shard was caught up and committed."""
    job = worker.caught_up
    if job is None:
        return
    if job.failed:
        first, why = sorted(job.failed.items())[0]
        more = f" (and {len(job.failed) - 1} more)" if len(job.failed) > 1 else ""
        raise NotCaughtUpError(f"not caught up: lease {first}: {why}{more}")
    if not job.complete:
        raise NotCaughtUpError("stopped before every shard was caught up; run it again")


async def _run(worker: Worker, on_started: Callable[[Worker], Awaitable[None]] | None) -> None:
    watcher = None
    if on_started is not None:

        async def started() -> None:
            await worker.started.wait()
            await on_started(worker)

        watcher = asyncio.create_task(started())
    try:
        await worker.run()
    finally:
        if watcher is not None:
            watcher.cancel()


RESIGN_AT_EXIT = 1.0  # seconds a signal during start-up waits for the leadership's release


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        call()


class _Signals:
    """The daemon's signal handlers (see the module docstring)."""

    STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.worker: Worker | None = None
        for sig in self.STOP:
            loop.add_signal_handler(sig, self._stop, sig)
        loop.add_signal_handler(signal.SIGUSR1, self._report)

    def remove(self) -> None:
        """The worker has stopped; what is left is closing (the Spark sink, logging). A late
        signal (a supervisor's storm of SIGTERM and SIGHUP) must not turn that graceful stop
        into death by signal: they are ignored from now on (a process that lives on restores
        its own handlers)."""
        for sig in (*self.STOP, signal.SIGUSR1):
            self._loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

    def _stop(self, sig: signal.Signals) -> None:
        worker = self.worker
        if worker is None or not worker.started.is_set():
            # Nothing is held yet: no lease to release, no processor to ask. Do not wait out
            # start-up retries (a stream or endpoint that does not answer).
            log.warning("received %s during start-up: exiting now (no lease is held yet)", sig.name)
            if worker is not None and worker.leader.is_leader:
                # Taken before the first shard sync: given back, or the other workers would
                # wait out its record's life before one of them syncs. On a thread, a second
                # at most: a table that does not answer must not hold the exit.
                resign = threading.Thread(
                    target=_quietly, args=(worker.leader.resign,), daemon=True
                )
                resign.start()
                resign.join(RESIGN_AT_EXIT)
            drain_log_lines()
            logging.shutdown()
            os._exit(128 + sig.value)
        log.info("received %s: shutting down gracefully", sig.name)
        worker.request_shutdown()

    def _report(self) -> None:
        worker = self.worker
        if worker is None:
            log.info("SIGUSR1: the worker is starting")
            return
        ready, why = worker.readiness()
        shards = ", ".join(f"{s.shard_id}={s.state}/{s.records}" for s in worker.shard_stats())
        log.info(
            "SIGUSR1: worker %s %s (%s); leases held %d; shards %s",
            worker.cfg.worker_id,
            "ready" if ready else "NOT READY",
            why,
            len(worker.holder.held()),
            shards or "none",
        )


def _stream_lister(kinesis_sync: Any, cfg: WorkerConfig) -> Any:
    from shard_sync.discovery import KinesisShardLister

    spec = cfg.stream_specs[0]
    return KinesisShardLister(
        kinesis_sync, stream_name=spec.stream_name, stream_arn=spec.stream_arn
    )


def _warn_shared_default(cfg: WorkerConfig) -> None:
    """Two applications that both keep the default name share one DynamoDB lease table: each
    takes the other's leases and reads its own stream from the other's checkpoints."""
    default = WorkerConfig.__dataclass_fields__["application_name"].default
    if cfg.lease_store == "dynamodb" and cfg.application_name == default:
        log.warning(
            "application_name is the default %r: every application left at it shares one lease "
            "table; give this one its own name",
            default,
        )


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections for a long-lived consumer.

    Everything imported at start-up is moved out of the collector's sight (``gc.freeze``), and the
    youngest generation is collected every 10,000 allocations instead of 700: a consumer allocates
    a few objects per record and keeps batches in its prefetch queues, and full collections that
    walk all of them measured about 2 us per record (bench/results/consumer.md; the records
    themselves are untracked now, ``processor.Record``). Reference counting still frees almost
    everything at once; only cycles wait a little longer.
    """
    gc.collect()
    gc.freeze()
    _, mid, old = gc.get_threshold()
    gc.set_threshold(10_000, mid, old)


def config_file_stream_tracker(
    path: str, initial: tuple[StreamSpec, ...]
) -> Callable[[], tuple[StreamSpec, ...]]:
    """Re-read the [[streams]] of a config file on each call, so streams added to or removed from
    the file are picked up while running; an unreadable file keeps the last good list."""
    last = initial

    def streams() -> tuple[StreamSpec, ...]:
        nonlocal last
        try:
            specs = load_toml(path).streams
        except KclpySparkError as exc:
            log.warning("keeping the current streams: %s", exc)
            return last
        if specs:
            last = specs
        return last

    return streams
