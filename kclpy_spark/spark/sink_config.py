"""The sink's settings: a frozen ``SinkConfig`` read from the ``[sink]`` table of the worker's
TOML file (or ``[kclpy_spark.sink]``). Seconds as floats, sizes in bytes. Each bad value raises
ConfigError naming the key. The batching keys (``max_records`` ... ``commit_retry_delay``) fill
the contained ``BatcherSettings``; the table stays flat.

Defaults that depend on the sink: ``scope`` is ``"lease"`` for your own foreachBatch function (its
``batch_id`` then names one lease's range, stable whoever re-forms it after a crash or a lease
move) and ``"worker"`` for the built-in sinks (idempotent per piece, so any composition is safe);
``regroup_wait`` is 0 for the built-in sinks (they never need a re-formed batch whole);
``batches_in_flight`` is 1 with a function among the sinks (it gets a lease's batches one after
another) and 2 for the built-in sinks. ``writers`` is 2 for every sink.

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
writers = 2                         # batches written at once (threads)
batches_in_flight = 1               # per lease; default 1 with a function, 2 for built-in sinks
value_schema = "id BIGINT, name STRING"   # optional: parse data as JSON into these columns
read_on = "driver"                  # or "executors": Spark tasks read the leased ranges
[sink.spark_conf]
"spark.executor.memory" = "2g"
```

Several sinks: each ``[[sinks]]`` entry names one (``sink``, optional ``name``, and its own
``failure_policy``, ``max_attempts``, ``write_timeout``); ``[sink]`` keeps the shared settings
and no ``sink`` key. Each batch goes to every sink in order; its checkpoint moves when all of
them acknowledged it (acks.py)::

    [[sinks]]
    sink = "parquet:/data/out"
    [[sinks]]
    sink = "alerts:send"
    failure_policy = "dead-letter:/data/alerts-dead"
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.spark.paths import local_only
from kclpy_spark.spark.settings import BatcherSettings, check_write_timeout

_FUNCTION = re.compile(r"^[\w.]+:[\w.]+$")
# Batches written at once unless the config says: 1.20x the records/s of one writer (1.14x to
# 1.47x by round) with a source that costs this machine nothing (as Kinesis), 0.95x-1.07x warm
# with one that competes for its two cores (bench/results/history.md "Two writers by default").
DEFAULT_WRITERS = 2
READ_ON = ("driver", "executors")
# The shortest txn id retention: a lease's pending batch is re-formed by its next owner within a
# failover, or by the same worker at its restart; a day covers a fleet down overnight.
MIN_TXN_RETENTION_DAYS = 1.0
MAX_TXN_RETENTION_DAYS = 36_500.0  # delta-rs fails every read past an i64 of milliseconds
# The default ``batching``: replaced in __post_init__ by the defaults of the sink's kind.
_BY_SINK = BatcherSettings()


@dataclass(frozen=True)
class SinkSpec:
    """One sink of several (a ``[[sinks]]`` entry): where it writes and its own failure policy.
    ``max_attempts`` and ``write_timeout`` left unset take the ``[sink]`` table's values."""

    # Where this sink writes: parquet:<path>, delta:<path> or module:function.
    sink: str
    # The sink's name in logs and in the `kclpy_spark_sinks_*` metrics' `sink` label (default:
    # from its kind).
    name: str = ""
    # park or dead-letter:<path> (a local or mounted folder), for this sink's failures.
    failure_policy: str = "park"
    # This sink's write attempts (default: the [sink] table's).
    max_attempts: int | None = None
    # This sink's write timeout (default: the [sink] table's).
    write_timeout: float | None = None

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", _default_name(self.sink))
        _check_sink(self.sink)
        _check_policy(self.failure_policy)
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(f"config 'max_attempts' of sink {self.name!r} must be >= 1")
        if self.write_timeout is not None:
            check_write_timeout(self.write_timeout, f"config 'write_timeout' of sink {self.name!r}")

    @property
    def kind(self) -> str:
        """``parquet``, ``delta`` or ``function``."""
        return _kind(self.sink)

    @property
    def path(self) -> str:
        return self.sink.split(":", 1)[1] if self.kind != "function" else ""

    @property
    def dead_letter_path(self) -> str | None:
        return _dead_letter_path(self.failure_policy)


