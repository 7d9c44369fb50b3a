"""Preparing one batch before any sink writes: each sink's tokens for its fresh pieces (its
``prepare``, timed as a write), each cut's pending checkpoint (listing every cut of its lane out),
then the ``SinkBatch`` the sinks get. The batch's lanes change only through ``LaneEvents``."""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from checkpoint.base.durability import durable_on_exit
from checkpoint.checkpointer import CheckpointError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.acks import PrepareFailedError
from kclpy_spark.spark.batch_life import Batch, LaneEvents
from kclpy_spark.spark.frames import ExecutorFrames, RangeChunk
from kclpy_spark.spark.lane import TwoPhaseCheckpointer
from kclpy_spark.spark.pieces import SCHEMA, PendingState, Piece, batch_id_of
from kclpy_spark.spark.sink_batch import SinkBatch, SinkRoute, ToDataFrame, own_pieces_only
from kclpy_spark.spark.timed_write import TimedWrites, WriteHungError, WriteThreadsClosedError

log = logging.getLogger(__name__)

# With several sinks, a lease's stored sink token is {BY_SINK: {sink name: token}}.
BY_SINK = "by_sink"


class BatchPreparer:
    """``prepare(batch)``: tokens, pending checkpoints and the SinkBatch, for ``routes``."""

    def __init__(
        self,
        routes: Sequence[SinkRoute],
        events: LaneEvents,
        calls: TimedWrites,
        to_df: ToDataFrame | None,
        parse: Any,
    ) -> None:
        self._routes = tuple(routes)
        self._events = events
        self._calls = calls  # where a sink's prepare runs, timed
        self._to_df = to_df
        self._parse = parse  # a DataFrame read on the executors into the value schema
        # Whether a lease's pending checkpoint names its batch's other pieces (IdempotentPerPiece).
        self._own_groups = own_pieces_only(self._routes)

    @property
    def own_groups(self) -> bool:
        """Each pending checkpoint names its own piece alone (sinks written once per piece)."""
        return self._own_groups

    def prepare(self, batch: Batch) -> None:
        """Tokens, then each cut's pending checkpoint (once per batch), then the SinkBatch."""
        if not batch.tokens_ready:
            fresh = [cut.piece for _, cut in batch.parts if not cut.replayed]
            # A sink whose prepare gave up on this batch gets none: it is dead-lettered.
            given = {
                r.name: {} if r.name in batch.unprepared else self._tokens(r, fresh)
                for r in self._routes
            }
            for lane, cut in batch.parts:
                if not cut.replayed:
                    by_sink = {name: t.get(lane.lease_key) for name, t in given.items()}
                    if len(self._routes) > 1:
                        token: Any = {BY_SINK: by_sink}
                    else:
                        token = next(iter(by_sink.values()))
                    self._events.tokened(lane, cut, token)
            self._tokens_for_replays(batch)
            batch.tokens_ready = True
        # One wait for the disk for the batch's pending checkpoints; a failed one (SyncError)
        # gives the batch up, never retried (BatchWriter._retrying).
        with durable_on_exit():
            while not self._prepare_pending(batch):
                # A cut left the batch: the pending checkpoints written so far name the old
                # composition, so the survivors' are written again with the new one.
                batch.prepared.clear()
                batch.sink_batch = None
        if batch.sink_batch is None and batch.parts:
            chunks = [c for _, cut in batch.parts for c in cut.chunks]
            pieces = tuple(cut.piece for _, cut in batch.parts)
            ranges = [c for c in chunks if isinstance(c, RangeChunk)]
            batch.sink_batch = SinkBatch(
                batch_id_of([p.key for p in pieces]),
                pieces,
                None if ranges else pa.Table.from_batches([c.batch for c in chunks], SCHEMA),
                {lane.lease_key: cut.token for lane, cut in batch.parts},
                to_df=self._to_df,
                frames=ExecutorFrames(ranges, self._parse) if ranges else None,
            )

    def _tokens_for_replays(self, batch: Batch) -> None:
        """Re-formed pieces keep their stored tokens; a sink that has none for one (its prepare
        gave up on the batch that first held it, which went to its dead letter) prepares it now:
        written without one, ``delta:`` took the next version at each attempt, and a write that
        timed out after it committed was committed again."""
        several = len(self._routes) > 1
        for route in self._routes:
            if route.name in batch.unprepared:
                continue
            missing = [
                (lane, cut) for lane, cut in batch.parts
                if cut.replayed and stored_token(cut.token, route.name, several=several) is None
            ]  # fmt: skip
            if not missing:
                continue
            given = self._tokens(route, [cut.piece for _, cut in missing])
            for lane, cut in missing:
                token = given.get(lane.lease_key)
                if token is None:
                    continue
                if several:
                    by_sink = dict(cut.token[BY_SINK]) if is_wrapped(cut.token) else {}
                    token = {BY_SINK: {**by_sink, route.name: token}}
                self._events.tokened(lane, cut, token)

    def _prepare_pending(self, batch: Batch) -> bool:
        """Write the pending checkpoint of each cut not yet prepared (listing every cut of its
        lane out, pipelined ones included); False when a cut had to leave the batch (its lease
        cannot take a checkpoint any more, or it was put back meanwhile)."""
        for lane, cut in list(batch.parts):
            if id(cut) in batch.prepared:
                continue
            write = functools.partial(_write_pending, lane.checkpointer)
            group = (cut.key,) if self._own_groups else batch.group
            try:
                if not self._events.write_pending(lane, cut, group, write):
                    batch.parts.remove((lane, cut))  # put back meanwhile
                    return False
            except CheckpointError as exc:
                if exc.retry_may_help:
                    exc.unprepared = (lane, cut)  # type: ignore[attr-defined]  # whose write
                    raise
                log.warning("lease %s: cannot prepare its checkpoint (%s)", lane.lease_key, exc)
                batch.parts.remove((lane, cut))  # put back by write_pending (not_prepared)
                return False
            batch.prepared.add(id(cut))
            self._events.prepared(lane, cut)
        return True

    def _tokens(self, route: SinkRoute, pieces: list[Piece]) -> Mapping[str, Any]:
        if not pieces:
            return {}
        sink = route.sink
        index = self._routes.index(route)
        try:
            # Timed as a write: delta:'s reads its table's log, under a lock its writers share.
            return self._calls.call(
                lambda: sink.prepare(pieces),
                route.write_timeout,
                f"kclpy-spark-prepare-{index}-{uuid.uuid4().hex[:8]}",
                f"preparing {len(pieces)} piece(s) for sink {route.name!r}",
            )
        except (WriteThreadsClosedError, WriteHungError):
            # Not a sink's failure to wrap: closing; or never tried again while it runs, and not
            # dead-lettered either (each batch would leave another prepare hanging until the
            # side threads' cap refused the dead-letter writes too): parked, the lease waits.
            raise
        except Exception as exc:
            raise PrepareFailedError(route.name, exc) from exc


def is_wrapped(token: Any) -> bool:
    """Whether a lease's stored token is several sinks' (``{BY_SINK: {name: token}}``)."""
    return isinstance(token, Mapping) and set(token) == {BY_SINK}


def stored_token(token: Any, sink: str, *, several: bool) -> Any:
    """One sink's token in a lease's stored one (``{BY_SINK: ...}`` with several sinks); None
    when it has none, or was stored under another list of sinks."""
    if several:
        return token[BY_SINK].get(sink) if is_wrapped(token) else None
    return None if is_wrapped(token) else token


def _write_pending(
    checkpointer: TwoPhaseCheckpointer, target: ExtendedSequenceNumber, state: PendingState
) -> None:
    checkpointer.prepare_checkpoint(
        target.sequence_number, target.sub_sequence_number, state.encode()
    )
