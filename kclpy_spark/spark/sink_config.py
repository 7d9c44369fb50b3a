"""The sink's settings: a frozen ``SinkConfig`` read from the ``[sink]`` table of the worker's
TOML file (or ``[kclpy_spark.sink]``). Seconds as floats, sizes in bytes. Each bad value raises
ConfigError naming the key.

```toml
[sink]
sink = "parquet:/data/out"          # or "delta:/data/table", or "my.module:foreach_batch"
spark_target = "local[2]"           # spark://host:7077, yarn, k8s://..., sc://host:15002
max_records = 100000
max_bytes = 67108864
max_wait = 5.0
scope = "worker"                    # or "lease": one lease per batch
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
from typing import TYPE_CHECKING, Any

from checkpoint.base.errors import ConfigError

if TYPE_CHECKING:
    from kclpy_spark.spark.settings import BatcherSettings

_FUNCTION = re.compile(r"^[\w.]+:[\w.]+$")


@dataclass(frozen=True)
class SinkConfig:
    sink: str
    spark_target: str = "local[2]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "kclpy-spark"
    max_records: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    max_wait: float = 5.0
    scope: str = "worker"
    writers: int = 1
    buffer_bytes: int = 0
    max_attempts: int = 5
    retry_base_delay: float = 1.0
    retry_max_delay: float = 30.0
    write_timeout: float = 600.0
    failure_policy: str = "park"
    regroup_wait: float = 30.0
    shutdown_timeout: float = 15.0
    value_schema: str | None = None
    keep_raw_data: bool = False
    delta_app_id_prefix: str = "kclpy-spark"

    def __post_init__(self) -> None:
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
        from kclpy_spark.spark.settings import BatcherSettings

        max_bytes = (
            self.max_bytes if max_task_bytes is None else min(self.max_bytes, max_task_bytes)
        )
        return BatcherSettings(
            max_records=self.max_records,
            max_bytes=max_bytes,
            max_wait=self.max_wait,
            scope="lease" if self.scope == "lease" else "worker",
            max_attempts=self.max_attempts,
            retry_base_delay=self.retry_base_delay,
            retry_max_delay=self.retry_max_delay,
            write_timeout=self.write_timeout,
            writers=self.writers,
            buffer_bytes=self.buffer_bytes,
            regroup_wait=self.regroup_wait,
        )


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
    if cfg.scope not in {"worker", "lease"}:
        raise ConfigError(f"config 'scope' must be 'worker' or 'lease', got {cfg.scope!r}")
    if not (cfg.failure_policy == "park" or (cfg.dead_letter_path or "").strip()):
        raise ConfigError(
            "config 'failure_policy' must be 'park' or 'dead-letter:<path>', "
            f"got {cfg.failure_policy!r}"
        )
    for name in ("max_records", "max_bytes", "writers", "max_attempts"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"config {name!r} must be >= 1, got {getattr(cfg, name)}")
    if cfg.buffer_bytes < 0:
        raise ConfigError(f"config 'buffer_bytes' must be >= 0, got {cfg.buffer_bytes}")
    for name in ("max_wait", "write_timeout", "shutdown_timeout"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"config {name!r} must be > 0, got {getattr(cfg, name)}")
    for name in ("retry_base_delay", "retry_max_delay", "regroup_wait"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"config {name!r} must be >= 0, got {getattr(cfg, name)}")


_FIELDS = {f.name: f for f in dataclasses.fields(SinkConfig)}


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = str(_FIELDS[name].type)
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


def sink_config_from_mapping(values: Mapping[str, Any], *, source: str = "[sink]") -> SinkConfig:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown sink config key(s) in {source}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_FIELDS))})"
        )
    if "sink" not in values:
        raise ConfigError(f"config 'sink' is required in {source}")
    return SinkConfig(**{k: _coerce(k, v, source) for k, v in values.items()})


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
