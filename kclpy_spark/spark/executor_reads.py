"""Reading on the executors (``[sink] read_on = "executors"``): the driver plans, Spark reads.

One thread (``ExecutorReads``) runs rounds. In each, every lease whose lane can take records
(``LaneFeed.readable``: active, nothing waiting to be cut, room for one more batch of it in
flight) gets one range: the next piece to re-form after a crash, pinned to its recorded last
record, or the records after the last ones its lane was given, within a budget that splits the
batch's ``max_records`` / ``max_bytes`` over the leases read. One Spark job reads them all on the
executors (cluster_read.py); each lane gets its records as one ``RangeChunk`` (their ends and
size; the rows stay on the executors) and the batcher writes and acknowledges them exactly as it
does records read on the driver. A lease read to its tip waits ``idle_seconds`` before its next
read; one that is behind is read again as soon as Kinesis allows its shard another call. A round
also takes the leases behind whose call comes due within the last job's length (their tasks wait
out the rest): leases fall into the same jobs instead of alternating between half-full ones.
With a full page a lease a round, a round due also waits (``align``) for leases behind coming
due a little later (``read_timing.round_start``): one round a pause, not one per phase.

The lease's consumer still runs the lease's life (parents first, shard end, loss, hand-over,
parking); its record source is a ``relay.LeaseRelay`` that registers the lease here and hands it
what each read found (lag, shard end with its children, or the read's failure).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from checkpoint.base.clock import Clock, SystemClock
from checkpoint.base.errors import KclpySparkError
from checkpoint.base.retry import Backoff
from checkpoint.sequence import AT_TIMESTAMP, LATEST, ExtendedSequenceNumber
from kclpy_spark.retrieval.positions import first_latest_ask
from kclpy_spark.retrieval.range_reader import PAGE_LIMIT
from kclpy_spark.retrieval.source import FetchedBatch, ReadElsewhere, SourceOutage
from kclpy_spark.spark.cluster_read import RangeRead, StoredReads, cluster_cores, read_ranges
from kclpy_spark.spark.frames import RangeChunk
from kclpy_spark.spark.jvm_garbage import JvmGarbage
from kclpy_spark.spark.lane import Lane
from kclpy_spark.spark.lane_feed import LaneFeed, ReadSlot
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import PINNED_TIME_FACTOR, Pinned, RangeEnd, ReadRange
from kclpy_spark.spark.read_settings import ReadSettings
from kclpy_spark.spark.read_timing import (
    cut_short,
    is_behind,
    paced,
    page_pace,
    read_job_limit,
    round_leases,
    round_start,
)
from kclpy_spark.spark.sink_batch import Interrupter, NoInterrupter
from kclpy_spark.spark.watchdog import Watchdog

log = logging.getLogger(__name__)

ESN = ExtendedSequenceNumber


@dataclass(frozen=True)
class NoAnswer:
    """A read of the lease that got no GetRecords answer within its time: every call failed or
    was refused for the shard's limits (``throttled`` of them)."""

    throttled: int = 0

    def plus(self, other: NoAnswer) -> NoAnswer:
        return NoAnswer(self.throttled + other.throttled)


Post = Callable[[FetchedBatch | BaseException | NoAnswer], None]


class RangeReadError(KclpySparkError):
    """A lease's range could not be read on the executors (its consumer counts a failure)."""


class ReadJobFailedError(SourceOutage):
    """The read job of a round failed whole (executors lost, the cluster down, its deadline):
    every lease of the round reads again after a backoff, none counting a failure (an outage
    parked every lease of the worker within minutes)."""


class ReadJobTimeoutError(KclpySparkError):
    """A read job ran past its deadline; its Spark jobs were interrupted."""

    retriable = True


class ReadJob(Protocol):
    """``cluster_read.read_ranges``: one Spark job reading some ranges."""

    def __call__(
        self,
        session: Any,
        ranges: list[ReadRange],
        aws: AwsTarget,
        *,
        description: str,
        stored_reads: StoredReads,
        partitions: int | None = None,
    ) -> RangeRead: ...


