"""The micro-batcher's settings (no I/O, no pyarrow)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from checkpoint.base.errors import ConfigError

# Writer threads at most: each runs one Spark job at a time on the driver; past a few dozen they
# only contend (bench/results/history.md "Two writers by default"), and 20,000 exhausted the
# process.
MAX_WRITERS = 64
# Pieces a lease's pending checkpoint may name when it names its whole batch (a function sink):
# ``max_leases`` a batch, ``batches_in_flight`` batches out (``check_groups``). A piece is
# its lease key and two positions, ~150-350 bytes of JSON; a lease re-forming a former owner's
# pieces lists those too, so the state stays well under DynamoDB's 400 KB an item.
MAX_STATE_PIECES = 500
# The longest each duration may be (seconds): records wait at most ``max_wait`` to be written, so
# ``inf`` would hold them unwritten (and the lease unacknowledged) for ever.
MAX_SECONDS = {
    "max_wait": 3600.0,
    "retry_base_delay": 3600.0,
    "retry_max_delay": 3600.0,
    "write_timeout": 86_400.0,
    "regroup_wait": 3600.0,
    "commit_retry_delay": 600.0,
}


def check_write_timeout(value: float, what: str) -> None:
    """Raise ConfigError naming ``what`` unless ``value`` is above 0 and at most a day (NaN and
    inf fail: a write waited on for ever)."""
    most = MAX_SECONDS["write_timeout"]
    if not 0 < value <= most:
        raise ConfigError(f"{what} must be > 0 and at most {most:g} seconds, got {value}")


@dataclass(frozen=True)
class BatcherSettings:
    """Seconds as floats, sizes in bytes of Arrow data."""

    # A batch closes at this many records (read on the executors: a round reads about this many,
    # at most 1.5 times, or a page a lease with page_per_lease; one batch)...
    max_records: int = 100_000
    # ...or this many bytes of Arrow data...
    max_bytes: int = 64 * 1024 * 1024
    # Read on the executors: a lease may read a full GetRecords page (10,000 records) a round,
    # past its share of max_records, within its share of max_bytes (as its last page measured
    # its Kinesis records: an estimate); false: max_records bounds a round. A config file's
    # [sink] gets true unless it sets max_records (sink_config._defaults_for).
    page_per_lease: bool = False
    # ...or when its first record has waited this long.
    max_wait: float = 5.0
    # worker: one batch across the worker's leases; lease: one lease per batch.
    scope: Literal["worker", "lease"] = "worker"
    # With a function among the sinks, a worker-scope batch holds at most this many leases (more
    # leases with records: more batches): each lease's pending checkpoint then names every piece
    # of its batch, and DynamoDB caps an item at 400 KB (past ~1,400 leases in a batch, two in
    # flight, every pending write failed). parquet: and delta: name only their own piece.
    max_leases: int = 250
    # Write attempts of a batch before the failure policy applies.
    max_attempts: int = 5
    # The first retry's delay; doubled each time (with jitter).
    retry_base_delay: float = 1.0
    # The longest delay between retries.
    retry_max_delay: float = 30.0
    # A write that has not returned by then counts as failed (its thread is left to finish).
    write_timeout: float = 600.0
    # Batches written at once (threads, each running one Spark job). A config file's `[sink]` gets
    # 2 (sink_config._defaults_for; and 1 batch of a lease in flight with a function among the
    # sinks); a MicroBatcher built in code without settings, 1.
    writers: int = 1
    batches_in_flight: int = 2  # per lease: written or being written, not yet checkpointed
    buffer_bytes: int = 0  # buffered records that block a lease holding its share; 0: 2 x max_bytes
    regroup_wait: float = 30.0  # how long a re-formed piece waits for the rest of its batch
    # Delay between attempts to move a checkpoint after a write.
    commit_retry_delay: float = 1.0

    def __post_init__(self) -> None:
        if self.scope not in {"worker", "lease"}:
            raise ConfigError(f"config 'scope' must be 'worker' or 'lease', got {self.scope!r}")
        for name in ("max_records", "max_bytes", "max_attempts", "batches_in_flight", "max_leases"):
            if getattr(self, name) < 1:
                raise ConfigError(f"config {name!r} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.writers <= MAX_WRITERS:  # each writer is a thread and a Spark job
            raise ConfigError(
                f"config 'writers' must be between 1 and {MAX_WRITERS} (threads writing batches "
                f"at once), got {self.writers}"
            )
        if self.buffer_bytes < 0:
            raise ConfigError(f"config 'buffer_bytes' must be >= 0, got {self.buffer_bytes}")
        check_write_timeout(self.write_timeout, "config 'write_timeout'")
        for name, most in MAX_SECONDS.items():  # NaN and inf fail too
            if name != "write_timeout" and not 0 <= getattr(self, name) <= most:
                raise ConfigError(
                    f"config {name!r} must be between 0 and {most:g} seconds, got "
                    f"{getattr(self, name)}"
                )
        if self.retry_max_delay < self.retry_base_delay:
            raise ConfigError("config 'retry_max_delay' must be >= 'retry_base_delay'")

    @property
    def buffer_limit(self) -> int:
        return self.buffer_bytes or 2 * self.max_bytes

    def check_groups(self, in_flight: int) -> None:
        """For sinks whose pieces' pending checkpoints name their whole batch (a function's):
        ConfigError unless ``max_leases`` (worker scope) x ``in_flight`` (the batches of a lease
        out at once: ``batches_in_flight``, or 1 for a sink that needs them in order) is at
        most ``MAX_STATE_PIECES``."""
        group = self.max_leases if self.scope == "worker" else 1
        if group * in_flight > MAX_STATE_PIECES:
            raise ConfigError(
                f"config 'max_leases' x 'batches_in_flight' must be at most {MAX_STATE_PIECES} "
                f"with a function sink in worker scope (each lease's pending checkpoint names "
                f"every piece of its batches in flight; DynamoDB caps an item at 400 KB), got "
                f"{group} x {in_flight}"
            )
