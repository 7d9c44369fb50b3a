"""The driver's share of a read round with ``read_on = "executors"`` at many leases (simulated).

``ExecutorReads.read_round`` for N leases, as the worker runs it: which lanes can take records
(the batcher's real ``LanesFeed`` and ``Lane`` objects), one ``ReadRange`` each, their JSON for the
job's closure, then each range's end taken back (parsed from its JSON, the lane given its chunk,
pacing, the report to the lease's relay). The Spark job itself is replaced by the ends a read
would give (100 records and 20 KB a lease, 1 s behind), since what it costs the driver does not
grow with the leases (one job; the executors read). After each round every lane's records are
taken as a committed batch would take them (not timed), so every lease is read each round.

It reports the process CPU per round and, with ``read_on = "executors"``'s defaults (a batch at
most every ``max_wait`` = 5 s; a lease behind is read again every 0.2 s, so up to 25 rounds in
that time), that CPU as a share of the batch interval.

    python bench/bench_planning.py [--leases 1000] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

from checkpoint.base.clock import ManualClock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.cluster_read import RangeRead
from kclpy_spark.spark.executor_reads import ExecutorReads, LeaseSource, ReadSettings
from kclpy_spark.spark.lane import Lane
from kclpy_spark.spark.lane_feed import LanesFeed
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import RangeEnd, ReadRange

ROWS, NBYTES, LAG = 100, 20_000, 1_000
MAX_WAIT, READ_EVERY = 5.0, 0.2


class Checkpointer:
    """What a lane asks of its lease's checkpointer while records are only planned and read."""

    pending_checkpoint = None

    def __init__(self, lease_key: str) -> None:
        self.lease_key = lease_key

    def set_largest_permitted(self, position: ExtendedSequenceNumber) -> None:
        return None


class StubbedJob:
    """Stands for the Spark job. Timed: what the driver does around it (the ranges' JSON for
    the closure, each end parsed from its collected row). Not timed: the executors' part (the
    ends' JSON, made by ``ready`` before the round)."""

    def __init__(self) -> None:
        self.next_seq: dict[str, int] = {}
        self.texts: dict[str, str] = {}

    def ready(self, keys: Sequence[str]) -> None:
        for key in keys:
            first = self.next_seq.get(key, 1)
            self.next_seq[key] = first + ROWS
            self.texts[key] = RangeEnd(
                key, ExtendedSequenceNumber(str(first)),
                ExtendedSequenceNumber(str(first + ROWS - 1)), ROWS, NBYTES,
                millis_behind_latest=LAG,
            ).to_json()  # fmt: skip

    def __call__(self, session: Any, ranges: list[ReadRange], aws: AwsTarget, **_: Any) -> Any:
        payload = tuple(r.to_json() for r in ranges)  # what read_ranges puts in the closure
        assert len(payload) == len(ranges)
        ends = {r.lease_key: RangeEnd.from_json(self.texts[r.lease_key]) for r in ranges}
        return RangeRead(None, ends)


def take_all(lanes: Sequence[Lane], clock: ManualClock) -> None:
    """Every lane's records cut, written and committed (what the batcher does; not timed)."""
    now = clock.monotonic()
    for lane in lanes:
        if not lane.rows:
            continue
        cut = lane.cut(10**9, 10**12)
        lane.prepared(cut)
        lane.acknowledged(cut)
        claimed = lane.claim_commit(now)
        if claimed is not None:
            lane.committed(claimed)


def run(leases: int, rounds: int) -> list[float]:
    clock = ManualClock()
    keys = [f"shardId-{i:012d}" for i in range(leases)]
    lanes = {k: Lane(k, k, Checkpointer(k), depth=2) for k in keys}  # type: ignore[arg-type]
    feed = LanesFeed(threading.Condition(), lanes, clock, lambda: False)
    job = StubbedJob()
    reads = ExecutorReads(
        lambda: None, AwsTarget("us-east-1"), ReadSettings(), clock=clock, read=job
    )
    reads.start(feed, threaded=False)
    trim = ExtendedSequenceNumber("TRIM_HORIZON")
    posted: list[Any] = []
    for key in keys:
        reads.register(LeaseSource(key, "s", {"StreamName": "s"}, key, trim), posted.append)
    cpu: list[float] = []
    try:
        for _ in range(rounds):
            clock.advance(1.0)  # every lease due again
            job.ready(keys)
            start = time.process_time()
            read = reads.read_round()
            cpu.append(time.process_time() - start)
            assert read == leases, f"{read} of {leases} leases read"
            take_all(list(lanes.values()), clock)
            posted.clear()
    finally:
        reads.close()
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--leases", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print("| leases | CPU ms per round (median) | per lease, us | share of a 5 s batch interval "
          "at 25 rounds |")  # fmt: skip
    print("|---:|---:|---:|---:|")
    for n in args.leases:
        cpu = run(n, args.rounds)[5:]  # the first rounds warm the caches
        per_round = statistics.median(cpu)
        share = per_round * (MAX_WAIT / READ_EVERY) / MAX_WAIT
        print(f"| {n:,} | {per_round * 1e3:.2f} | {per_round / n * 1e6:.1f} | {share:.1%} |")


if __name__ == "__main__":
    main()