@dataclass(frozen=True)
class LeaseSource:
    """What reading a lease needs, as its consumer started its source."""

    lease_key: str
    stream: str  # the records' ``stream`` column
    stream_arg: Mapping[str, str]
    shard_id: str
    start: ESN  # where its consumer starts: the lease's checkpoint
    timestamp: float | None = None  # an AT_TIMESTAMP start's time
    hash_range: tuple[int, int] | None = None


@dataclass
class _Entry:
    """One lease as the reader knows it (owned by ExecutorReads, under its lock)."""

    source: LeaseSource
    post: Post
    iterator: str | None = None  # continues exactly after ``iterator_at``
    iterator_at: ESN | None = None
    next_read_at: float = 0.0
    pace: float = 0.0  # the pause its last page asked for (read_timing.page_pace)
    record_bytes: int = 0  # its last page's bytes a record (0: none read yet)
    lag: int | None = None
    failures: int = 0
    ended: bool = False
    behind: bool = False  # its last read left records waiting: it may join a round early
    # A lease that starts at LATEST: when (wall clock, the restart margin earlier) its first
    # range asked, or it was registered if that range came later than the margin (its consumer
    # pinned the lease then); every later range before its first record starts there
    # (AT_TIMESTAMP), so an iterator replaced meanwhile (expired between rounds) skips nothing.
    latest_since: float | None = None
    began: float = 0.0  # when its relay registered it (wall clock)


