"""When the executor reads read each lease (pure rules; times on the driver's monotonic clock
unless named otherwise): which leases a round takes, whether a lease is behind, when its shard
may be called again, and how long a read job may run before it is cancelled."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol, TypeVar

from kclpy_spark.retrieval.polling import MAX_READ_PAUSE, pause_before_next_call
from kclpy_spark.retrieval.range_reader import PAGE_LIMIT
from kclpy_spark.spark.range_tasks import waves
from kclpy_spark.spark.ranges import RangeEnd, ReadRange


class Timed(Protocol):
    """A lease as a round sees it."""

    next_read_at: float
    behind: bool  # its last read left records waiting: it may join a round early
    ended: bool  # read to its shard's end: never read again
    pace: float  # the pause its last page's bytes asked for (``page_pace``; 0: none read yet)


T = TypeVar("T", bound=Timed)

# Leases whose paces differ by more than this factor drift apart again once read together, and a
# round waiting for the slower costs the faster a share of its reads each time (the difference).
SAME_PACE = 1.02


def round_leases(entries: Mapping[str, T], now: float, ahead: float) -> dict[str, T]:
    """The leases a round reads: none unless one is due now; then also those behind that are
    due within ``ahead`` (their ranges wait the difference). A lease at its tip is not taken
    early: it has little to read, and its wait would lengthen the job for the others."""
    live = {k: e for k, e in entries.items() if not e.ended}
    if not any(e.next_read_at <= now for e in live.values()):
        return {}
    return {k: e for k, e in live.items()
            if e.next_read_at <= now or (e.behind and e.next_read_at <= now + ahead)}  # fmt: skip


def round_start(entries: Mapping[str, Timed], now: float, align: float, ahead: float) -> float:
    """When the round due now begins: now, or later while leases behind come due within
    ``align`` of its first lease, until the last of them is within the round's look-ahead
    (``ahead``, see ``round_leases``: those are read in it, their tasks waiting the difference).
    Leases each read to their own pace drift into several rounds a pause, and with a full page
    a lease a round every round costs the driver the same whatever its leases (the job, the
    batch's write and frame). Only leases of the same pace as every lease due are waited for
    (``SAME_PACE``, by their pages' bytes): those come due together again once merged, within
    the look-ahead, so the wait is paid once; waiting for a lease of another pace (pages of
    other sizes) cost the faster leases the difference, every round. A lease read to its
    shard's end, read again for rows lost with an executor, may wait too (at most ``align``).
    ``align`` 0 (or nothing due, or none coming): now."""
    if align <= 0:
        return now
    due = [e for e in entries.values() if e.next_read_at <= now and not e.ended]
    if not due:
        return now
    deadline = min(e.next_read_at for e in due) + align
    # Of the same pace as every lease due: as the slowest and the fastest of them (one pass,
    # not one a lease due for each lease coming: a round with many leases).
    slowest, fastest = max(d.pace for d in due), min(d.pace for d in due)
    coming = [
        e.next_read_at
        for e in entries.values()
        if e.behind and not e.ended and now < e.next_read_at <= deadline
        and _same_pace(e.pace, slowest) and _same_pace(e.pace, fastest)
    ]  # fmt: skip
    return max(now, max(coming) - ahead) if coming else now


def _same_pace(a: float, b: float) -> bool:
    return a > 0 and b > 0 and max(a, b) <= SAME_PACE * min(a, b)


def page_pace(nbytes: int, *, min_interval: float, read_rate: float) -> float:
    """The pause a shard's page of ``nbytes`` asks for before the next call (``paced``'s, from
    the call): its pace while behind, whatever the order its read took in its job."""
    return pause_before_next_call(min_interval, 0.0, nbytes, 0.0, read_rate)


def cut_short(rng: ReadRange, end: RangeEnd) -> bool:
    """The read stopped at its share of the round's records, short of a full page: its pace
    says nothing of its shard's (read more often, it reads more), so a round never waits for
    it, nor for others with it due (``round_start``). A range is one page: its bytes are what
    the page brought, never cut by the share."""
    return end.rows < PAGE_LIMIT and end.rows >= rng.max_records


def is_behind(rng: ReadRange, end: RangeEnd, idle_seconds: float) -> bool:
    """More records are waiting: the range stopped at its budget, or the shard is more than
    ``idle_seconds`` behind (a few milliseconds under steady traffic is at the tip: reading it
    at once took the shard's GetRecords allowance from the other applications on it)."""
    if rng.pinned is not None:
        return True  # a re-formed piece: what follows it is read next
    full = end.rows >= rng.max_records or end.nbytes >= rng.max_bytes
    unknown = end.rows > 0 and end.millis_behind_latest is None  # no lag said: maybe more
    lagging = (end.millis_behind_latest or 0) > idle_seconds * 1000.0
    return full or end.left_behind or unknown or lagging


def paced(
    end: RangeEnd, began: float, *, done: float, wall: float, min_interval: float, read_rate: float
) -> float:
    """When the shard may be called again after the read that found ``end`` (``min_interval``
    between calls, ``read_rate`` bytes a second), the read's job having begun at ``began`` and
    ended at ``done``, ``wall`` being the driver's wall clock then: counted from the read's last
    call as its task paced it (``end.next_call_at``, on the executor's wall clock), not from the
    end of the job (which would add the job's length to every page's pause). That clock may be
    off: the result is never before the pause counted from ``began`` (before any of the job's
    calls) nor later than the longest pause a reader waits from ``done``. Without the task's
    figure, the pause counts from ``done``."""
    pause = page_pace(end.nbytes, min_interval=min_interval, read_rate=read_rate)
    if end.next_call_at is None:
        return done + pause
    longest = max(min_interval, MAX_READ_PAUSE)
    remaining = min(max(end.next_call_at - wall, 0.0), longest)
    return max(began + pause, done + remaining)


def read_job_limit(ranges: Collection[ReadRange], tasks: int, grace: float) -> float:
    """Seconds a read job of ``ranges`` over ``tasks`` tasks may run before it is cancelled: the
    longest delay, then, for each wave of ranges the busiest task reads, the longest time budget
    and ``grace``. (Counting one wave only, a job of more than ``READS_AT_ONCE`` leases a core
    that Kinesis throttled was cancelled every round, every lease's read with it.)"""
    longest = max(r.max_seconds for r in ranges) + grace
    return max(r.delay for r in ranges) + waves(len(ranges), tasks) * longest
