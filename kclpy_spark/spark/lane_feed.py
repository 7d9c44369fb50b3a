"""The batcher's lanes as the reads on the executors see them (the ``LaneFeed`` port, and
``LanesFeed``, the MicroBatcher's): which lanes can take records now, and giving a lane its
records. Every call holds the batcher's lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol

from checkpoint.base.clock import Clock
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.frames import RangeChunk
from kclpy_spark.spark.lane import Lane, LaneState

ESN = ExtendedSequenceNumber


@dataclass(frozen=True)
class ReadSlot:
    """A lane that can take records now: where its records end (None: none yet) and, when it
    re-forms a piece, that piece's last record and maybe its first; ``epoch``: the lane's
    ``reads_epoch`` then (a read planned before its records were put back to be read again is
    refused)."""

    lane: Lane
    read_to: ESN | None
    unfilled: tuple[ESN, ESN | None] | None
    epoch: int = 0
    owed_to: ESN | None = None  # the lane's records end here once read again (``Lane.owed_to``)


class LaneFeed(Protocol):
    """The batcher's side (MicroBatcher): its lanes, under its lock."""

    def readable(self, lease_keys: Collection[str]) -> tuple[dict[str, ReadSlot], set[str]]:
        """The slots of lanes that can take records now, and the keys of parked lanes."""
        ...

    def fill(self, lane: Lane, chunk: RangeChunk, epoch: int | None = None) -> bool:
        """Give the lane its records (False: the lane is closed, parked or replaced, or, given
        the ``epoch`` its read was planned in, its records were put back to be read since)."""
        ...

    def park(self, lane: Lane, reason: str) -> None:
        """Park the lane (a read its consumer no longer hears of failed)."""
        ...

    def reached_end(self, lane: Lane, epoch: int) -> ESN | None:
        """The lane's shard was read to its end: what it still owed (aged out), if anything."""
        ...

    def together(self) -> AbstractContextManager[None]:
        """Calls inside the block act as one: no batch is cut from the lanes until it ends."""
        ...


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

    @contextmanager
    def together(self) -> Iterator[None]:
        """The batcher's lock held across the block (a round's fills): a writer that woke at
        the first lane filled cut a batch of it alone, and the round's others went in more
        batches (a write job, a sync and a commit each): 4.2 batches a second from 1.6 read
        rounds at 24 shards."""
        with self._cond:
            yield

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
