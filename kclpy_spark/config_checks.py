"""The checks a whole ``WorkerConfig`` must pass (each refusal one line naming the key), and
the bounds they hold numbers to, as data the configuration reference also reads."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from checkpoint.base.errors import ConfigError
from checkpoint.stores.dynamo_table import COORDINATION_SUFFIX
from kclpy_spark.config_rules import (
    APP_NAME,
    DURATIONS,
    REGION,
    WORKER_ID,
    check_duration,
    check_endpoint,
    check_not_in_future,
    shown,
)
from kclpy_spark.stream_spec import STREAM_NAME, StreamSpec, check_stream

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig


def check(cfg: WorkerConfig) -> None:
    """Raise ConfigError (one line, naming the key) unless ``cfg`` is a valid configuration."""
    _check_streams(cfg)
    _check_names(cfg)
    _check_numbers(cfg)
    _check_choices(cfg)
    if not cfg.metrics_host.strip():
        # An empty host binds every interface: the status page open to the network, unsaid.
        raise ConfigError(
            "config 'metrics_host' is empty (that listens on every address): name an address, "
            "'127.0.0.1' for this machine only or '0.0.0.0' for all"
        )


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
    _check_regions(cfg)


def _check_regions(cfg: WorkerConfig) -> None:
    """Every client of a worker uses one region: streams whose ARNs name others would be asked
    for in the wrong one (as if gone)."""
    from kclpy_spark.aws import arn_region

    arns = [s.stream_arn for s in cfg.stream_specs if s.stream_arn]
    regions = sorted({arn_region(arn) or "" for arn in arns if arn.count(":") >= 5})
    if len(regions) > 1:
        raise ConfigError(
            f"config: the streams' ARNs name several regions ({', '.join(regions)}); one worker "
            "reads one region: run a worker (or application) per region"
        )
    if cfg.region and regions and regions[0] != cfg.region:
        raise ConfigError(
            f"config 'region' {cfg.region!r} is not the region of the stream ARN "
            f"({regions[0]!r}): leave 'region' out, or name the stream in its region"
        )


def _check_names(cfg: WorkerConfig) -> None:
    if not APP_NAME.match(cfg.application_name):
        raise ConfigError(
            "config 'application_name' must be 3-255 characters of letters, digits, '_', '-', '.'"
            f" (it names the lease table), got {shown(cfg.application_name)}"
        )
    if not (
        cfg.lease_store in {"dynamodb", "memory"}
        or (cfg.lease_store.startswith("sqlite:") and len(cfg.lease_store) > len("sqlite:"))
    ):
        raise ConfigError(
            f"config 'lease_store' must be 'sqlite:<path>', 'dynamodb' or 'memory', "
            f"got {cfg.lease_store!r}"
        )
    if cfg.lease_store == "dynamodb" and len(cfg.application_name) > 255 - len(COORDINATION_SUFFIX):
        raise ConfigError(
            f"config 'application_name' with lease_store 'dynamodb' must be at most "
            f"{255 - len(COORDINATION_SUFFIX)} characters (the coordination table "
            f"'<application_name>{COORDINATION_SUFFIX}' has a 255-character name too), got "
            f"{len(cfg.application_name)}"
        )
    if cfg.processor is not None and not re.match(r"^[\w.]+:[\w.]+$", cfg.processor):
        raise ConfigError(
            f"config 'processor' must look like 'package.module:Class', got {cfg.processor!r}"
        )
    if not WORKER_ID.match(cfg.worker_id) or cfg.worker_id != cfg.worker_id.strip():
        raise ConfigError(
            "config 'worker_id' must be 1-255 printable characters, not starting or ending with "
            f"a space (it names the lease owner), got {shown(cfg.worker_id)}"
        )
    if cfg.consumer_name is not None and not STREAM_NAME.match(cfg.consumer_name):
        raise ConfigError(
            f"config 'consumer_name' is not a valid name (1-128 of A-Z a-z 0-9 _ . -): "
            f"{shown(cfg.consumer_name)}"
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
        check_endpoint(cfg.endpoint_url)
    if cfg.region is not None and not REGION.match(cfg.region):
        raise ConfigError(f"config 'region' is not an AWS region name: {cfg.region!r}")
    if cfg.profile is not None and not re.match(r"^[\w.@+-]{1,128}$", cfg.profile):
        raise ConfigError(f"config 'profile' is not a profile name: {shown(cfg.profile)}")


# Whole numbers with the bounds they must meet (None: no upper bound), and why, for the checks
# and the configuration reference (kclpy_spark/config_reference.py).
INT_BOUNDS: dict[str, tuple[int, int | None, str]] = {
    "max_records": (1, 10_000, " (GetRecords' limit)"),
    "max_leases_for_worker": (1, None, ""),
    "max_leases_to_steal": (1, None, ""),
    "prefetch_batches": (1, None, ""),
    "max_processing_attempts": (1, None, ""),
    "auto_assignment_leases": (1, None, ""),
    "auto_assignment_workers": (1, None, ""),
    "metrics_port": (0, 65535, ""),
}
READ_RATE_BOUNDS = (65_536, 2 * 1024 * 1024)  # max_read_bytes_per_second, when not 0


def bounds_text(low: int, high: int | None) -> str:
    return f">= {low}" if high is None else f"{low}..{high}"


def _check_numbers(cfg: WorkerConfig) -> None:
    for name in DURATIONS:
        check_duration(name, getattr(cfg, name))
    for name, (low, high, why) in INT_BOUNDS.items():
        value = getattr(cfg, name)
        if value is not None and (value < low or (high is not None and value > high)):
            raise ConfigError(f"config {name!r} must be {bounds_text(low, high)}{why}, got {value}")
    rate = cfg.max_read_bytes_per_second
    if rate != 0 and not READ_RATE_BOUNDS[0] <= rate <= READ_RATE_BOUNDS[1]:
        raise ConfigError(
            "config 'max_read_bytes_per_second' must be 0 (no pacing) or 65536..2097152 bytes "
            f"a second (Kinesis reads at most 2 MiB a second from a shard), got {rate}"
        )


CHOICES: dict[str, tuple[str, ...]] = {
    "aged_checkpoint_policy": ("fail", "earliest", "latest"),
    "retrieval_mode": ("polling", "fanout"),
    "lease_assignment": ("auto", "worker", "leader"),
    "load_metric": ("auto", "throughput"),
}


def _check_choices(cfg: WorkerConfig) -> None:
    for name, allowed in CHOICES.items():
        value = getattr(cfg, name)
        if value not in allowed:
            choices = ", ".join(repr(a) for a in allowed)
            raise ConfigError(f"config {name!r} must be one of {choices}, got {value!r}")