class ExecutorReads:
    """The read rounds (one thread) and the leases registered by their relays."""

    def __init__(
        self,
        session: Callable[[], Any],
        aws: AwsTarget,
        settings: ReadSettings,
        *,
        clock: Clock | None = None,
        jobs: Interrupter | None = None,
        read: ReadJob = read_ranges,
        tasks: Callable[[Any], int | None] = cluster_cores,
        garbage: JvmGarbage | None = None,
    ) -> None:
        """``tasks(session)``: how many tasks a read job runs side by side (the cluster's
        cores; None: not known, one task a range). ``garbage``: told of each read job, whose
        DataFrames pin their plans and RDDs in the driver's JVM until Python collects their
        cycles (``jvm_garbage.py``; a batch's frames are made of these reads)."""
        self._session = session
        self._aws = aws
        self._s = settings
        self._clock = clock or SystemClock()
        self._jobs = jobs or NoInterrupter()  # tags a read job's Spark jobs, cancels them
        self._read = read
        self._tasks = tasks
        self._garbage = garbage
        self._watchdog = Watchdog("kclpy-spark-read-deadlines", callback_threads=1)
        self._lock = threading.Condition()
        self._entries: dict[str, _Entry] = {}
        # A failed lease's pause and failure count, kept past its relay's end: its consumer
        # starts a new relay at once, whose entry would otherwise be due now with no failures
        # (its backoff never grew). Kept only while the pause lasts (bounded by the leases).
        self._paused: dict[str, tuple[float, int]] = {}
        self._feed: LaneFeed | None = None
        self._backoff = Backoff(base=1.0, cap=30.0)
        self._closed = False
        self._thread: threading.Thread | None = None
        self.rounds = 0
        self._gather = 0.0  # how far ahead a round takes leases (the last job's own length)
        self._start_at = 0.0  # when the round due waits for (round_start), under the lock
        self.stored = StoredReads()  # the executors' copies of reads some batch still holds
        self._id = uuid.uuid4().hex[:8]
        self.overran_at: float | None = None  # the read thread's running call to Spark overran then
        self._job_lock = threading.Lock()

    # --- registry (relays) ----------------------------------------------------------------------

    def register(self, source: LeaseSource, post: Post) -> _Entry:
        with self._lock:
            entry = _Entry(source, post, began=self._clock.wall())
            paused = self._paused.pop(source.lease_key, None)
            if paused is not None and paused[0] > self._clock.monotonic():
                entry.next_read_at, entry.failures = paused
            self._entries[source.lease_key] = entry
            self._lock.notify_all()
            return entry

    def unregister(self, entry: _Entry) -> None:
        with self._lock:
            key = entry.source.lease_key
            if self._entries.get(key) is entry:
                del self._entries[key]
                now = self._clock.monotonic()
                self._paused = {k: v for k, v in self._paused.items() if v[0] > now}
                if entry.failures and entry.next_read_at > now:
                    self._paused[key] = (entry.next_read_at, entry.failures)

    @property
    def registered(self) -> int:
        with self._lock:
            return len(self._entries)

    # --- the thread -----------------------------------------------------------------------------

    def start(self, feed: LaneFeed, *, threaded: bool = True) -> None:
        self._feed = feed
        if threaded:
            self._thread = threading.Thread(
                target=self._loop, name="kclpy-spark-range-reads", daemon=True
            )
            self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._watchdog.close()

    def nudge(self) -> None:
        """A lane may take records again (its batch was cut or committed)."""
        with self._lock:
            self._lock.notify_all()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                if self.read_round() == 0:
                    with self._lock:
                        if not self._closed:
                            self._lock.wait(self._wait())
            except Exception:  # a bug must not stop every lease's reading
                log.exception("a round of reads on the executors failed; going on")
                with self._lock:
                    self._lock.wait(1.0)

    def _wait(self) -> float:
        now = self._clock.monotonic()
        if self._start_at > now:  # a round waits for the leases behind that come due
            return max(0.05, min(0.5, self._start_at - now))
        times = [e.next_read_at - now for e in self._entries.values() if not e.ended]
        return max(0.05, min([0.5, *times]))

    def _align(self) -> float:
        """How long a round may wait for leases coming due (``ReadSettings.align``): only
        while a lease's share of the round's budget is a full page, so a round reads what
        Kinesis gives a call whatever its leases (with less, each read of a lease is cut short
        by its share and a lease read less often reads less)."""
        live = sum(1 for e in self._entries.values() if not e.ended)
        full = self._s.page_per_lease or self._s.max_records // max(live, 1) >= PAGE_LIMIT
        return self._s.align if live and full else 0.0

    # --- one round ------------------------------------------------------------------------------

    def read_round(self) -> int:
        """Read one range of every lease that can take records now; returns how many."""
        assert self._feed is not None, "start() first"
        with self._overrun_told(self._s.job_grace, "unpersisting the stored reads"):
            self.stored.release()  # calls to the driver's JVM
        now = self._clock.monotonic()
        with self._lock:
            self._start_at = round_start(self._entries, now, self._align(), self._gather)
            if self._start_at > now:
                return 0
            due = round_leases(self._entries, now, self._gather)
            ended = {k: e for k, e in self._entries.items() if e.ended and e.next_read_at <= now}
        if not due and not ended:
            return 0
        slots, parked = self._feed.readable([*due, *ended])
        # A lease read to its shard's end is read again only for records its lane lost (rows
        # lost with an executor: the pieces to re-form, and the records after them it dropped
        # to read again), which its consumer's shard-end step waits for.
        slots = {k: slot for k, slot in slots.items() if k in due or _lost(slot)}
        parked -= ended.keys()
        due |= ended
        for key in parked:  # its consumer's processor hears of the parking (SinkParkedError)
            due[key].next_read_at = now + self._s.idle_seconds
            due[key].post(FetchedBatch([], None, announce=True))
        if not slots:
            return 0
        behind = sum(due[key].behind for key in slots)
        ranges = [self._range(due[key], slot, len(slots), behind, now)
                  for key, slot in slots.items()]  # fmt: skip
        self.rounds += 1
        try:
            read = self._read_job(ranges)
            waited = max(r.delay for r in ranges)
            took = self._clock.monotonic() - now - waited
            self._gather = min(self._s.max_gather, max(0.0, took))
        except Exception as exc:
            log.warning("the read job of %d lease(s) failed: %r", len(ranges), exc)
            for rng in ranges:
                entry = due[rng.lease_key]
                why = f"the read job failed: {exc!r}"[:1000]
                if not _outage(exc):  # our own (the ends it returned): counted, as before
                    self._failed(entry, why, now, slots[rng.lease_key].lane)
                    continue
                self._back_off(entry, now)
                entry.post(ReadJobFailedError(f"shard {entry.source.shard_id}: {why}"))
            return len(ranges)
        with self._feed.together():  # the round's lanes filled at once: cut as one batch
            for rng in ranges:
                self._found(due[rng.lease_key], slots[rng.lease_key], rng, read, now)
        if log.isEnabledFor(logging.DEBUG):
            rows = sum(e.rows for e in read.ends.values())
            log.debug("read round %d: %d range(s), %d record(s)", self.rounds, len(ranges), rows)
        return len(ranges)

    def _read_job(self, ranges: list[ReadRange]) -> RangeRead:
        """One read job; its Spark jobs are interrupted if it runs ``job_grace`` past its ranges'
        time budgets, wave by wave (ReadJobTimeoutError): a task reads its share of the ranges
        ``READS_AT_ONCE`` at a time, so with many leases a core, one after another."""
        tag = f"kclpy-spark-read-{self._id}-{self.rounds}"  # no other reader's jobs
        with self._overrun_told(self._s.job_grace, "the calls before a read job"):
            if self._garbage is not None:
                self._garbage.before_frame(0)  # the records stay on the executors
            session = self._session()
            tasks = self._tasks(session)  # given to the read: the cluster is asked once a round
        limit = read_job_limit(ranges, tasks or len(ranges), self._s.job_grace)
        overran = threading.Event()

        def cancel() -> None:
            overran.set()
            self._jobs.interrupt(tag)

        try:
            what = f"the read job of {len(ranges)} lease(s)"
            with self._overrun_told(limit, what, cancel), self._jobs.tagged(tag):
                return self._read(
                    session,
                    ranges,
                    self._aws,
                    description=self._describe(ranges),
                    stored_reads=self.stored,
                    partitions=tasks,
                )
        except Exception as exc:
            if overran.is_set():
                raise ReadJobTimeoutError(f"ran over {limit:.0f} s and was cancelled") from exc
            raise

    @contextlib.contextmanager
    def _overrun_told(
        self, seconds: float, what: str, then: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """Runs the block, the read thread's calls to Spark; if it has not ended ``seconds``
        later, notes when (``hung_for``: readiness says so past a grace), logs it and runs
        ``then`` (a read job's cancel). A call to the driver's JVM that never answers would
        otherwise hold every lease's reads without a word."""
        ended = threading.Event()  # set under _job_lock: an overrun after the end marks nothing

        def overran() -> None:
            with self._job_lock:
                if ended.is_set():
                    return
                self.overran_at = self._clock.monotonic()
            log.warning("%s ran over %.0f s%s", what, seconds, ": cancelling it" if then else "")
            if then is not None:
                then()

        deadline = self._watchdog.after(seconds, overran)
        try:
            yield
        finally:
            with self._job_lock:
                ended.set()
                self.overran_at = None
            deadline.cancel()

    def hung_for(self) -> float | None:
        """Seconds since the read thread's call to Spark (a read job, or the driver's JVM calls
        around it) ran past its deadline without returning (a JVM that answers no more: every
        lease waits on the one read thread), else None."""
        at = self.overran_at
        return None if at is None else self._clock.monotonic() - at

    def _range(
        self, entry: _Entry, slot: ReadSlot, leases: int, behind: int, now: float
    ) -> ReadRange:
        """``entry``'s range in a round of ``leases`` leases, ``behind`` of them behind. Each gets
        an equal share of the round's budget, and a lease behind at least half the budget
        shared by those behind: leases at their tip read little, and their equal share capped a
        busy shard among many idle ones (100 records a round at 1,000 leases) below what Kinesis
        takes in. A round reads at most one and a half times its budget. With
        ``page_per_lease`` a lease may read up to a page within its share of the bytes, as its
        last page's records measured (a range is one page, its ``Limit`` in records)."""
        s, src = self._s, entry.source
        records, nbytes = s.max_records // leases, s.max_bytes // leases
        if entry.behind:
            records = max(records, s.max_records // (2 * behind))
            nbytes = max(nbytes, s.max_bytes // (2 * behind))
        if s.page_per_lease and entry.record_bytes > 0:
            records = max(records, min(PAGE_LIMIT, nbytes // entry.record_bytes))
        after, timestamp = slot.read_to or src.start, src.timestamp
        if after == LATEST:  # a first range planned rounds after the lease came: from then
            late = True
            if entry.latest_since is None:
                entry.latest_since, late = first_latest_ask(entry.began, self._clock.wall())
            if late:
                after, timestamp = AT_TIMESTAMP, entry.latest_since
        pinned = None
        if slot.unfilled is not None:
            last, first = slot.unfilled
            pinned = Pinned(first, last, None)
        continues = pinned is None and entry.iterator is not None and entry.iterator_at == after
        return ReadRange(
            src.lease_key,
            src.stream,
            src.stream_arg,
            src.shard_id,
            after,
            max_records=max(1, records),
            max_bytes=max(1, nbytes),  # whole pages: one may go beyond
            max_seconds=s.max_seconds if pinned is None else self._pinned_seconds(),
            max_pages=s.max_pages,
            read_rate=s.read_rate,
            kpl=s.kpl,
            hash_range=src.hash_range,
            timestamp=timestamp,
            iterator=entry.iterator if continues else None,
            pinned=pinned,
            delay=max(0.0, entry.next_read_at - now),
        )

    def _pinned_seconds(self) -> float:
        """A pinned read's time budget: a piece re-formed after a crash may be a whole batch read
        on the driver (``max_bytes``, 64 MiB), and at a lowered ``read_rate`` (a shard shared
        with other consumers) that takes longer than the fixed budget, which failed the read
        every time, parking the lease every tenure: twice the time it takes, at the least."""
        s = self._s
        fixed = s.max_seconds * PINNED_TIME_FACTOR
        return fixed if s.read_rate <= 0 else max(fixed, 2 * s.max_bytes / s.read_rate)

    @staticmethod
    def _describe(ranges: list[ReadRange]) -> str:
        keys = ", ".join(r.lease_key for r in ranges[:8])
        more = f" and {len(ranges) - 8} more" if len(ranges) > 8 else ""
        return f"kclpy-spark: read {len(ranges)} range(s): {keys}{more}"

    def _found(
        self, entry: _Entry, slot: ReadSlot, rng: ReadRange, read: RangeRead, now: float
    ) -> None:
        end = read.ends[rng.lease_key]
        if end.error is not None:  # not before its reader's pacing allows (a big page read)
            paced = self._paced(end, now + rng.delay) if end.next_call_at else 0.0
            return self._failed(entry, end.error, now, slot.lane, paced)
        if end.rows and end.first is not None and end.last is not None:
            chunk = RangeChunk(
                None, end.first, end.last,
                read=read, lease_key=rng.lease_key, row_count=end.rows, byte_count=end.nbytes,
            )  # fmt: skip
            assert self._feed is not None
            if not self._feed.fill(slot.lane, chunk, slot.epoch):  # closed, parked or put back
                with self._lock:  # so read again from where the lane's records end
                    entry.iterator = entry.iterator_at = None
                    entry.next_read_at = self._paced(end, now + rng.delay)
                return
        # Lag 0 on a full page (or one past the range) says nothing of the tip: given as
        # unknown, so nothing takes it for caught up (``--until-caught-up``); a positive lag is
        # the shard's and shows.
        lag = None if end.left_behind and not end.millis_behind_latest else end.millis_behind_latest
        if end.unanswered and rng.pinned is None:
            return self._unanswered(entry, rng, end, now)
        if end.shard_ended and slot.owed_to is not None and rng.pinned is None:
            self._owed_gone(entry, slot)
        with self._lock:
            entry.failures = 0
            entry.lag = lag
            entry.ended = entry.ended or end.shard_ended  # a pinned read never ends it
            entry.iterator, entry.iterator_at = end.next_iterator, _continues_after(rng, end)
            entry.next_read_at = self._next_read(rng, end, now)
            if end.read_records:  # by the Kinesis records the Limit counts (an aggregate: one)
                entry.record_bytes = max(1, end.read_bytes // end.read_records)
            entry.pace = 0.0 if cut_short(rng, end) else page_pace(
                end.nbytes, min_interval=self._s.min_interval, read_rate=self._s.read_rate
            )  # fmt: skip
            entry.behind = is_behind(rng, end, self._s.idle_seconds)
        children = [dict(c) for c in end.child_shards]
        last = end.last.sequence_number if end.last is not None else None
        counted = ReadElsewhere(end.rows, end.nbytes, last, end.throttled, end.out_of_range)
        entry.post(FetchedBatch([], lag, end.shard_ended, children, elsewhere=counted))

    def _owed_gone(self, entry: _Entry, slot: ReadSlot) -> None:
        """Read to the shard's end short of what its lane owed (dropped behind a piece lost
        with an executor): aged out meanwhile. Waiting would hold the shard-end step for good."""
        assert self._feed is not None
        owed = self._feed.reached_end(slot.lane, slot.epoch)
        if owed is not None:
            log.warning(
                "shard %s: records up to %s, read once and lost with an executor, aged out of "
                "the stream's retention before they were read again; its shard-end step goes on",
                entry.source.shard_id, owed.sequence_number,
            )  # fmt: skip

    def _unanswered(self, entry: _Entry, rng: ReadRange, end: RangeEnd, now: float) -> None:
        """The range got no GetRecords answer within its time: every call throttled (other
        consumers of the shard) or failing in a way a retry may mend (the executors cannot
        reach Kinesis). Backed off as a failure is, growing; its consumer hears that nothing
        answered (its readiness and lag then show a silent shard, as the driver path's do, and
        the throttled calls are counted), not a read at the tip: it was taken for one, due again
        a second later, and every round holding it lasted its whole budget. Neither parks the
        lease: a failure a retry cannot mend is an error (``_failed``). An iterator it got
        (GetRecords throttled) is kept for the next range: another GetShardIterator would spend
        the shard's allowance of those too."""
        self._back_off(entry, now)
        if end.next_iterator is not None:
            with self._lock:
                entry.iterator, entry.iterator_at = end.next_iterator, _continues_after(rng, end)
        entry.post(NoAnswer(end.throttled))

    def _next_read(self, rng: ReadRange, end: RangeEnd, began: float) -> float:
        """When the lease is read next: as soon as the shard may be called again (``_paced``: a
        big page's bytes at the read rate, at the tip too), and at the tip not before
        ``idle_seconds``."""
        paced = self._paced(end, began + rng.delay)  # its task called no sooner
        if not is_behind(rng, end, self._s.idle_seconds):
            return max(self._clock.monotonic() + self._s.idle_seconds, paced)
        return paced

    def _paced(self, end: RangeEnd, began: float) -> float:
        """When the shard may be called again after the read that found ``end`` (``paced``)."""
        s = self._s
        return paced(end, began, done=self._clock.monotonic(), wall=self._clock.wall(),
                     min_interval=s.min_interval, read_rate=s.read_rate)  # fmt: skip

    def _failed(self, entry: _Entry, why: str, now: float, lane: Lane, paced: float = 0) -> None:
        self._back_off(entry, now, paced)
        if entry.ended:
            # Its relay tells its consumer nothing more: the lane is parked instead, which the
            # shard-end step counts toward the lease's failure budget (SinkParkedError), then
            # re-arms it to read again.
            assert self._feed is not None
            self._feed.park(lane, f"reading again at the shard's end failed: {why}")
            return
        entry.post(RangeReadError(f"shard {entry.source.shard_id}: {why}"))

    def _back_off(self, entry: _Entry, now: float, paced: float = 0) -> None:
        """One more failure: read again after the growing backoff, counted from the round's
        start ``now``, at least one call's interval from now, not before ``paced`` (the failed
        read's own pacing: a retry after a big page read waited only the backoff)."""
        with self._lock:
            entry.failures += 1
            entry.behind = False
            entry.iterator = entry.iterator_at = None
            soonest = max(self._clock.monotonic() + self._s.min_interval, paced)
            entry.next_read_at = max(now + self._backoff.delay(entry.failures), soonest)


def _lost(slot: ReadSlot) -> bool:
    """Whether a lease read to its shard's end has records to read again: a piece to re-form,
    or records its lane dropped with a piece put back (``owed_to``)."""
    return slot.unfilled is not None or slot.owed_to is not None


def _outage(exc: BaseException) -> bool:
    """Whether a read job's failure is the cluster's (Spark or py4j: executors lost, the cluster
    down, the JVM gone; or its deadline), not a fault of this code or of the ranges."""
    package = type(exc).__module__.split(".", 1)[0]
    return isinstance(exc, ReadJobTimeoutError) or package in ("py4j", "pyspark")


def _continues_after(rng: ReadRange, end: RangeEnd) -> ESN:
    """Where the iterator a read of ``rng`` left (``end.next_iterator``) continues after: its
    last record, else where the range began; AT_TIMESTAMP for LATEST, as the next range asks
    (``_range``)."""
    at = end.last if end.last is not None else rng.after
    return AT_TIMESTAMP if at == LATEST else at
