"""The rules one configuration value must meet, as functions of the value: durations within
bounds that still make sense, names AWS accepts, an endpoint, a start time not in the future.
``WorkerConfig``'s checks (config.py) apply them; each refusal is one line naming the key."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition

APP_NAME = re.compile(r"^[a-zA-Z0-9_.-]{3,255}$")
# eu-west-1, us-gov-west-1, us-isob-east-1, eusc-de-east-1 (every partition botocore knows)
REGION = re.compile(r"^[a-z]{2,4}(-[a-z]+){1,3}-\d{1,2}$")
# Durations with the bounds that still make sense, and why the upper bound is there.
DURATIONS: dict[str, tuple[float, float, str]] = {
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


def shown(value: str, most: int = 32) -> str:
    """A value for an error line: quoted, and cut to ``most`` characters with its length after
    when longer (a long name would also read as a secret to the log's redactor, which hides runs
    of 40 or more letters and digits)."""
    if len(value) <= most:
        return repr(value)
    return f"{value[:most]!r}... ({len(value)} characters)"


def check_duration(name: str, value: float) -> None:
    low, high, why = DURATIONS[name]
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


WORKER_ID = re.compile(r"^[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]{0,254}$")


def check_endpoint(url: str) -> None:
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
