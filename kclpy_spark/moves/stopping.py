"""A stopping worker's steps. After handing its leases out, it keeps processing while the new
owners find them (``let_new_owners_see``). Its last step: give up every lease it still holds
(ending the graceful handoffs that ``Taker.hand_out`` began, releasing the rest so any worker
takes them at once), resign shard-sync leadership and publish that it stopped, so a restart need
not wait for its old status to age."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from checkpoint import coordination
from checkpoint.base.errors import KclpySparkError
from kclpy_spark.moves.taking import HANDOFF_POLL
from kclpy_spark.runtime.publish import StatusSource, status_payload

if TYPE_CHECKING:
    from checkpoint.base.clock import AsyncSleep, Clock
    from checkpoint.coordination import StatusWriter
    from checkpoint.leasing.held_lease import HeldLease
    from kclpy_spark.runtime.lease_store import LeaseStore

log = logging.getLogger(__name__)

Io = Callable[..., Awaitable[Any]]


class StoppingWorker(StatusSource, Protocol):
    """What the stopping steps use of the worker (the worker is one)."""

    @property
    def clock(self) -> Clock: ...
    @property
    def sleep(self) -> AsyncSleep: ...
    @property
    def status_writer(self) -> StatusWriter: ...
    @property
    def store(self) -> LeaseStore: ...


async def announce_stopping(w: StoppingWorker, io: Io) -> None:
    """Publish that we are stopping (before handing leases out): the other workers count us
    as running no more, so none of them waits for us to take a share (or, led, assigns us one)."""
    now = w.clock.wall()
    try:
        await io(w.status_writer.publish, {**status_payload(w, now), "stopping": True}, now)
    except Exception as exc:  # stopping goes on: our status then ages out instead
        log.warning("worker %s: could not publish that it is stopping: %r", w.cfg.worker_id, exc)
    if w.cfg.lease_assignment != "worker":  # the next leader assigns now, not a failover later
        with contextlib.suppress(Exception):
            await io(w.leader.resign)


async def let_new_owners_see(w: StoppingWorker, left: float) -> float:
    """After handoffs were begun on stopping: keep processing for one of the new owners' scan
    intervals and a second (at most half the grace ``left``: the processors' checkpoints need
    the rest), so that each has found the lease being handed to it and watches it when our
    processor checkpoints; it then starts within HANDOFF_POLL. Returns the seconds waited."""
    wait = max(0.0, min(w.timing.take_interval + 2 * HANDOFF_POLL, left / 2))
    log.info("worker %s: processing on for %.1f s while the new owners find the leases handed "
             "to them", w.cfg.worker_id, wait)  # fmt: skip
    await w.sleep(wait)
    log.info("worker %s: stopping the consumers of the leases being handed over",
             w.cfg.worker_id)  # fmt: skip
    return wait


async def _give_back_untaken(w: StoppingWorker, io: Io) -> None:
    """Evict the leases the table says are ours that this worker never took (assigned by the
    leader, or handed to us, after its last look): nobody read them until they counted as
    expired, twice the failover time for a lease just moved. A lease mid-handoff is left to its
    old owner (it releases instead of handing to a worker that stopped). Each conditional on
    its counter; a failure leaves that lease to expire, as before."""
    me = w.cfg.worker_id
    try:
        keys = await io(w.store.list_lease_keys_by_owner, me)
        held = {h.lease_key for h in w.holder.held()}
        for key in sorted(set(keys) - held):
            lease = await io(w.store.get_lease, key)
            if lease is None or lease.lease_owner != me or lease.checkpoint_owner is not None:
                continue
            if await io(w.store.evict_lease, lease) is not None:
                w.events.add(key, "released", "assigned to a stopping worker, never taken")
                log.info("worker %s gave back lease %s, ours but never taken", me, key)
    except KclpySparkError as exc:
        log.warning("worker %s: leases ours but never taken were not given back (%s); they "
                    "expire instead", me, exc)  # fmt: skip


async def _release(w: StoppingWorker, io: Io, held: HeldLease, take_back: bool) -> None:
    """Give ``held`` back: end its handoff, or release it (one never handed, or with
    ``take_back`` one whose receiver stopped too: its handoff is taken back)."""
    target = held.lease.lease_owner  # the receiver of a handoff
    try:
        release = functools.partial(w.holder.release, take_back_handoff=take_back)
        result = await io(release, held.lease_key, held.token)
        outcome = "" if result.won else " (already lost)"
    except KclpySparkError as exc:
        outcome = f" failed ({exc}); it expires instead"
    if take_back:
        w.events.add(held.lease_key, "released", f"{target} is stopping too{outcome}")
        log.info("lease %s: not handed to %s, which is stopping too: released%s",
                 held.lease_key, target, outcome)  # fmt: skip
        return
    if held.lease.handoff_pending:  # hand_out() began a graceful handoff: this ends it
        w.events.add(held.lease_key, "handed", f"to {held.lease.lease_owner}{outcome}")
        log.info("lease %s: handed over to %s (worker stopping)%s", held.lease_key,
                 held.lease.lease_owner, outcome)  # fmt: skip
        return
    w.events.add(held.lease_key, "released", f"worker stopping{outcome}")
    log.info("worker %s released lease %s%s", w.cfg.worker_id, held.lease_key, outcome)


async def runs_no_more(store: LeaseStore, io: Io, worker: str, now: float, max_age: float) -> bool:
    """Whether ``worker`` runs no more by its status record (stopping, stopped, suspended, or
    not written within ``max_age``): one read. A worker without a record of ours (a KCL 3.x
    one), or a read that failed, is trusted."""
    try:
        record = await io(store.get_record, coordination.worker_key(worker))
    except KclpySparkError:
        return False
    if record is None:
        return False
    return worker not in coordination.live_workers([record], now, max_age)


class StoppedReleases:
    """Gives a lease back (its handoff ended, or released): as soon as its own consumer stopped
    (``ConsumerSet.shutdown_all``'s ``on_stopped``), not after the slowest consumer's shutdown,
    and then every lease left (``release_all``). A handoff whose receiver runs no more by its
    status record (stopping, stopped, suspended, or not written lately) since we chose it is
    taken back and the lease released: that worker would never take it (its take loop has
    ended), and it waited to expire with nobody reading it. Each receiver's record is read at
    most once every ``HANDOFF_POLL`` (``runs_no_more``; calls side by side share the read); a
    worker without a record of ours (a KCL 3.x one) is trusted as it was when chosen."""

    def __init__(self, w: StoppingWorker, io: Io) -> None:
        self._w, self._io = w, io
        # receiver -> (whether it runs no more, when asked): read again after HANDOFF_POLL,
        # a receiver may begin to stop while our consumers do
        self._gone: dict[str, tuple[asyncio.Future[bool], float]] = {}

    async def __call__(self, key: str) -> None:
        w = self._w
        held = w.holder.get_if_held(key)
        if held is None:  # lost, or given back already
            return
        target = held.lease.lease_owner if held.lease.handoff_pending else None
        gone = target is not None and await self._runs_no_more(target)
        await _release(w, self._io, held, gone)

    async def _runs_no_more(self, target: str) -> bool:
        w = self._w
        now = w.clock.monotonic()
        known = self._gone.get(target)
        if known is None or now - known[1] > HANDOFF_POLL:
            read = runs_no_more(w.store, self._io, target, w.clock.wall(), w.timing.status_max_age)
            known = self._gone[target] = (asyncio.ensure_future(read), now)
        return await asyncio.shield(known[0])


async def release_all(w: StoppingWorker, io: Io, *, resign: bool = True) -> None:
    """Release every lease held (or end its hand-off), all at once on the lease threads: one
    after another, with hundreds held, the last ones passed their expiry first and were left
    to expire (the caller keeps renewing meanwhile)."""
    releases = StoppedReleases(w, io)
    await asyncio.gather(*(releases(held.lease_key) for held in w.holder.held()))
    await _give_back_untaken(w, io)
    if not resign:
        return
    with contextlib.suppress(KclpySparkError):
        await io(w.leader.resign)
    with contextlib.suppress(KclpySparkError):  # a restart need not wait for us
        stopped = {"stopped": True}  # the whole record is replaced: nothing else stays
        now = w.clock.wall()
        await io(w.status_writer.publish, stopped, now)