@dataclass(frozen=True)
class SinkConfig:
    # Where batches go: parquet:<path>, delta:<path> or module:function (foreachBatch's signature).
    sink: str
    # The Spark master: local[N], spark://host:7077, yarn, k8s://..., or sc://host:15002 (Spark
    # Connect).
    spark_target: str = "local[2]"
    # Spark settings for the session ([sink.spark_conf] table).
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # The Spark application's name.
    app_name: str = "kclpy-spark"
    # The batching keys below, in the same [sink] table.
    batching: BatcherSettings = _BY_SINK
    # A batch that keeps failing: park (its leases parked, redelivered later) or dead-letter:<path>
    # (written there, then acknowledged; a local or mounted folder).
    failure_policy: str = "park"
    # On stop: how long batches in flight may finish (a lease caught up in an --until-caught-up
    # job waits for its writes' own deadlines instead).
    shutdown_timeout: float = 15.0
    # A Spark DDL schema: each record's data parsed as JSON into these columns (unparsed ones kept
    # in unparsed_data).
    value_schema: str | None = None
    # With value_schema: keep the raw bytes in data as well.
    keep_raw_data: bool = False
    # The Delta sink's txn appId prefix (idempotent writes per lease); each id is
    # <prefix>:<application_name>:<lease key>.
    delta_app_id_prefix: str = "kclpy-spark"
    # Days a lease's Delta txn id stays in a table the sink creates after its last write (Delta's
    # delta.setTransactionRetentionDuration, for every writer of the table): the ids of ended
    # leases then leave it. Unset: the sink sets nothing. A batch re-formed from a pending
    # checkpoint later than this is written again.
    delta_txn_retention_days: float | None = None
    # Where records are read: "driver" (the worker's own process) or "executors" (Spark tasks).
    read_on: str = "driver"
    # Several sinks ([[sinks]]): each batch goes to all of them; then ``sink`` is left empty.
    sinks: tuple[SinkSpec, ...] = ()

    def __post_init__(self) -> None:
        if bool(self.sink) == bool(self.sinks):
            raise ConfigError(
                "name the sink once: 'sink' in [sink] for one sink, or [[sinks]] entries "
                "(each with its 'sink') for several"
            )
        if self.batching is _BY_SINK:
            object.__setattr__(self, "batching", _defaults_for([s.sink for s in self.specs]))
        _check(self)

    @property
    def specs(self) -> tuple[SinkSpec, ...]:
        """Every sink, in the order a batch is written to them."""
        return self.sinks or (SinkSpec(self.sink, "sink", self.failure_policy),)

    @property
    def sink_kind(self) -> str:
        """The first sink's kind: ``parquet``, ``delta`` or ``function``."""
        return self.specs[0].kind

    @property
    def sink_path(self) -> str:
        return self.specs[0].path

    @property
    def dead_letter_path(self) -> str | None:
        return self.specs[0].dead_letter_path

    def batcher_settings(self, max_task_bytes: int | None = None) -> BatcherSettings:
        """The batcher's settings, ``max_bytes`` capped at ``max_task_bytes`` (cluster limit)."""
        if max_task_bytes is None or self.batching.max_bytes <= max_task_bytes:
            return self.batching
        return dataclasses.replace(self.batching, max_bytes=max_task_bytes)


def _kind(sink: str) -> str:
    for kind in ("parquet", "delta"):
        if sink.startswith(kind + ":"):
            return kind
    return "function"


def _default_name(sink: str) -> str:
    """``parquet``, ``delta``, or the function's name."""
    kind = _kind(sink)
    return kind if kind != "function" else sink.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def _dead_letter_path(policy: str) -> str | None:
    return policy.split(":", 1)[1] if policy.startswith("dead-letter:") else None


def _check_sink(sink: str) -> None:
    if _kind(sink) == "function":
        if not _FUNCTION.match(sink):
            raise ConfigError(
                "config 'sink' must be 'parquet:<path>', 'delta:<path>' or "
                f"'package.module:function', got {sink!r}"
            )
    elif not sink.split(":", 1)[1]:
        raise ConfigError(f"config 'sink' {sink!r} needs a path after the colon")
    elif _kind(sink) == "parquet":
        problem = local_only(
            sink.split(":", 1)[1], f"config 'sink' {sink!r}: a Parquet sink's path"
        )
        if problem is not None:
            raise ConfigError(f"{problem}; delta:<url> writes to object storage")


def _check_policy(policy: str) -> None:
    dead_letter = (_dead_letter_path(policy) or "").strip()
    if not (policy == "park" or dead_letter):
        raise ConfigError(
            f"config 'failure_policy' must be 'park' or 'dead-letter:<path>', got {policy!r}"
        )
    where = "config 'failure_policy': the dead-letter location"
    problem = local_only(dead_letter, where) if dead_letter else None
    if problem is not None:
        raise ConfigError(problem)


