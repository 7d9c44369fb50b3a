"""The micro-batcher's settings (no I/O, no pyarrow)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from checkpoint.base.errors import ConfigError


@dataclass(frozen=True)
class BatcherSettings:
    """Seconds as floats, sizes in bytes of Arrow data."""

    max_records: int = 100_000
    max_bytes: int = 64 * 1024 * 1024
    max_wait: float = 5.0
    scope: Literal["worker", "lease"] = "worker"
    max_attempts: int = 5
    retry_base_delay: float = 1.0
    retry_max_delay: float = 30.0
    write_timeout: float = 600.0
    # A config file's defaults differ (sink_config._defaults_for: 2 writers; 1 batch of a lease
    # in flight with a function among the sinks); these are the batcher's own.
    writers: int = 1
    batches_in_flight: int = 2  # per lease: written or being written, not yet checkpointed
    buffer_bytes: int = 0  # records buffered before process_records blocks; 0: 2 x max_bytes
    regroup_wait: float = 30.0  # how long a re-formed piece waits for the rest of its batch
    commit_retry_delay: float = 1.0

    def __post_init__(self) -> None:
        if self.scope not in {"worker", "lease"}:
            raise ConfigError(f"config 'scope' must be 'worker' or 'lease', got {self.scope!r}")
        for name in ("max_records", "max_bytes", "writers", "max_attempts", "batches_in_flight"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config {name!r} must be >= 1, got {getattr(self, name)}")
        if self.buffer_bytes < 0:
            raise ConfigError(f"config 'buffer_bytes' must be >= 0, got {self.buffer_bytes}")
        if not self.write_timeout > 0:
            raise ConfigError(f"config 'write_timeout' must be > 0, got {self.write_timeout}")
        for name in ("max_wait", "retry_base_delay", "retry_max_delay", "regroup_wait",
                     "commit_retry_delay"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ConfigError(f"config {name!r} must be >= 0, got {getattr(self, name)}")
        if self.retry_max_delay < self.retry_base_delay:
            raise ConfigError("config 'retry_max_delay' must be >= 'retry_base_delay'")

    @property
    def buffer_limit(self) -> int:
        return self.buffer_bytes or 2 * self.max_bytes
