"""What a valid worker configuration is: every check ``WorkerConfig`` makes when it is built
(durations within bounds that still make sense, names AWS accepts, one stream form, choices),
each refusal one line naming the key."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition
from kclpy_spark.stream_spec import StreamSpec, check_stream

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig

_APP_NAME = re.compile(r"^[a-zA-Z0-9_.-]{3,255}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d{1,2}$")
_STREAM_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,128}$")
# Durations with the bounds that still make sense, and why the upper bound is there.
_DURATIONS: dict[str, tuple[float, float, str]] = {
    "failover_time": (0.5, 3600.0, "a dead worker's leases move only after it"),
    "max_clock_skew": (0.0, 600.0, "a dead worker's leases move this much after failover_time"),
    # GetRecords' shard iterators expire after 5 minutes.
    "idle_time_between_reads": (0.001, 299.0, "a shard iterator expires after 300 s"),
    "shard_sync_interval": (0.1, 86_400.0, "new shards are found only this often"),
    "parent_shard_poll_interval": (0.1, 3600.0, "children wait this long between checks"),
    "shutdown_grace": (0.1, 3600.0, "SIGTERM waits this long"),
    "handoff_timeout": (0.1, 3600.0, "a lease being handed over waits at most this long"),
    "park_duration": (1.0, 7 * 86_400.0, "a parked lease waits this long"),
    "missing_dependency_timeout": (1.0, 7 * 86_400.0, "a worker that can do nothing waits this"),
    "processor_stall_timeout": (1.0, 7 * 86_400.0, "a hung processor call is reported after it"),
}


def _duration(name: str, value: float) -> None:
    low, high, why = _DURATIONS[name]
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(
            f"config {name!r} must be a number of seconds from {low:g} to {high:g} ({why}), "
            f"got {value!r}"
        )


# Allowed drift of an AT_TIMESTAMP time past this machine's clock.
_FUTURE_TOLERANCE = 1.0


def check_not_in_future(position: InitialPosition, what: str, now_wall: float) -> None:
    """Refuse an AT_TIMESTAMP position in the future: Kinesis refuses the iterator, so nothing
    would ever be read."""
    when = position.timestamp
    if when is not None and when.timestamp() > now_wall + _FUTURE_TOLERANCE:
        raise ConfigError(
            f"{what}: AT_TIMESTAMP {when.isoformat()} is in the future (now is "
            f"{datetime.fromtimestamp(now_wall, tz=UTC).isoformat()}); Kinesis gives no iterator "
            "for it, so nothing would be read"
        )


_WORKER_ID = re.compile(r"^[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]{0,254}$")


def check(cfg: WorkerConfig) -> None:
    """Raise ConfigError (one line, naming the key) unless ``cfg`` is a valid configuration."""
    _check_streams(cfg)
    _check_names(cfg)
    _check_numbers(cfg)
    _check_choices(cfg)


def _check_streams(cfg: WorkerConfig) -> None:
    if cfg.streams and (cfg.stream_name or cfg.stream_arn):
        raise ConfigError("config: give either 'stream_name'/'stream_arn' or [[streams]], not both")
    if not cfg.stream_name and not cfg.stream_arn and not cfg.streams:
        raise ConfigError("config 'stream_name' (or 'stream_arn', or [[streams]]) is required")
    seen: dict[str, StreamSpec] = {}
    for spec in cfg.streams:
        if spec.label in seen:
            raise ConfigError(
                f"[[streams]]: stream {spec.label!r} is listed twice (one entry per stream; "
                "its initial_position would be ambiguous)"
            )
        seen[spec.label] = spec
        if spec.initial_position is not None:
            check_not_in_future(spec.initial_position, "[[streams]] initial_position", time.time())
    check_stream(cfg.stream_name or None, cfg.stream_arn or None, "config")
    check_not_in_future(cfg.initial_position, "config 'initial_position'", time.time())


def _check_endpoint(url: str) -> None:
    """http(s)://host[:port][/...]: "http://" or port 99999 were retried as unreachable."""
    bad = ConfigError(
        "config 'endpoint_url' must be http://host[:port] or https://host[:port] with a port "
        f"of 1..65535, got {url!r}"
    )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # "http://[::1", a port out of range
        raise bad from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise bad