def _check(cfg: SinkConfig) -> None:
    specs = cfg.specs  # each checked its sink and policy when made
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"the [[sinks]] entries need distinct names, got {names}: set 'name' in each"
        )
    from kclpy_spark.spark.session import SparkTarget

    SparkTarget.parse(cfg.spark_target)  # raises ConfigError naming spark_target
    if "spark.master" in cfg.spark_conf:  # it would bypass that check and the target's setup
        raise ConfigError(
            "config 'spark_conf' sets spark.master: set 'spark_target' instead (it is checked, "
            "and the session is set up for it)"
        )
    if not cfg.batching.max_wait > 0:  # 0 (flush at once) is for tests; a sink batches
        raise ConfigError(f"config 'max_wait' must be > 0, got {cfg.batching.max_wait}")
    if not cfg.shutdown_timeout > 0:
        raise ConfigError(f"config 'shutdown_timeout' must be > 0, got {cfg.shutdown_timeout}")
    _check_txn_retention(cfg)
    if cfg.read_on not in READ_ON:
        raise ConfigError(
            f"config 'read_on' must be one of {', '.join(READ_ON)}, got {cfg.read_on!r}"
        )


def _check_txn_retention(cfg: SinkConfig) -> None:
    """A retention at least a day and twice the longest write timeout (a write stamps its
    transaction before its data: one that ends after the retention lands expired), and finite."""
    days = cfg.delta_txn_retention_days
    if days is None:
        return
    timeouts = [cfg.batching.write_timeout, *(s.write_timeout or 0.0 for s in cfg.specs)]
    least = max(MIN_TXN_RETENTION_DAYS, 2 * max(timeouts) / 86_400)
    if not least <= days <= MAX_TXN_RETENTION_DAYS:
        raise ConfigError(
            f"config 'delta_txn_retention_days' must be {least:g}..{MAX_TXN_RETENTION_DAYS:g} "
            f"(at least a day and twice the longest write_timeout: a batch re-formed after it "
            f"is written again), got {days}"
        )


def _defaults_for(sinks: list[str], given: Mapping[str, Any] = {}) -> BatcherSettings:
    """Batching settings with the defaults of the sinks' kinds under the ``given`` ones: those
    of the built-in sinks only when every sink is one. Two writers for every sink (a batch is
    built and written while another is; bench/results/history.md "Two writers by default"); with a
    function among the sinks one batch of a lease in flight, so the function gets a lease's
    batches one after another, in order, while other leases' batches use the second writer;
    ``page_per_lease`` unless ``max_records`` is given."""
    builtin = all(sink.startswith(("parquet:", "delta:")) for sink in sinks)
    # Read on the executors, a round of a page a lease unless a max_records given says otherwise.
    defaults: dict[str, Any] = {
        "writers": DEFAULT_WRITERS,
        "page_per_lease": "max_records" not in given,
    }
    if builtin:
        defaults |= {"scope": "worker", "regroup_wait": 0.0}
    else:
        defaults |= {"scope": "lease", "batches_in_flight": 1}
    settings = BatcherSettings(**{**defaults, **given})
    if not builtin:  # its pieces name their batch (MicroBatcher checks it again, sinks known)
        delta = any(sink.startswith("delta:") for sink in sinks)  # one batch of a lease at once
        settings.check_groups(1 if delta else settings.batches_in_flight)
    return settings


_FIELDS = {f.name: f for f in dataclasses.fields(SinkConfig) if f.name not in ("batching", "sinks")}
_SPEC_FIELDS = {f.name: f for f in dataclasses.fields(SinkSpec)}
_BATCHING = {f.name: f for f in dataclasses.fields(BatcherSettings)}


def _coerce(name: str, value: Any, source: str) -> Any:
    kind = str((_FIELDS.get(name) or _BATCHING.get(name) or _SPEC_FIELDS[name]).type)
    kind = kind.replace(" | None", "") if value is not None else kind
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
        return dict(_flat(value))
    if value is None and "None" in kind:
        return None
    if not isinstance(value, str):
        raise bad
    return value


