"""From settings to a running sink: what the daemon calls when the config has a ``[sink]`` table.

```python
factory = processor_factory_from_sink_config(sink_cfg, worker_cfg)   # starts Spark now
try:
    asyncio.run(run_worker(worker_cfg, factory))
finally:
    factory.close()
```
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.config import WorkerConfig
from kclpy_spark.runtime.streams import RecordSourcesFor
from kclpy_spark.spark.executor_reads import ExecutorReads
from kclpy_spark.spark.micro_batcher import MicroBatcher
from kclpy_spark.spark.paths import check_sink_path, check_writable, local_path
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.sink_batch import BatchSink, FunctionSink, SinkRoute
from kclpy_spark.spark.sink_config import SinkConfig, SinkSpec
from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory
from kclpy_spark.spark.sinks import (
    DeadLetterDirectory,
    DeltaSink,
    ParquetSink,
    stale_staging_after,
)
from kclpy_spark.spark.values import spark_flag
from kclpy_spark.user_code import import_user_module

log = logging.getLogger(__name__)


def load_sink(cfg: SinkConfig, spec: SinkSpec | None = None, application: str = "") -> BatchSink:
    """``parquet:<path>``, ``delta:<path>``, or ``module:attr`` naming a foreachBatch function
    ``fn(df, batch_id)`` or a BatchSink (an object, or a class made with no arguments).
    ``spec``: which of the config's sinks (default: the first); ``application``: the worker's
    application_name, in the Delta sink's transaction ids (two applications' leases of one name,
    each stream's ``shardId-000000000000``, shared one id in a table they both write: one's
    versions made the other's pieces look committed, and they were skipped)."""
    spec = spec or cfg.specs[0]
    if spec.kind in ("parquet", "delta"):
        check_sink_path(spec.kind, spec.path)
    if spec.kind == "parquet":
        timeout = spec.write_timeout or cfg.batching.write_timeout
        return ParquetSink(spec.path, stale_staging=stale_staging_after(timeout))
    if spec.kind == "delta":
        return DeltaSink(
            spec.path,
            app_id_prefix=":".join(p for p in (cfg.delta_app_id_prefix, application) if p),
            via_spark=cfg.value_schema is not None,
            txn_retention_days=cfg.delta_txn_retention_days,
        )
    return _user_sink(spec.sink)


def _user_sink(name: str) -> BatchSink:
    module_name, _, attr = name.partition(":")
    target: Any = import_user_module(module_name, "sink")
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no {attr!r} (sink {name!r})") from None
    if inspect.isclass(target):
        target = target()
    if callable(getattr(target, "write", None)) and callable(getattr(target, "prepare", None)):
        sink: BatchSink = target
        return sink
    if callable(target):
        _check_foreach_batch_signature(target, name)
        return FunctionSink(target)
    raise ConfigError(f"sink {name!r} is neither a function fn(df, batch_id) nor a sink")