def _check_names(cfg: WorkerConfig) -> None:
    if not _APP_NAME.match(cfg.application_name):
        raise ConfigError(
            "config 'application_name' must be 3-255 characters of letters, digits, '_', '-', '.'"
            f" (it names the lease table), got {cfg.application_name!r}"
        )
    if not (
        cfg.lease_store in {"dynamodb", "memory"}
        or (cfg.lease_store.startswith("sqlite:") and len(cfg.lease_store) > len("sqlite:"))
    ):
        raise ConfigError(
            f"config 'lease_store' must be 'sqlite:<path>', 'dynamodb' or 'memory', "
            f"got {cfg.lease_store!r}"
        )
    if cfg.processor is not None and not re.match(r"^[\w.]+:[\w.]+$", cfg.processor):
        raise ConfigError(
            f"config 'processor' must look like 'package.module:Class', got {cfg.processor!r}"
        )
    if not _WORKER_ID.match(cfg.worker_id) or cfg.worker_id != cfg.worker_id.strip():
        raise ConfigError(
            "config 'worker_id' must be 1-255 printable characters, not starting or ending with "
            f"a space (it names the lease owner), got {cfg.worker_id!r}"
        )
    if cfg.consumer_name is not None and not _STREAM_NAME.match(cfg.consumer_name):
        raise ConfigError(
            f"config 'consumer_name' is not a valid name (1-128 of A-Z a-z 0-9 _ . -): "
            f"{cfg.consumer_name!r}"
        )
    if (
        cfg.retrieval_mode == "fanout"
        and cfg.consumer_name is None
        and len(cfg.application_name) > 128
    ):
        raise ConfigError(  # the stream consumer is named after the application by default
            f"config 'application_name' is {len(cfg.application_name)} characters, and enhanced "
            "fan-out names its stream consumer after it (128 at most): set 'consumer_name'"
        )
    if cfg.endpoint_url is not None:
        _check_endpoint(cfg.endpoint_url)
    if not _REGION.match(cfg.region):
        raise ConfigError(f"config 'region' is not an AWS region name: {cfg.region!r}")


def _check_numbers(cfg: WorkerConfig) -> None:
    for name in _DURATIONS:
        _duration(name, getattr(cfg, name))
    if not 1 <= cfg.max_records <= 10_000:
        raise ConfigError(
            f"config 'max_records' must be 1..10000 (GetRecords' limit), got {cfg.max_records}"
        )
    rate = cfg.max_read_bytes_per_second
    if rate != 0 and not 65_536 <= rate <= 2 * 1024 * 1024:
        raise ConfigError(
            "config 'max_read_bytes_per_second' must be 0 (no pacing) or 65536..2097152 bytes "
            f"a second (Kinesis reads at most 2 MiB a second from a shard), got {rate}"
        )
    for name in (
        "max_leases_for_worker",
        "max_leases_to_steal",
        "prefetch_batches",
        "max_processing_attempts",
        "auto_assignment_leases",
        "auto_assignment_workers",
    ):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"config {name!r} must be >= 1, got {getattr(cfg, name)}")
    if cfg.metrics_port is not None and not 0 <= cfg.metrics_port <= 65535:
        raise ConfigError(f"config 'metrics_port' must be 0..65535, got {cfg.metrics_port}")


_CHOICES: dict[str, tuple[str, ...]] = {
    "aged_checkpoint_policy": ("fail", "earliest", "latest"),
    "retrieval_mode": ("polling", "fanout"),
    "lease_assignment": ("auto", "worker", "leader"),
    "load_metric": ("auto", "throughput"),
}


def _check_choices(cfg: WorkerConfig) -> None:
    for name, allowed in _CHOICES.items():
        value = getattr(cfg, name)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            raise ConfigError(f"config {name!r} must be one of {choices}, got {value!r}")