def _flat(table: Mapping[Any, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``spark.executor.memory = "2g"`` unquoted is a nested table in TOML: its dotted name again
    (it became one setting named ``spark`` whose value was a dict's text)."""
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flat(value, f"{name}.")
        elif isinstance(value, list | tuple):  # spark.jars.packages = ["a:b:1", "c:d:2"]
            yield name, ",".join(_text(v) for v in value)
        else:
            yield name, _text(value)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def sink_config(sink: str, **values: Any) -> SinkConfig:
    """A SinkConfig from flat keyword settings, as the [sink] table gives them (batching keys
    included), with the defaults that depend on the sink."""
    return sink_config_from_mapping({"sink": sink, **values}, source="sink_config()")


def sink_config_from_mapping(
    values: Mapping[str, Any],
    *,
    source: str = "[sink]",
    sinks: Sequence[Mapping[str, Any]] = (),
) -> SinkConfig:
    """The ``[sink]`` table's ``values`` and, for several sinks, the ``[[sinks]]`` entries (then
    ``values`` holds the shared settings, and its ``failure_policy``, ``max_attempts`` and
    ``write_timeout`` are the entries' defaults)."""
    unknown = sorted(set(values) - set(_FIELDS) - set(_BATCHING))
    if unknown:
        raise ConfigError(
            f"unknown sink config key(s) in {source}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted({*_FIELDS, *_BATCHING}))})"
        )
    if "sink" not in values and not sinks:
        raise ConfigError(f"config 'sink' is required in {source}")
    if "sink" in values and sinks:
        raise ConfigError(
            f"{source} names a 'sink' and [[sinks]] entries are given too: with several sinks, "
            "name each in its [[sinks]] entry"
        )
    coerced = {k: _coerce(k, v, source) for k, v in values.items()}
    specs = tuple(_spec(entry, coerced, i) for i, entry in enumerate(sinks))
    batching = {k: coerced.pop(k) for k in list(coerced) if k in _BATCHING}
    if specs:
        coerced.pop("failure_policy", None)  # the entries' default, given to each
        coerced["sink"] = ""
    names = [spec.sink for spec in specs] or [str(coerced["sink"])]
    return SinkConfig(**coerced, batching=_defaults_for(names, batching), sinks=specs)


def _spec(entry: Mapping[str, Any], shared: Mapping[str, Any], index: int) -> SinkSpec:
    source = f"[[sinks]] entry {index + 1}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{source} must be a table")
    unknown = sorted(set(entry) - set(_SPEC_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) in {source}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_SPEC_FIELDS))}; the other settings go in [sink])"
        )
    if "sink" not in entry:
        raise ConfigError(f"config 'sink' is required in {source}")
    inherited = {k: shared[k] for k in ("failure_policy", "max_attempts", "write_timeout")
                 if k in shared}  # fmt: skip
    values = {**inherited, **{k: _coerce(k, v, source) for k, v in entry.items()}}
    return SinkSpec(**values)


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


def sinks_entries(data: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """The ``[[sinks]]`` (or ``[[kclpy_spark.sinks]]``) entries of parsed TOML (may be empty)."""
    entries = data.get("sinks")
    nested = data.get("kclpy_spark")
    if entries is None and isinstance(nested, Mapping):
        entries = nested.get("sinks")
    if entries is None:
        return ()
    if not isinstance(entries, list) or not entries:
        raise ConfigError("config 'sinks' must be one or more [[sinks]] tables")
    return entries


def load_sink_config(path: str | Path) -> SinkConfig | None:
    """The sink settings of a TOML config file, or None when it has neither a ``[sink]`` table
    nor ``[[sinks]]`` entries."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}") from None
    table, entries = sink_table(data), sinks_entries(data)
    if table is None and not entries:
        return None
    return sink_config_from_mapping(table or {}, source=f"{p} [sink]", sinks=entries)


def check_installed(cfg: SinkConfig, found: Any = None) -> None:
    """One line naming the extra to install when a module the sinks need is missing (the core
    install runs RecordProcessors without Spark: ``pip install 'kclpy-spark[spark]'``)."""
    import importlib.util

    find = found or importlib.util.find_spec
    needs = {"pyspark": "spark", "pyarrow": "spark", "pandas": "spark"}
    if any(spec.kind == "delta" for spec in cfg.specs):
        needs["deltalake"] = "delta"
    missing = sorted(m for m in needs if find(m) is None)
    if missing:
        extras = ",".join(sorted({needs[m] for m in missing}))
        raise ConfigError(
            f"the [sink] table needs {', '.join(missing)}, which this install lacks: "
            f"pip install 'kclpy-spark[{extras}]'"
        )