def _check_foreach_batch_signature(fn: Any, name: str) -> None:
    """Refuse at start-up a function that cannot be called as Spark's ``fn(df, batch_id)``,
    rather than failing (and parking leases) on the first batch."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C function: nothing to check
    try:
        signature.bind(object(), 0)
    except TypeError:
        raise ConfigError(
            f"sink {name!r} must take foreachBatch's two arguments (df, batch_id); "
            f"its signature is {fn.__name__ if hasattr(fn, '__name__') else fn}{signature}"
        ) from None


def _route(
    cfg: SinkConfig, spec: SinkSpec, settings: BatcherSettings, application: str
) -> SinkRoute:
    """One sink, loaded and checked, with its failure policy (unset parts: the [sink] table's)."""
    sink = load_sink(cfg, spec, application)
    dead_letter = None
    if spec.dead_letter_path:
        folder = local_path(spec.dead_letter_path)
        if folder is not None:
            check_writable(folder, f"config 'failure_policy' dead-letter of sink {spec.name!r}")
        several = len(cfg.specs) > 1
        dead_letter = DeadLetterDirectory(spec.dead_letter_path, spec.name if several else None)
    return SinkRoute(
        spec.name,
        sink,
        spec.max_attempts or settings.max_attempts,
        spec.write_timeout or settings.write_timeout,
        dead_letter,
    )


def processor_factory_from_sink_config(
    sink_cfg: SinkConfig,
    worker_cfg: WorkerConfig,
    *,
    session: SparkSessionHolder | None = None,
    start_session: bool = True,
) -> SparkSinkProcessorFactory:
    """A processor factory for ``run_worker`` that feeds one shared MicroBatcher. The Spark
    session starts here (unless ``start_session`` is False), so a missing Java or an unreachable
    Connect server is reported at startup as a ConfigError or a clear exception. Call ``close()``
    on the result after the worker stopped."""
    holder = session or SparkSessionHolder(
        sink_cfg.spark_target,
        app_name=sink_cfg.app_name,
        conf=sink_cfg.spark_conf,
        value_schema=sink_cfg.value_schema,
        keep_raw_data=sink_cfg.keep_raw_data,
    )
    settings = sink_cfg.batching
    application = worker_cfg.application_name
    routes = [_route(sink_cfg, spec, settings, application) for spec in sink_cfg.specs]
    if start_session:
        holder.session()
        holder.check_value_schema()
    settings = sink_cfg.batcher_settings(holder.max_batch_bytes())
    if settings.max_bytes < sink_cfg.batching.max_bytes:
        log.warning(
            "max_bytes lowered from %d to %d: Spark tasks on %s are limited by "
            "spark.rpc.message.maxSize",
            sink_cfg.batching.max_bytes,
            settings.max_bytes,
            holder.target.master,
        )
    reads = _executor_reads(sink_cfg, worker_cfg, holder, settings, probe=start_session)
    if start_session:  # after the executors' probe: its one line names a missing install first
        _check_shared_folders(sink_cfg, holder)
    batcher = MicroBatcher(
        routes, settings, to_df=holder.to_df, interrupter=holder, reads=reads, parse=holder.parse
    )
    # Leave the worker time to release its leases after the processors' last flush.
    shutdown_timeout = min(sink_cfg.shutdown_timeout, 0.75 * worker_cfg.shutdown_grace)
    log.info(
        "Spark sink%s %s on %s, %s",
        "s" if len(routes) > 1 else "",
        ", ".join(repr(r.sink) for r in routes),
        holder.target.master,
        settings,
    )
    return SparkSinkProcessorFactory(
        batcher,
        worker_cfg.stream,
        shutdown_timeout=shutdown_timeout,
        on_close=[holder.stop],
        session=holder,
        record_sources=None if reads is None else _relays(reads),
        reads=reads,
    )


def _check_shared_folders(cfg: SinkConfig, holder: SparkSessionHolder) -> None:
    """Where the executors may run on other machines, each ``parquet:`` folder on a local path
    must be one they all see (probe_shared_folder): one line at start-up, not records lost."""
    from kclpy_spark.spark.executor_probe import probe_shared_folder
    from kclpy_spark.spark.session import TargetKind

    if holder.target.kind is not TargetKind.CLUSTER or holder.target.loopback:
        return  # local[N], this machine only, or Spark Connect (its server writes the folder)
    for spec in cfg.specs:
        folder = local_path(spec.path) if spec.kind == "parquet" else None
        if folder is not None:
            what = f"config 'sink' parquet:{spec.path}"
            probe_shared_folder(holder.session(), folder, what, jobs=holder)


def refuse_speculation(session: Any) -> None:
    """Reading on the executors needs each read task computed once: a speculative copy reads
    the shard again and may store other records for the same partition, and a sink could then
    write the copy the driver did not take its ends from (records lost or twice). One line at
    start-up (spark_conf, spark-defaults.conf or the cluster's settings may turn it on)."""
    if spark_flag(session, "spark.speculation"):
        raise ConfigError(
            'read_on = "executors" needs spark.speculation off (a speculative copy of a read '
            "task reads the shard again and may keep other records): set it to false in "
            '[sink.spark_conf] or spark-defaults.conf, or read_on = "driver"'
        )


def _executor_reads(
    sink_cfg: SinkConfig,
    worker_cfg: WorkerConfig,
    holder: SparkSessionHolder,
    settings: BatcherSettings,
    *,
    probe: bool,
) -> ExecutorReads | None:
    """With ``read_on = "executors"``: the reads, after a probe job asked the executors whether
    they can import this project and reach the stream (one line at start-up if not)."""
    if sink_cfg.read_on != "executors":
        return None
    if worker_cfg.retrieval_mode == "fanout":  # the executors would poll, unasked
        raise ConfigError(
            'config \'retrieval_mode\' = "fanout" does not go with [sink] read_on = "executors": '
            "the executors read with GetRecords, sharing each shard's 5 calls a second and "
            '2 MiB/s with every other consumer; use read_on = "driver" for enhanced fan-out'
        )
    from kclpy_spark.aws import region_of
    from kclpy_spark.spark.executor_probe import probe_executors
    from kclpy_spark.spark.executor_reads import ExecutorReads
    from kclpy_spark.spark.range_tasks import AwsTarget
    from kclpy_spark.spark.read_settings import ReadSettings

    aws = AwsTarget(region_of(worker_cfg), worker_cfg.endpoint_url)
    if probe:
        refuse_speculation(holder.session())
        probe_executors(holder.session(), aws, worker_cfg.stream_specs[0].request, jobs=holder)
    if any(spec.kind == "delta" for spec in sink_cfg.specs):
        log.warning("read_on = executors with a Delta sink: Delta is written from the driver, "
                    "so its batches are collected there (read_on = driver costs less)")  # fmt: skip
    read = ReadSettings(
        max_records=settings.max_records,
        page_per_lease=settings.page_per_lease,
        max_bytes=settings.max_bytes,
        read_rate=float(worker_cfg.max_read_bytes_per_second),
        idle_seconds=worker_cfg.idle_time_between_reads,
        kpl=worker_cfg.kpl_deaggregation,
    )
    return ExecutorReads(holder.session, aws, read, jobs=holder, garbage=holder.jvm_garbage)


def _relays(reads: ExecutorReads) -> RecordSourcesFor:
    from kclpy_spark.spark.relay import ExecutorSources

    return lambda spec, stream_key: ExecutorSources(reads, spec, stream_key)
