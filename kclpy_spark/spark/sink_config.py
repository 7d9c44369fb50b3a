"""The sink's settings: a frozen ``SinkConfig`` read from the ``[sink]`` table of the worker's
TOML file (or ``[kclpy_spark.sink]``). Seconds as floats, sizes in bytes. Each bad value raises
ConfigError naming the key. The batching keys (``max_records`` ... ``commit_retry_delay``) fill
the contained ``BatcherSettings``; the table stays flat.

Defaults that depend on the sink: ``scope`` is ``"lease"`` for your own foreachBatch function (its
``batch_id`` then names one lease's range, stable whoever re-forms it after a crash or a lease
move) and ``"worker"`` for the built-in sinks (idempotent per piece, so any composition is safe);
``regroup_wait`` is 0 for the built-in sinks (they never need a re-formed batch whole).

```toml
[sink]
sink = "parquet:/data/out"          # or "delta:/data/table", or "my.module:foreach_batch"
spark_target = "local[2]"           # spark://host:7077, yarn, k8s://..., sc://host:15002
max_records = 100000
max_bytes = 67108864
max_wait = 5.0
scope = "lease"                     # "worker": one batch over the worker's leases
max_attempts = 5
failure_policy = "park"             # or "dead-letter:/data/dead-letters"
write_timeout = 600.0
value_schema = "id BIGINT, name STRING"   # optional: parse data as JSON into these columns
[sink.spark_conf]
"spark.executor.memory" = "2g"
```
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.spark.settings import BatcherSettings

_FUNCTION = re.compile(r"^[\w.]+:[\w.]+$")
# The default ``batching``: replaced in __post_init__ by the defaults of the sink's kind.
_BY_SINK = BatcherSettings()


@dataclass(frozen=True)
class SinkConfig:
    sink: str
    spark_target: str = "local[2]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "kclpy-spark"
    batching: BatcherSettings = _BY_SINK
    failure_policy: str = "park"
    shutdown_timeout: float = 15.0
    value_schema: str | None = None
    keep_raw_data: bool = False
    delta_app_id_prefix: str = "kclpy-spark"

    def __post_init__(self) -> None:
        if self.batching is _BY_SINK:
            object.__setattr__(self, "batching", _defaults_for(self.sink))
        _check(self)

    @property
    def sink_kind(self) -> str:
        """``parquet``, ``delta`` or ``function``."""
        for kind in ("parquet", "delta"):
            if self.sink.startswith(kind + ":"):
                return kind
        return "function"

    @property
    def sink_path(self) -> str:
        return self.sink.split(":", 1)[1] if self.sink_kind != "function" else ""

    @property
    def dead_letter_path(self) -> str | None:
        if self.failure_policy.startswith("dead-letter:"):
            return self.failure_policy.split(":", 1)[1]
        return None

    def batcher_settings(self, max_task_bytes: int | None = None) -> BatcherSettings:
        """The batcher's settings, ``max_bytes`` capped at ``max_task_bytes`` (cluster limit)."""
        if max_task_bytes is None or self.batching.max_bytes <= max_task_bytes:
            return self.batching
        return dataclasses.replace(self.batching, max_bytes=max_task_bytes)


def _check(cfg: SinkConfig) -> None:
    if cfg.sink_kind == "function":
        if not _FUNCTION.match(cfg.sink):
            raise ConfigError(
                "config 'sink' must be 'parquet:<path>', 'delta:<path>' or "
                f"'package.module:function', got {cfg.sink!r}"
            )
    elif not cfg.sink_path:
        raise ConfigError(f"config 'sink' {cfg.sink!r} needs a path after the colon")
    from kclpy_spark.spark.session import SparkTarget

    SparkTarget.parse(cfg.spark_target)  # raises ConfigError naming spark_target
    if not (cfg.failure_policy == "park" or (cfg.dead_letter_path or "").strip()):
        raise ConfigError(
            "config 'failure_policy' must be 'park' or 'dead-letter:<path>', "
            f"got {cfg.failure_policy!r}"
        )
    if not cfg.batching.max_wait > 0:  # 0 (flush at once) is for tests; a sink batches
        raise ConfigError(f"config 'max_wait' must be > 0, got {cfg.batching.max_wait}")
    if not cfg.shutdown_timeout > 0:
        raise ConfigError(f"config 'shutdown_timeout' must be > 0, got {cfg.shutdown_timeout}")


def _defaults_for(sink: str, given: Mapping[str, Any] = {}) -> BatcherSettings:
    """Batching settings with the defaults of the sink's kind under the ``given`` ones."""
    builtin = sink.startswith(("parquet:", "delta:"))
    defaults = {"scope": "worker", "regroup_wait": 0.0} if builtin else {"scope": "lease"}
    return BatcherSettings(**{**defaults, **given})


_FIELDS = {f.name: f for f in dataclasses.fields(SinkConfig) if f.name != "batching"}
_BATCHING = {f.name: f for f in dataclasses.fields(BatcherSettings)}


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = str((_FIELDS.get(name) or _BATCHING[name]).type)
    bad = ConfigError(f"config {name!r} in {source} must be of type {kind}, got {value!r}")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad
        return float(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind.startswith("Mapping"):
        if not isinstance(value, Mapping):
            raise bad
        return {str(k): str(v) for k, v in value.items()}
    if value is None and "None" in kind:
        return None
    if not isinstance(value, str):
        raise bad
    return value


def sink_config(sink: str, **values: Any) -> SinkConfig:
    """A SinkConfig from flat keyword settings, as the [sink] table gives them (batching keys
    included), with the defaults that depend on the sink."""
    return sink_config_from_mapping({"sink": sink, **values}, source="sink_config()")


def sink_config_from_mapping(values: Mapping[str, Any], *, source: str = "[sink]") -> SinkConfig:
    unknown = sorted(set(values) - set(_FIELDS) - set(_BATCHING))
    if unknown:
        raise ConfigError(
            f"unknown sink config key(s) in {source}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted({*_FIELDS, *_BATCHING}))})"
        )
    if "sink" not in values:
        raise ConfigError(f"config 'sink' is required in {source}")
    coerced = {k: _coerce(k, v, source) for k, v in values.items()}
    batching = {k: coerced.pop(k) for k in list(coerced) if k in _BATCHING}
    return SinkConfig(**coerced, batching=_defaults_for(str(coerced["sink"]), batching))


def sink_table(data: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``[sink]`` (or ``[kclpy_spark.sink]``) table of parsed TOML, or None."""
    table = data.get("sink")
    nested = data.get("kclpy_spark")
    if table is None and isinstance(nested, Mapping):
        table = nested.get("sink")
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError("config 'sink' must be a table ([sink])")
    return table


def load_sink_config(path: str | Path) -> SinkConfig | None:
    """The sink settings of a TOML config file, or None when it has no ``[sink]`` table."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}") from None
    table = sink_table(data)
    return None if table is None else sink_config_from_mapping(table, source=f"{p} [sink]")
