"""How the executors' read rounds read (``ReadSettings``): budgets, pacing, waits (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadSettings:
    max_records: int = 100_000  # a round's budget, split over its leases
    # A lease may read up to a full page (``PAGE_LIMIT`` records) a round, above its share of
    # ``max_records``, within its share of ``max_bytes`` (BatcherSettings.page_per_lease).
    page_per_lease: bool = False
    max_bytes: int = 64 * 1024 * 1024
    max_seconds: float = 10.0  # one range's read
    # A range is one GetRecords answer: a task never sleeps between calls (its core would idle);
    # the driver spaces a shard's reads instead (min_interval, read_rate).
    max_pages: int = 1
    min_interval: float = 0.2  # Kinesis: 5 GetRecords a second per shard
    read_rate: float = 2 * 1024 * 1024  # bytes a second per shard (0: no limit)
    idle_seconds: float = 1.0  # before reading again a lease read to its tip
    # A round also takes the leases behind that come due before its job would end (they would
    # wait for it anyway): their tasks wait out the rest of their pause. Fewer, fuller jobs; the
    # look-ahead is the last job's length, at most this.
    max_gather: float = 0.5
    # When a round's share of the budget is a full page a lease (``PAGE_LIMIT`` records), a
    # round due now waits up to this long for leases behind that come due (``round_start``):
    # one round a pause instead of one per phase the leases drifted into.
    align: float = 0.5
    kpl: bool = True
    # A read job still running this long past its ranges' ``max_seconds``, for each wave of
    # ranges its busiest task reads (``range_tasks.waves``), is cancelled: a task gives up on a
    # range's Kinesis read 60 s after its budget; this bounds a Spark-level hang.
    job_grace: float = 90.0
