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
from kclpy_spark.spark.batch import BatchSink, FunctionSink
from kclpy_spark.spark.batcher import MicroBatcher
from kclpy_spark.spark.paths import check_sink_path, check_writable, local_path
from kclpy_spark.spark.session import SparkSessionHolder
from kclpy_spark.spark.sink_config import SinkConfig
from kclpy_spark.spark.sink_processor import SparkSinkProcessorFactory
from kclpy_spark.spark.sinks import DeadLetterDirectory, DeltaSink, ParquetSink
from kclpy_spark.user_code import import_user_module

log = logging.getLogger(__name__)


def load_sink(cfg: SinkConfig) -> BatchSink:
    """``parquet:<path>``, ``delta:<path>``, or ``module:attr`` naming a foreachBatch function
    ``fn(df, batch_id)`` or a BatchSink (an object, or a class made with no arguments)."""
    if cfg.sink_kind in ("parquet", "delta"):
        check_sink_path(cfg.sink_kind, cfg.sink_path)
    if cfg.sink_kind == "parquet":
        return ParquetSink(cfg.sink_path)
    if cfg.sink_kind == "delta":
        return DeltaSink(
            cfg.sink_path,
            app_id_prefix=cfg.delta_app_id_prefix,
            via_spark=cfg.value_schema is not None,
        )
    module_name, _, attr = cfg.sink.partition(":")
    target: Any = import_user_module(module_name, "sink")
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(
                f"module {module_name!r} has no {attr!r} (sink {cfg.sink!r})"
            ) from None
    if inspect.isclass(target):
        target = target()
    if callable(getattr(target, "write", None)) and callable(getattr(target, "prepare", None)):
        sink: BatchSink = target
        return sink
    if callable(target):
        _check_foreach_batch_signature(target, cfg.sink)
        return FunctionSink(target)
    raise ConfigError(f"sink {cfg.sink!r} is neither a function fn(df, batch_id) nor a sink")


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
    sink = load_sink(sink_cfg)
    if sink_cfg.dead_letter_path:
        folder = local_path(sink_cfg.dead_letter_path)
        if folder is not None:
            check_writable(folder, "config 'failure_policy' dead-letter")
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
    dead_letter = (
        DeadLetterDirectory(sink_cfg.dead_letter_path) if sink_cfg.dead_letter_path else None
    )
    batcher = MicroBatcher(
        sink, settings, to_df=holder.to_df, interrupter=holder, dead_letter=dead_letter
    )
    # Leave the worker time to release its leases after the processors' last flush.
    shutdown_timeout = min(sink_cfg.shutdown_timeout, 0.75 * worker_cfg.shutdown_grace)
    log.info("Spark sink %r on %s, %s", sink, holder.target.master, settings)
    return SparkSinkProcessorFactory(
        batcher, worker_cfg.stream, shutdown_timeout=shutdown_timeout, on_close=[holder.stop]
    )
