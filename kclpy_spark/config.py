"""The daemon's one typed configuration: a TOML file, overridden by command-line flags.

Every duration is in seconds (floats). The KCL's ``...Millis`` property names are accepted only at
the edge (the .properties reader) and converted once. Each bad value raises ConfigError naming
the key.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition
from kclpy_spark.config_checks import check
from kclpy_spark.stream_spec import StreamSpec, arn_stream_name

DEFAULT_LEASE_STORE = "sqlite:.kclpy-spark/leases.db"
# us-east-1, eu-central-2, us-gov-west-1, cn-northwest-1, us-isob-east-1 ...


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WorkerConfig:
    """What one worker process needs. Field names double as the TOML keys."""

    # The application: names the lease table (DynamoDB) and, by default, the fan-out consumer.
    application_name: str = "kclpy-spark-app"
    # The Java KCL application beside this one in a mixed fleet, whose KCL 3.0-3.4 tables
    # <name>-WorkerMetricStats and <name>-CoordinatorState show its workers; None: the
    # application_name (MultiLang sets it to applicationName when tableName names the table).
    kcl_application_name: str | None = None
    # The stream to read (or stream_arn, or [[streams]]).
    stream_name: str | None = None
    # The stream to read by ARN (its region is the clients' when region is not set).
    stream_arn: str | None = None
    # Multi-stream mode: several streams, each a [[streams]] table (stream_name or stream_arn,
    # optional initial_position); lease keys then carry the stream (the KCL's format).
    streams: tuple[StreamSpec, ...] = ()
    # None: the stream ARN's region, else the SDK's (AWS_REGION, AWS_DEFAULT_REGION, the profile's
    # ``region``), else us-east-1 with a local endpoint_url; kclpy_spark/aws.py decides.
    region: str | None = None
    # A named profile of ~/.aws/config for credentials and region (None: AWS_PROFILE or default).
    profile: str | None = None
    # A local endpoint (LocalStack, kinesalite) for Kinesis and DynamoDB; None = AWS's TLS defaults.
    endpoint_url: str | None = None
    # Where a shard without a checkpoint starts: LATEST, TRIM_HORIZON or AT_TIMESTAMP:<epoch or ISO
    # time>.
    initial_position: InitialPosition = field(default_factory=InitialPosition.latest)
    # "sqlite:<path>" (embedded, one machine), "dynamodb" (table = application name), "memory".
    lease_store: str = DEFAULT_LEASE_STORE
    # Create the DynamoDB lease table (on-demand billing, the KCL's schema and owner index) when it
    # is missing.
    create_lease_table: bool = True
    # Your RecordProcessor as "package.module:Class" (or a [sink] table instead).
    processor: str | None = None
    # This worker's lease owner name: unique per running worker.
    worker_id: str = field(default_factory=_default_worker_id)
    # A lease not renewed for this long is taken by another worker (the KCL's failoverTimeMillis).
    failover_time: float = 10.0
    # The largest wall-clock difference between two workers' machines that lease expiry allows
    # for (leases are stamped with their writer's time): a dead worker's leases move
    # failover_time + max_clock_skew after its last write.
    max_clock_skew: float = 1.0
    # Records asked for per GetRecords call.
    max_records: int = 10_000
    # Seconds between GetRecords calls on a shard that is at its tip (at least 0.2: Kinesis allows
    # 5 calls a second per shard, shared by every application polling it).
    idle_time_between_reads: float = 1.0
    # Per shard, polling: a call that read B bytes waits B / this many seconds before the next
    # (Kinesis's 2 MiB/s read limit per shard, shared by every application polling it); 0: off.
    max_read_bytes_per_second: int = 2 * 1024 * 1024
    # The most leases this worker holds.
    max_leases_for_worker: int = 2**31 - 1
    # The most leases this worker takes from others in one balancing round.
    max_leases_to_steal: int = 1
    # Balancing moves (and SIGTERM) go by the KCL 3.x graceful handoff, forced after
    # handoff_timeout s. False: the KCL 2.x steal (records since the checkpoint come again).
    graceful_handoff: bool = True
    # False: never steal from a worker that does not follow hand-offs (a KCL 2.x worker, kcl-rs;
    # KCL 3.x workers with a metrics entity and ours do): its leases come only when released or
    # expired, so moving a fleet over delivers nothing twice; balance then rests on its steals.
    steal_from_kcl_workers: bool = True
    # "worker": every worker scans and takes its share (the KCL 2.x rule, with the handoff).
    # "leader": the shard-sync leader scans and assigns; the others Query the owner index.
    # "auto": "worker" until the leader sees at least auto_assignment_leases open leases and
    # auto_assignment_workers running workers, then "leader" (back below three quarters).
    lease_assignment: str = "auto"
    # With lease_assignment = auto: open leases from which the leader assigns.
    auto_assignment_leases: int = 128
    # With lease_assignment = auto: running workers from which the leader assigns.
    auto_assignment_workers: int = 8
    # "auto": balance CPU once the fleet is busy, else throughput (moves/rules/load.py).
    load_metric: str = "auto"
    # A graceful handoff waits this long for the holder's last checkpoint, then the lease moves
    # anyway.
    handoff_timeout: float = 30.0
    # True: a lease's counter moves every failover_time / 2, by a renewal unless a checkpoint
    # moved it lately (then a renewal every failover time, for its figures), from rounds every
    # failover_time / 12. False: the KCL's schedule, every lease every failover_time / 3.
    skip_checkpointed_renewals: bool = True
    # How often the shard-sync leader lists shards to find new ones.
    shard_sync_interval: float = 60.0
    # How often a child shard's lease checks whether its parents have ended.
    parent_shard_poll_interval: float = 10.0
    # GetRecords answers read ahead per shard while the processor works.
    prefetch_batches: int = 3
    # On SIGTERM: how long leases are handed over and processors finish before the worker exits.
    shutdown_grace: float = 20.0
    # A batch whose process_records keeps raising is offered again with backoff this many times,
    # then its lease is parked for park_duration and redelivered from the last checkpoint.
    max_processing_attempts: int = 10
    # How long a parked lease waits before it is redelivered from its last checkpoint.
    park_duration: float = 60.0
    # Skip lease creation for child shards whose parents have no lease (the KCL's flag of the same
    # name).
    ignore_unexpected_child_shards: bool = False
    # Prometheus /metrics plus /healthz and /readyz; None = no HTTP server.
    metrics_port: int | None = None
    # The address metrics_port binds (127.0.0.1: this machine only).
    metrics_host: str = "127.0.0.1"
    # Host names the HTTP port answers to besides any address, localhost and this machine's
    # names, comma-separated (a Host header naming anything else gets 421: board/routes.py).
    metrics_host_names: str = ""
    # A stored sequence number older than the stream's retention: "earliest" (restart at
    # TRIM_HORIZON, logged as an error: what aged out between is gone; a quiet shard's
    # checkpointed record may simply have aged out), "fail" (park the lease until a reset: its
    # newer records age out meanwhile) or "latest" (restart at LATEST: records lost). A quiet
    # shard whose checkpointed record aged out with nothing lost looks the same: "fail" parks
    # it, and "latest" skips what arrived after it.
    # Druid's resetOffsetAutomatically, made explicit.
    aged_checkpoint_policy: str = "earliest"
    # KPL aggregated records are split into their sub-records (the KCL always does this).
    kpl_deaggregation: bool = True
    # "polling" (GetRecords) or "fanout" (enhanced fan-out: SubscribeToShard through a registered
    # stream consumer named consumer_name, by default the application name).
    retrieval_mode: str = "polling"
    # Enhanced fan-out's registered consumer (default: the application name).
    consumer_name: str | None = None
    # Seconds the lease table or a stream may be gone (deleted) before the daemon gives up and
    # exits non-zero; until then it says "not ready" and retries.
    missing_dependency_timeout: float = 300.0
    # A processor call (process_records, initialize, shard_ended) running longer makes the
    # worker not ready and is logged: a hung processor holds its lease without progress.
    processor_stall_timeout: float = 900.0
    # Run as a job: process every shard up to where it ended when the worker started, commit,
    # and exit (0; 1 with one line if something could not be committed). runtime/caught_up.py
    until_caught_up: bool = False

    def __post_init__(self) -> None:
        check(self)

    @property
    def stream(self) -> str:
        if self.streams:
            return ",".join(s.label for s in self.streams)
        return self.stream_arn or str(self.stream_name)

    @property
    def stream_specs(self) -> tuple[StreamSpec, ...]:
        """The configured streams: the [[streams]] list, or the one stream."""
        if self.streams:
            return self.streams
        return (StreamSpec(self.stream_name, self.stream_arn, None),)

    @property
    def sqlite_path(self) -> Path | None:
        if self.lease_store.startswith("sqlite:"):  # "~" is the home folder, as in a shell
            try:
                return Path(self.lease_store.removeprefix("sqlite:")).expanduser()
            except RuntimeError as exc:  # ~nosuchuser, or no home folder
                raise ConfigError(f"config 'lease_store' {self.lease_store!r}: {exc}") from None
        return None

    def with_overrides(self, **overrides: Any) -> WorkerConfig:
        given = {k: v for k, v in overrides.items() if v is not None}
        return from_mapping({**_as_mapping(self), **given}, source="command line")


_FIELDS = {f.name: f for f in dataclasses.fields(WorkerConfig)}


def _as_mapping(cfg: WorkerConfig) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in _FIELDS}


def _coerce(name: str, value: Any, source: str) -> Any:
    if name == "streams":
        if not isinstance(value, list | tuple):
            raise ConfigError(f"config 'streams' in {source} must be a list of [[streams]] tables")
        return tuple(StreamSpec.parse(v, source) for v in value)
    if name == "initial_position":
        if isinstance(value, InitialPosition):
            return value
        try:
            return InitialPosition.parse(str(value))
        except ValueError as exc:
            raise ConfigError(f"config 'initial_position' in {source}: {exc}") from None
    kind = _FIELDS[name].type
    try:
        if kind in ("float",):
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if kind in ("int", "int | None"):
            if value is None and kind != "int":
                return None
            # true is not port 1, nor 18080.7 port 18080
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if kind == "bool":
            if isinstance(value, str):
                if value.lower() in {"true", "1", "yes"}:
                    return True
                if value.lower() in {"false", "0", "no"}:
                    return False
                raise TypeError
            if not isinstance(value, bool):
                raise TypeError
            return value
        if value is None:
            return None
        if not isinstance(value, str):
            raise TypeError
        return value
    except (TypeError, ValueError, OverflowError):  # 1e400 is no float, nor inf an int
        raise ConfigError(
            f"config {name!r} in {source} must be of type {kind}, got {repr(value)[:100]}"
        ) from None


def from_mapping(values: Mapping[str, Any], *, source: str = "configuration") -> WorkerConfig:
    _check_known(values, source)
    coerced = {k: _coerce(k, v, source) for k, v in values.items()}
    return WorkerConfig(**coerced)


def _check_known(values: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) in {source}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_FIELDS))})"
        )


ENV_PREFIX = "KCLPY_SPARK_"  # KCLPY_SPARK_<KEY> (upper case) overrides a key of the file


def layered(
    path: str | Path | None, environ: Mapping[str, str], flags: Mapping[str, Any]
) -> WorkerConfig:
    """The configuration users get: each key from its flag, else ``KCLPY_SPARK_<KEY>`` in the
    environment (set and not empty), else the file, else its default (``streams`` only from the
    file)."""
    values = toml_table(path) if path is not None else {}
    given = {k: _coerce(k, v, "command line") for k, v in flags.items() if v is not None}
    for layer in (environment_values(environ), given):
        drop_other_streams(values, layer)
        values.update(layer)
    return WorkerConfig(**values)


STREAM_KEYS = frozenset({"stream_name", "stream_arn", "streams"})


def drop_other_streams(values: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """The stream is one setting in three keys: a layer that names a stream drops the lower
    layers' keys that name another (a flag's stream_name beside the file's stream_arn of
    another stream was refused as two streams); a key naming the same stream stays (the
    file's ARN of a stream in another account, with its name given again)."""
    if not STREAM_KEYS & layer.keys():
        return
    names = {_stream_name(k, v) for k, v in layer.items() if k in ("stream_name", "stream_arn")}
    for key in STREAM_KEYS - layer.keys():
        if key in values and (key == "streams" or _stream_name(key, values[key]) not in names):
            del values[key]


def _stream_name(key: str, value: Any) -> str | None:
    """The stream a ``stream_name`` or ``stream_arn`` value names (None: none, or malformed)."""
    if key == "stream_name":
        return value if isinstance(value, str) and value else None
    return arn_stream_name(value)


def environment_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The keys ``environ`` sets as ``KCLPY_SPARK_<KEY>`` (set and not empty; ``streams`` only
    from a file), each of its type; a WARNING names each variable of the prefix that is no
    key."""
    _warn_unknown_variables(environ)
    if environ.get(ENV_PREFIX + "STREAMS"):
        logging.getLogger(__name__).warning(
            "environment variable %sSTREAMS is ignored: [[streams]] come from the config file only",
            ENV_PREFIX,
        )
    values: dict[str, Any] = {}
    for name in _FIELDS:
        text = environ.get(ENV_PREFIX + name.upper())
        if text and name != "streams":  # an empty variable is as good as unset
            values[name] = _coerce(name, text, f"environment {ENV_PREFIX}{name.upper()}")
    return values


# Variables of the prefix that are no config key: switches read elsewhere.
# (PYTHON and TEST_WORKERS: the set-up scripts' and the test command's)
_OTHER_VARIABLES = frozenset({"FAST_DECODE", "SAMPLE_OUTPUT", "PYTHON", "TEST_WORKERS"})


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """A misspelt KCLPY_SPARK_ variable did nothing, silently (a misspelt file key is an
    error): a WARNING names it and the nearest key."""
    import difflib

    keys = [name.upper() for name in _FIELDS]
    for variable in sorted(v for v in environ if v.startswith(ENV_PREFIX)):
        name = variable.removeprefix(ENV_PREFIX)
        if name in keys or name in _OTHER_VARIABLES:
            continue
        near = difflib.get_close_matches(name, keys, n=1)
        hint = f" (did you mean {ENV_PREFIX}{near[0]}?)" if near else ""
        logging.getLogger(__name__).warning(
            "environment variable %s is no config key and is ignored%s", variable, hint
        )


def load_toml(path: str | Path) -> WorkerConfig:
    """Read a TOML config file: top-level keys, or a ``[kclpy_spark]`` table."""
    return WorkerConfig(**toml_table(path))


def toml_table(path: str | Path) -> dict[str, Any]:
    """A TOML config file's worker keys, each of its type (one line naming a bad one)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc}") from None
    table = data.get("kclpy_spark", data)
    if not isinstance(table, dict):
        raise ConfigError(f"config file {str(p)!r}: [kclpy_spark] must be a table")
    beside = sorted(set(data) & set(_FIELDS)) if table is not data else []
    if beside:  # worker keys there were ignored, silently (other tools' keys may share the file)
        raise ConfigError(
            f"config file {str(p)!r}: key(s) {', '.join(beside)} beside a [kclpy_spark] table: "
            "put every worker key in that table, or none"
        )
    # [sink] and [[sinks]] configure the Spark sink (kclpy_spark.spark.sink_config), not the worker.
    table = {k: v for k, v in table.items() if k not in ("sink", "sinks")}
    _check_known(table, str(p))
    return {k: _coerce(k, v, str(p)) for k, v in table.items()}
