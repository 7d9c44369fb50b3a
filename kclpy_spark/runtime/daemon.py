"""Run a worker as a long-lived process: open the store and clients, handle SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from checkpoint.base.errors import ConfigError, KclpySparkError
from kclpy_spark.config import StreamSpec, WorkerConfig, load_toml
from kclpy_spark.processor import RecordProcessor
from kclpy_spark.runtime.lease_store import LeaseStore
from kclpy_spark.runtime.worker import ProcessorFactory, Worker

log = logging.getLogger(__name__)


def load_processor_factory(path: str) -> ProcessorFactory:
    """``"package.module:Class"`` -> a factory of processor instances; ConfigError if unusable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"processor {path!r} must look like 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised on import
        raise ConfigError(f"cannot import processor module {module_name!r}: {exc}") from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"module {module_name!r} has no {attr!r} (processor {path!r})"
            ) from None
    if inspect.isclass(target):
        if not callable(getattr(target, "process_records", None)):
            raise ConfigError(f"processor {path!r} has no process_records method")
        if inspect.isabstract(target):
            raise ConfigError(f"processor {path!r} is abstract: implement process_records")
        cls: type[RecordProcessor] = target  # type: ignore[assignment]

        def factory() -> RecordProcessor:
            return cls()

        return factory
    raise ConfigError(f"processor {path!r} is not a class")


async def run_worker(
    cfg: WorkerConfig,
    factory: ProcessorFactory,
    *,
    on_started: Callable[[Worker], Awaitable[None]] | None = None,
    install_signal_handlers: bool = True,
    wrap_store: Callable[[LeaseStore], LeaseStore] | None = None,
    wrap_kinesis: Callable[[Any], Any] | None = None,
    stream_tracker: Callable[[], tuple[StreamSpec, ...]] | None = None,
) -> None:
    """Run one worker until SIGTERM/SIGINT (or ``worker.request_shutdown()``).

    ``wrap_store`` / ``wrap_kinesis`` wrap the real lease store and asyncio Kinesis client (tests
    inject faults through them)."""
    from kclpy_spark.aws import aio_client, boto3_client
    from kclpy_spark.runtime.lease_store import open_lease_store

    _tune_gc()
    store = await asyncio.to_thread(open_lease_store, cfg)
    if wrap_store is not None:
        store = wrap_store(store)
    kinesis_sync = boto3_client("kinesis", cfg)
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
        )
        loop = asyncio.get_running_loop()
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, _on_signal, worker, sig)
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
            if install_signal_handlers:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)


def _tune_gc() -> None:
    """Fewer, cheaper garbage collections for a long-lived consumer.

    Everything imported at start-up is moved out of the collector's sight (``gc.freeze``), and the
    youngest generation is collected every 10,000 allocations instead of 700: a consumer allocates
    a few objects per record and keeps batches in its prefetch queues, and full collections that
    walk all of them measured about 2 us per record (bench/results/consumer.md). Reference
    counting still frees almost everything at once; only cycles wait a little longer.
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


def _on_signal(worker: Worker, sig: signal.Signals) -> None:
    log.info("received %s: shutting down gracefully", sig.name)
    worker.request_shutdown()
