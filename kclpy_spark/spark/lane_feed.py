"""The batcher's lanes as the reads on the executors see them (a ``LaneFeed``): which lanes can
take records now, and giving a lane its records. Every call holds the batcher's lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from checkpoint.base.clock import Clock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.executor_reads import ReadSlot
from kclpy_spark.spark.frames import RangeChunk
from kclpy_spark.spark.lane import Lane, LaneState


class LanesFeed:
    def __init__(
        self,
        cond: threading.Condition,
        lanes: dict[str, Lane],
        clock: Clock,
        closed: Callable[[], bool],
    ) -> None:
        self._cond = cond  # the batcher's lock
        self._lanes = lanes  # the batcher's lanes (read under its lock only)
        self._clock = clock
        self._closed = closed

    def readable(self, lease_keys: Collection[str]) -> tuple[dict[str, ReadSlot], set[str]]:
        """Lanes that can take records: active, room for one more batch in flight (every one
        out prepared, so pending checkpoints stay in order), and nothing waiting to be cut,
        unless a piece to re-form waits for its records. Also the parked ones' keys."""
        slots: dict[str, ReadSlot] = {}
        parked: set[str] = set()
        with self._cond:
            for key in () if self._closed() else lease_keys:
                lane = self._lanes.get(key)
                if lane is not None and lane.state is LaneState.PARKED:
                    parked.add(key)
                if lane is None or lane.state is not LaneState.ACTIVE:
                    continue
                outs = lane.outs
                if len(outs) >= lane.depth or not all(c.prepared for c in outs):
                    continue
                unfilled = lane.unfilled()
                if unfilled is not None or not lane.rows:
                    slots[key] = ReadSlot(
                        lane, lane.read_to, unfilled, lane.reads_epoch, lane.owed_to
                    )
        return slots, parked

    def fill(self, lane: Lane, chunk: RangeChunk, epoch: int | None = None) -> bool:
        """Give ``lane`` its records (False: closed, parked or replaced meanwhile, or, given the
        ``epoch`` the read was planned in, its records were put back to be read again since: a
        read planned before that continues from records the lane no longer has)."""
        with self._cond:
            if self._lanes.get(lane.lease_key) is not lane or lane.state is not LaneState.ACTIVE:
                return False
            if epoch is not None and epoch != lane.reads_epoch:
                return False
            # What its consumer would have set had it delivered them: the checkpoint may go there.
            # Never lowered: a piece read again (pinned) was delivered before, and at the shard's
            # end the largest permitted is SHARD_END, whose checkpoint would be refused below it.
            checkpointer = lane.checkpointer
            if checkpointer.largest_permitted < chunk.last:
                checkpointer.set_largest_permitted(chunk.last)
            lane.add(chunk, self._clock.monotonic())
            self._cond.notify_all()
            return True

    def reached_end(self, lane: Lane, epoch: int) -> ExtendedSequenceNumber | None:
        """The lane's shard was read to its end after its last records (``Lane.read_to_end``);
        what it still owed, if anything (None too if its records were put back since)."""
        with self._cond:
            if self._lanes.get(lane.lease_key) is not lane or epoch != lane.reads_epoch:
                return None
            owed = lane.read_to_end()
            self._cond.notify_all()
            return owed

    def park(self, lane: Lane, reason: str) -> None:
        with self._cond:
            if self._lanes.get(lane.lease_key) is lane:
                lane.park(reason)
                self._cond.notify_all()
