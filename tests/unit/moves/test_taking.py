"""Taker paths of the graceful handoff, on the memory store with a stand-in worker: leases the
table hands us are taken (unless finished, parked or not ours to run), a handoff from us of a
lease we no longer hold is ended so its new owner can start, and a consumer that cannot start
does not leave its lease held."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from checkpoint import coordination
from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import DependencyError
from checkpoint.counters import CoordinationCounters
from checkpoint.lease import Lease
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.leasing.timing import LeaseTiming
from checkpoint.port import CoordinationRecord, KclWorkerSighting, TableScan
from checkpoint.sequence import SHARD_END, TRIM_HORIZON
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.moves.assigning import leader_election, lease_timing
from kclpy_spark.moves.lease_worker import Placement
from kclpy_spark.moves.reports import TakeReports
from kclpy_spark.moves.taking import CLOCK_WARNING_EVERY, MAX_LOOKS, PRUNE_EVERY, Taker
from kclpy_spark.runtime.events import EventLog
from kclpy_spark.runtime.metrics import WorkerMetrics
from kclpy_spark.runtime.run_state import RunState
from shard_sync.leader import LEADER_KEY

ME = "me"


class Consumers(dict[str, Any]):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    def start(self, held: Any, context: Any) -> None:
        if self.fail:
            raise RuntimeError("cannot start")
        self[held.lease_key] = held


class Looks:
    """Stands in for the leader election and the suspend flag: what each scan showed them."""

    is_leader = assigning = other_assigns = False  # nobody leads

    def led_by(self) -> str | None:
        return None

    def set_assigns(self, assigns: bool) -> None:  # only a leader decides: never called
        raise AssertionError("a worker that does not lead decided whether to assign")

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[str, ...], float]] = []

    def observe(self, records: Any, returned_at: float) -> None:
        self.seen.append((tuple(sorted(r.key for r in records)), returned_at))


class FakeWorker(SimpleNamespace):
    """The worker as the lease loops see it, its parts set by each test; ``reports`` routes to
    whichever parts are set when a loop reports (tests replace some after building it)."""

    @property
    def reports(self) -> TakeReports:
        parts = (self.health, self.events, self.metrics, self.counters, self.suspend_flag)
        return TakeReports(self.cfg.worker_id, *parts, self.board)

    @property
    def placement(self) -> Placement:
        return Placement(self.streams, self.consumers)


def worker(table: MemoryLeaseTable, consumers: Consumers, clock: ManualClock | None = None) -> Any:
    clock = clock or ManualClock()
    return FakeWorker(
        cfg=WorkerConfig(stream_name="s", worker_id=ME, lease_assignment="worker"),
        store=table,
        clock=clock,
        timing=LeaseTiming(failover=10.0, steal_cooldown_intervals=0.0),
        holder=LeaseHolder(table, ME, clock, 10.0),
        consumers=consumers,
        streams=SimpleNamespace(context_of=lambda lease: object()),
        caught_up=None,
        run_state=RunState(ME, clock.monotonic),
        counters=CoordinationCounters(),
        metrics=WorkerMetrics(CoordinationCounters()),
        events=EventLog(ME, clock.wall),
        rng=random.Random(1),
        leader=Looks(),
        suspend_flag=Looks(),
        health=SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False),
        board=None,
    )


async def io(fn: Any, *args: Any) -> Any:
    return fn(*args)


def put(table: MemoryLeaseTable, key: str, **fields: Any) -> Lease:
    table.create_lease_if_absent(Lease(key, fields.pop("checkpoint", TRIM_HORIZON), **fields))
    stored = table.get_lease(key)
    assert stored is not None
    return stored


def test_leases_handed_to_us_are_taken_unless_finished_or_parked() -> None:
    table = MemoryLeaseTable()
    leases = [
        put(table, "handed", lease_owner=ME, lease_counter=3),
        put(table, "pending", lease_owner=ME, checkpoint_owner="x", lease_counter=3),
        put(table, "finished", lease_owner=ME, checkpoint=SHARD_END),
        put(table, "parked", lease_owner=ME, closed_until=1_800_000_000.0, closed_count=1),
        put(table, "theirs", lease_owner="x"),
    ]
    w = worker(table, Consumers())
    taker = Taker(w, io)
    asyncio.run(taker.adopt(leases))
    assert set(w.consumers) == {"handed"}
    assert table.get_lease("handed").lease_counter == 4  # type: ignore[union-attr]
    assert table.get_lease("pending").handoff_pending  # type: ignore[union-attr]
    # The handoff to us has begun: watched, and taken once its old owner completes it.
    assert set(taker._incoming) == {"pending"}
    asyncio.run(taker._look_at_incoming())
    assert set(w.consumers) == {"handed"} and set(taker._incoming) == {"pending"}
    assert table.complete_handoff(table.get_lease("pending")) is not None  # type: ignore[arg-type]
    asyncio.run(taker._look_at_incoming())
    assert set(w.consumers) == {"handed", "pending"} and not taker._incoming


def test_a_lease_handed_to_us_at_our_cap_is_given_back_not_taken() -> None:
    """Two stopping workers that both saw us below ``max_leases_for_worker`` (or the leader and
    a stopping worker) handed us one lease each: we took both and ran over the cap."""
    from dataclasses import replace as changed

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    w.cfg = changed(w.cfg, max_leases_for_worker=2)
    for key in ("a", "b"):
        held = table.take_lease(put(table, key), ME)
        assert held is not None
        w.holder.add_taken(held)
    over = put(table, "over", lease_owner=ME, lease_counter=3)
    asyncio.run(Taker(w, io).adopt([over]))
    after = table.get_lease("over")
    assert after is not None and after.lease_owner is None and after.lease_counter == 4
    assert "over" not in w.consumers and len(w.holder.held()) == 2


def test_a_lease_we_are_handing_over_still_counts_toward_our_cap() -> None:
    """A thief asked for one of our two leases: the table names it its owner, but we run it
    until the handoff completes. The rule counted us at one and we took a free lease: three
    held at a cap of two."""
    from dataclasses import replace as changed

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    w.cfg = changed(w.cfg, max_leases_for_worker=2)
    w.board = SimpleNamespace(on_scan=lambda *a: None)
    for key in ("a", "b"):
        held = table.take_lease(put(table, key), ME)
        assert held is not None
        w.holder.add_taken(held)
        w.consumers[key] = held
    asked = table.initiate_handoff(table.get_lease("a"), "thief")  # type: ignore[arg-type]
    assert asked is not None
    put(table, "free")
    asyncio.run(Taker(w, io).round())
    assert len(w.holder.held()) == 2 and "free" not in w.consumers


def test_a_graceful_steal_counts_once_as_a_move_and_once_as_a_handoff_asked() -> None:
    """Asking counted a steal, and the handed lease's arrival a take: one move was two on the
    dashboard (and in the soak's count of moves)."""
    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    theirs = table.take_lease(put(table, "theirs"), "giver")
    assert theirs is not None
    taker = Taker(w, io)
    assert asyncio.run(taker.ask_handoff(theirs, ME))
    pending = table.get_lease("theirs")
    assert pending is not None and table.complete_handoff(pending) is not None  # the giver
    asyncio.run(taker._look_at_incoming())  # it watches what it asked for: taken
    assert set(w.consumers) == {"theirs"}
    counts = {c: getattr(w.metrics, c)._value.get() for c in ("takes", "steals", "handoffs_asked")}
    assert counts == {"takes": 1, "steals": 0, "handoffs_asked": 1}


def test_a_handoff_from_us_of_a_lease_we_do_not_hold_is_ended() -> None:
    """Handed to us at a SIGTERM, then asked for by another worker before we took it: we are its
    checkpoint owner but never ran it. Ending the handoff lets the asker start at once instead
    of after the lease expired."""
    table = MemoryLeaseTable()
    orphan = put(table, "s", lease_owner="thief", checkpoint_owner=ME, lease_counter=7)
    w = worker(table, Consumers())
    taker = Taker(w, io)
    taker.running["thief"] = 0.0  # a kclpy-spark worker (its status record): it waits for us
    asyncio.run(taker.adopt([orphan]))
    after = table.get_lease("s")
    assert after is not None and after.lease_owner == "thief" and not after.handoff_pending
    assert after.lease_counter == 8 and not w.consumers


def test_a_lease_a_kcl_2x_worker_took_in_the_middle_of_our_handoff_is_left_to_it() -> None:
    """A KCL 2.x take leaves checkpointOwner as it was: our name stayed on a lease that worker
    holds and renews, and ending "our" handoff moved the counter under it (it lost the lease:
    a stalled shard, then records again)."""
    table = MemoryLeaseTable()
    taken = put(table, "s", lease_owner="java-2x", checkpoint_owner=ME, lease_counter=9)
    w = worker(table, Consumers())
    asyncio.run(Taker(w, io).adopt([taken]))
    assert table.get_lease("s") == taken and not w.consumers


def test_a_handoff_from_a_lease_we_hold_is_left_to_its_consumer() -> None:
    table = MemoryLeaseTable()
    mine = table.take_lease(put(table, "s"), ME)
    assert mine is not None
    w = worker(table, Consumers())
    w.holder.add_taken(mine)
    pending = table.initiate_handoff(mine, "thief")
    asyncio.run(Taker(w, io).adopt([pending]))  # type: ignore[list-item]
    assert table.get_lease("s") == pending  # still pending: hand_over completes it


def test_a_consumer_that_cannot_start_gives_its_lease_back() -> None:
    table = MemoryLeaseTable()
    handed = put(table, "s", lease_owner=ME)
    w = worker(table, Consumers(fail=True))
    asyncio.run(Taker(w, io).adopt([handed]))
    assert w.holder.get_if_held("s") is None
    assert table.get_lease("s").lease_owner is None  # type: ignore[union-attr]


def test_nothing_is_taken_while_the_worker_stops() -> None:
    table = MemoryLeaseTable()
    handed = put(table, "s", lease_owner=ME)
    w = worker(table, Consumers())
    w.run_state.stop("the test")
    asyncio.run(Taker(w, io).adopt([replace(handed)]))
    assert not w.consumers and table.get_lease("s") == handed


class CountingTable(MemoryLeaseTable):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.gets: list[str] = []
        self.failing = False
        self.take_takes = 0.0  # seconds a take "takes" on the clock

    def get_lease(self, lease_key: str) -> Lease | None:
        self.gets.append(lease_key)
        if self.failing:
            raise DependencyError("the lease table does not answer")
        return super().get_lease(lease_key)

    def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        self._clock.advance(self.take_takes)  # type: ignore[attr-defined]
        return super().take_lease(lease, owner)


def watching(keys: list[str]) -> tuple[CountingTable, Any, Taker]:
    """Leases of worker "a", each written (stamped) now, as a scan of ours has just seen them."""
    clock = ManualClock()
    table = CountingTable(clock)
    leases = [table.take_lease(put(table, key), "a") for key in keys]
    w = worker(table, Consumers(), clock)
    taker = Taker(w, io)
    taker._observer.observe(leases, clock.monotonic(), clock.wall())  # type: ignore[arg-type]
    table.gets.clear()
    return table, w, taker


def wait(taker: Taker, interval: float) -> None:
    async def run() -> None:  # the bound only keeps a broken wait from hanging the suite
        await asyncio.wait_for(taker.wait(asyncio.Event(), interval), 20.0)

    asyncio.run(run())


def test_the_wait_ends_when_a_lease_of_a_dead_owner_expires() -> None:
    table, w, taker = watching(["s"])
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    wait(taker, 3_600.0)  # returns at the look, not after the hour
    assert table.gets == ["s"]


def test_a_lease_written_again_is_looked_at_once_and_then_not_until_its_new_expiry() -> None:
    table, w, taker = watching(["s"])
    w.clock.advance(4.0)
    renewed = table.renew_lease(table.get_lease("s"))  # type: ignore[arg-type]
    assert renewed is not None
    table.gets.clear()
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew - 4.0 + 0.01)
    wait(taker, 0.5)  # the full half second: the owner is alive
    assert table.gets == ["s"]
    expiry = taker._observer.next_check(ME)
    assert expiry is not None and expiry > w.clock.monotonic()


def test_leases_handed_to_us_are_read_a_few_a_pass_in_turn_and_dropped_in_time() -> None:
    """A stopping worker handed us a hundred: each pass read all of them, one after another,
    while the take loop waited; and a key whose read kept failing was never dropped."""
    clock = ManualClock()
    table = CountingTable(clock)
    w = worker(table, Consumers(), clock)
    taker = Taker(w, io)
    keys = [f"h{i:03d}" for i in range(100)]
    for key in keys:
        put(table, key, lease_owner=ME, checkpoint_owner="v", lease_counter=3)
        taker._watch_incoming(key)
    table.gets.clear()
    for _ in range(3):
        asyncio.run(taker._look_at_incoming())
    assert len(table.gets) == 3 * MAX_LOOKS
    assert len(set(table.gets)) == 3 * MAX_LOOKS  # in turn: none read twice before the rest
    table.failing = True
    asyncio.run(taker._look_at_incoming())  # every read fails: kept, and tried again
    assert len(taker._incoming) == 100
    clock.advance(w.cfg.handoff_timeout + w.timing.lease_duration + 1)
    table.gets.clear()
    asyncio.run(taker._look_at_incoming())  # their time is up: left to the rounds, unread
    assert taker._incoming == {} and table.gets == []


def test_too_many_leases_due_at_once_end_the_wait_without_reading_them() -> None:
    table, w, taker = watching([f"s{i}" for i in range(MAX_LOOKS + 1)])
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    wait(taker, 3_600.0)  # the round's one scan reads them all
    assert table.gets == []


def test_a_failing_read_does_not_end_every_wait() -> None:
    """A look that fails leaves the lease to the next scan: one read, then the wait runs its
    course instead of ending (and reading) again every few milliseconds."""
    table, w, taker = watching(["s"])
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    table.failing = True
    wait(taker, 0.3)
    wait(taker, 0.3)
    assert table.gets == ["s"]
    assert taker._observer.next_check(ME) is None


def test_a_suspended_worker_reads_nothing_while_it_waits() -> None:
    table, w, taker = watching(["s"])
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    w.run_state.suspend()
    wait(taker, 0.3)
    assert table.gets == []


def test_too_many_due_are_left_to_the_scan_and_not_looked_at_again() -> None:
    table, w, taker = watching([f"s{i}" for i in range(MAX_LOOKS + 1)])
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    wait(taker, 3_600.0)
    assert taker._observer.next_check(ME) is None  # a scan that fails cannot make this spin
    wait(taker, 0.3)
    assert table.gets == []


def test_a_lease_being_handed_to_us_is_watched_for_its_old_owners_expiry() -> None:
    """Mid-handoff to us, the old owner still processes the lease: if it dies, the lease
    expires like any other, and we look at it then (and never at a lease we still process
    ourselves while handing it to another)."""
    clock = ManualClock()
    table = CountingTable(clock)
    theirs = table.take_lease(put(table, "to-us"), "old")
    mine = table.take_lease(put(table, "from-us"), ME)
    assert theirs is not None and mine is not None
    leases = [table.initiate_handoff(theirs, ME), table.initiate_handoff(mine, "thief")]
    w = worker(table, Consumers(), clock)
    taker = Taker(w, io)
    taker._observer.observe(leases, clock.monotonic(), clock.wall())  # type: ignore[arg-type]
    clock.advance(w.timing.lease_duration + w.timing.max_clock_skew + 0.01)
    assert taker._observer.due(clock.monotonic(), ME) == ["to-us"]


def test_a_taken_tenure_counts_from_before_the_take() -> None:
    """A take answered 3 s late: the holder's clock for the tenure starts before the write (other
    workers date the lease from the write's stamp), so it cannot outlast their judgement."""
    clock = ManualClock()
    table = CountingTable(clock)
    free = put(table, "s")
    table.take_takes = 3.0
    w = worker(table, Consumers(), clock)
    before = clock.monotonic()
    asyncio.run(Taker(w, io).take(free, how="took"))
    held = w.holder.get_if_held("s")
    assert held is not None and held.last_counter_change == before
    assert clock.monotonic() == before + 3.0


def test_a_stopping_worker_hands_its_leases_to_a_worker_that_joined_since_its_last_round() -> None:
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    assert table.take_lease(put(table, "theirs"), "newcomer") is not None
    status(table, "newcomer", clock.wall())  # a kclpy-spark worker: it publishes its status
    w = worker(table, Consumers(), clock)
    assert mine is not None
    w.holder.add_taken(mine)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True)
    taker = Taker(w, io)  # no round yet: the last view knows no other worker
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease("mine")
    assert handed is not None and handed.lease_owner == "newcomer"
    assert handed.checkpoint_owner == ME


def stopping(table: CountingTable, clock: ManualClock, mine: Lease) -> tuple[Any, Taker]:
    """A worker holding ``mine``, with graceful handoffs, and its taker."""
    w = worker(table, Consumers(), clock)
    w.holder.add_taken(mine)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True)
    return w, Taker(w, io)


def handed_to(table: CountingTable, clock: ManualClock, mine: Lease) -> str | None:
    """Whom a stopping worker holding ``mine`` hands it to (one handoff begun)."""
    _, taker = stopping(table, clock, mine)
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease(mine.lease_key)
    assert handed is not None
    return handed.lease_owner


def tick(w: Any, clock: ManualClock, seconds: int) -> None:
    """``seconds`` pass, our holder renewing what it holds as they do."""
    for _ in range(seconds):
        clock.advance(1.0)
        w.holder.renew_all()


@pytest.mark.parametrize("runs_again", [False, True])
def test_a_stopping_worker_hands_nothing_to_a_worker_it_saw_stop_renewing(runs_again: bool) -> None:
    """A worker killed a moment ago keeps a fresh status record for two lease durations after
    its leases expired and moved on: it holds the fewest leases, yet gets none of ours (each
    would wait a lease duration more), unless its status is written again (it runs again)."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    theirs = table.take_lease(put(table, "theirs"), "killed")
    live = table.take_lease(put(table, "live"), "peer")
    assert mine is not None and theirs is not None and live is not None
    status(table, "killed", clock.wall())
    w, taker = stopping(table, clock, mine)
    for wait in (11, 0):  # a round, then one 11 s later: "killed" renewed nothing since
        status(table, "peer", clock.wall())
        live = table.renew_lease(live)
        assert live is not None and asyncio.run(taker.scan()) is not None
        tick(w, clock, wait)
    taken = table.take_lease(table.get_lease("theirs"), "peer")  # its lease moved on
    assert taken is not None
    status(table, "peer", clock.wall())
    if runs_again:
        status(table, "killed", clock.wall())
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease("mine")
    assert handed is not None and handed.lease_owner == ("killed" if runs_again else "peer")


def test_a_stopping_worker_hands_nothing_to_a_worker_with_a_lease_expired_in_its_scan() -> None:
    """Killed between two renewals: one of its leases shows expired, the other not yet; it still
    holds fewer leases than the live peer, yet gets none of ours."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    live = [table.take_lease(put(table, f"live{i}"), "peer") for i in range(2)]
    first = table.take_lease(put(table, "first"), "killed")
    assert mine is not None and first is not None and None not in live
    status(table, "killed", clock.wall())
    w, taker = stopping(table, clock, mine)
    assert asyncio.run(taker.scan()) is not None
    tick(w, clock, 6)
    assert table.take_lease(put(table, "second"), "killed") is not None  # then it was killed
    tick(w, clock, 5)
    for i in range(2):
        lease = table.get_lease(f"live{i}")
        assert lease is not None and table.renew_lease(lease) is not None
    status(table, "peer", clock.wall())
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease("mine")
    assert handed is not None and handed.lease_owner == "peer"


def test_a_stopping_worker_hands_nothing_to_a_kcl_worker_it_releases_for_it() -> None:
    """A live owner without a status record is a KCL worker (kcl-rs took a handed lease only
    after it expired on its own taker's clock, ~40 s): the lease is left to the release."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    put(table, "theirs", lease_owner="kcl-worker")  # written as a KCL worker writes: no stamp
    w = worker(table, Consumers(), clock)
    assert mine is not None
    w.holder.add_taken(mine)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True)
    assert asyncio.run(Taker(w, io).hand_out()) == 0
    kept = table.get_lease("mine")
    assert kept is not None and kept.lease_owner == ME and kept.checkpoint_owner is None


def test_a_stopping_worker_hands_nothing_to_another_stopping_worker() -> None:
    """Two workers stopped together: the first handed its lease to the other, whose take loop
    had ended, and the lease waited out a failover time."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    assert mine is not None and table.take_lease(put(table, "other"), "b") is not None
    for i in range(3):
        assert table.take_lease(put(table, f"p{i}"), "c") is not None
    status(table, "b", clock.wall(), stopping=True)
    status(table, "c", clock.wall())
    assert handed_to(table, clock, mine) == "c"


def test_a_stopping_worker_hands_nothing_to_a_worker_killed_a_moment_ago_with_no_leases() -> None:
    """A leader assigning: the stopping worker keeps no suspects, and a worker killed 15 s ago,
    whose leases the leader had moved on, still had a record saying it runs (live_for): it got
    the lease, which waited out a failover time. One holding none writes every round."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    assert mine is not None and table.take_lease(put(table, "dead-lease"), "killed") is not None
    status(table, "killed", clock.wall(), live_for=41.0)  # quiet: it held a lease, then died
    clock.advance(15.0)
    moved = table.get_lease("dead-lease")
    assert moved is not None and table.take_lease(moved, "peer") is not None
    for i in range(2):
        assert table.take_lease(put(table, f"p{i}"), "peer") is not None
    status(table, "peer", clock.wall())
    assert handed_to(table, clock, mine) == "peer"


@pytest.mark.parametrize("consumer_stops", [False, True])
def test_a_stopping_worker_hands_a_lease_only_to_a_worker_that_consumes_its_stream(
    consumer_stops: bool,
) -> None:
    """The idlest peer does not consume the lease's stream (a deploy adding it): it would not
    take the lease, which waited out a failover time unread. With no other peer, released."""
    orders, clicks = "111122223333:orders:1700000000", "111122223333:clicks:1700000001"
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, f"{clicks}:shardId-000000000000"), ME)
    assert mine is not None
    for i in range(3):
        assert table.take_lease(put(table, f"{orders}:shardId-{i:012d}"), "both") is not None
    status(table, "both", clock.wall(), streams=[orders, clicks], stopping=consumer_stops)
    status(table, "orders-only", clock.wall(), streams=[orders])
    _, taker = stopping(table, clock, mine)
    assert asyncio.run(taker.hand_out()) == (0 if consumer_stops else 1)
    handed = table.get_lease(mine.lease_key)
    assert handed is not None and handed.lease_owner == (ME if consumer_stops else "both")


def test_a_stopping_worker_hands_nothing_past_the_max_leases_for_worker() -> None:
    clock = ManualClock()
    table = CountingTable(clock)
    mine = [table.take_lease(put(table, f"mine{i}"), ME) for i in range(2)]
    for i in range(2):
        assert table.take_lease(put(table, f"c{i}"), "c") is not None
    status(table, "c", clock.wall())
    w = worker(table, Consumers(), clock)
    for lease in mine:
        assert lease is not None
        w.holder.add_taken(lease)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True,
                         max_leases_for_worker=3)  # fmt: skip
    assert asyncio.run(Taker(w, io).hand_out()) == 1  # c takes one more, then is full
    owners = sorted(str(x.lease_owner) for x in table.list_leases() if x.lease_key[:4] == "mine")
    assert owners == ["c", ME]


def test_handing_out_stops_at_a_quarter_of_the_grace_when_the_table_is_slow() -> None:
    """One hand-off after another, each allowed the store's whole call budget: a slow table
    stretched the stop well past shutdown_grace (six leases at 1 s a call: 8 s against 2 s)."""
    clock = ManualClock()

    class Slow(CountingTable):
        def initiate_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
            clock.advance(1.0)  # a slow write
            return super().initiate_handoff(lease, new_owner)

    table = Slow(clock)
    for i in range(6):
        taken = table.take_lease(put(table, f"mine{i}"), ME)
        assert taken is not None
    status(table, "c", clock.wall())
    w = worker(table, Consumers(), clock)
    for lease in table.list_leases():
        w.holder.add_taken(lease)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True, shutdown_grace=4.0)
    assert asyncio.run(Taker(w, io).hand_out()) == 2  # 1 s each, a quarter of 4 s: then released


def test_a_failing_scan_before_handing_out_falls_back_on_the_last_rounds_view() -> None:
    class NoScan(CountingTable):
        def scan_table(self, record_prefix: str) -> TableScan:
            raise RuntimeError("a bug, or the table gone")

    clock = ManualClock()
    table = NoScan(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    assert mine is not None
    w = worker(table, Consumers(), clock)
    w.holder.add_taken(mine)
    taker = Taker(w, io)
    taker._live = {"peer": 1}  # what the last round saw
    taker.running = {"peer": clock.wall()}
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease("mine")
    assert handed is not None and handed.lease_owner == "peer"


def status(table: MemoryLeaseTable, worker_id: str, updated_at: float, **data: Any) -> None:
    """Publish (or publish again) ``worker_id``'s status record."""
    key = coordination.worker_key(worker_id)
    before = table.get_record(key)
    version = None if before is None else before.version
    record = CoordinationRecord(
        key,
        worker_id,
        (version or 0) + 1,
        updated_at,
        json.dumps({"updated_at": updated_at, **data}),
    )
    assert table.put_record(record, version)


def lease_election(cfg: WorkerConfig, table: MemoryLeaseTable, clock: ManualClock) -> Any:
    return leader_election(cfg, table, lease_timing(cfg), clock)


def test_a_worker_whose_clock_runs_ahead_past_the_allowance_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Expiry dates writes by their stamps: two clocks apart by more than max_clock_skew moved
    leases early (records twice) or late, with nothing said. A status record stamped in our
    future says so, once per worker every CLOCK_WARNING_EVERY seconds."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    put(table, "s00")
    now = clock.wall()
    status(table, "ahead", now + 8.0)
    status(table, "in-time", now + 1.2)  # within the 1 s allowed and a margin
    status(table, ME, now + 8.0)  # our own, written before our clock stepped back
    w = worker(table, Consumers(), clock)
    w.streams = SimpleNamespace(context_of=lambda lease: object())
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    taker = Taker(w, io)
    with caplog.at_level(logging.WARNING, logger="kclpy_spark.moves.taking"):
        asyncio.run(taker.scan())
        asyncio.run(taker.scan())
        told = [r.getMessage() for r in caplog.records if "clock runs" in r.getMessage()]
        assert len(told) == 1 and "worker ahead's clock runs at least 8.0 s ahead" in told[0]
        clock.advance(CLOCK_WARNING_EVERY)
        status(table, "ahead", clock.wall() + 8.0)
        asyncio.run(taker.scan())
    assert len([r for r in caplog.records if "clock runs" in r.getMessage()]) == 2


def test_a_round_counts_the_workers_whose_status_says_they_run() -> None:
    """A fresh table: the first round takes our share only, not every lease, when the others'
    status records say they run; a stale, stopping or stopped record counts for nothing."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(12):
        put(table, f"s{i:02d}")
    now = clock.wall()
    status(table, "peer", now - 1.0)
    status(table, "another", now - 5.0)
    status(table, "stale", now - 60.0)
    status(table, "leaving", now, stopping=True)
    status(table, "gone", now, stopped=True)
    w = worker(table, Consumers(), clock)
    w.streams = SimpleNamespace(context_of=lambda lease: object())
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    asyncio.run(Taker(w, io).round())
    assert len(w.consumers) == 4  # a third: "peer", "another" and us


def test_a_round_hands_the_scans_coordination_records_to_the_leader_and_suspend_flag() -> None:
    """The Scan reads every record anyway: the leader election and the suspend flag take theirs
    from it (dated when it returned: a record it shows may have been written at its end)
    instead of reading them again."""
    clock = ManualClock()

    class SlowScan(MemoryLeaseTable):
        def scan_table(self, record_prefix: str) -> Any:
            scan = super().scan_table(record_prefix)
            clock.advance(2.0)
            return scan

    table = SlowScan(clock)
    put(table, "s00")
    status(table, "peer", clock.wall())
    coordination.set_suspended(table, False, by="op", now_wall=clock.wall())
    w = worker(table, Consumers(), clock)
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    asyncio.run(Taker(w, io).round())
    keys = (coordination.SUSPEND_KEY, coordination.worker_key("peer"))
    assert w.leader.seen == w.suspend_flag.seen == [(tuple(sorted(keys)), clock.monotonic())]


@pytest.mark.parametrize("leading", [True, False])
def test_the_leaders_scan_deletes_the_records_of_workers_gone_for_an_hour(leading: bool) -> None:
    """Every start of a worker without a worker_id writes a new record: they piled up for ever
    and each take round's Scan read them all. The leader deletes them, every few minutes."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    put(table, "s00")
    now = clock.wall()
    status(table, "crashed", now - coordination.GONE_WORKER_AFTER - 10)
    status(table, "peer", now - 1.0)
    w = worker(table, Consumers(), clock)
    w.leader.is_leader = leading
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    taker = Taker(w, io)
    asyncio.run(taker.round())
    gone = table.get_record(coordination.worker_key("crashed")) is None
    assert gone is leading and table.get_record(coordination.worker_key("peer")) is not None
    status(table, "crashed-too", clock.wall() - coordination.GONE_WORKER_AFTER - 10)
    clock.advance(60.0)
    asyncio.run(taker.round())  # a minute later: not yet
    assert table.get_record(coordination.worker_key("crashed-too")) is not None
    clock.advance(PRUNE_EVERY)

    def refused(key: str, version: int) -> bool:
        raise DependencyError("the table did not answer")

    table.delete_record = refused  # type: ignore[method-assign]
    asyncio.run(taker.round())  # a failed prune costs the round nothing
    table.delete_record = MemoryLeaseTable.delete_record.__get__(table)  # type: ignore[method-assign]
    clock.advance(PRUNE_EVERY)
    asyncio.run(taker.round())
    assert (table.get_record(coordination.worker_key("crashed-too")) is None) is leading


def test_a_stopping_worker_says_so_before_handing_out(monkeypatch: Any) -> None:
    from kclpy_spark.moves import stopping

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    w.status_writer = coordination.StatusWriter(table, ME)
    monkeypatch.setattr(stopping, "status_payload", lambda worker, now: {"leases": {}})
    asyncio.run(stopping.announce_stopping(w, io))
    assert coordination.worker_status(table, ME)["stopping"] is True
    w.status_writer.publish({"leases": {}}, w.clock.wall())  # a control round's late publish
    assert coordination.worker_status(table, ME)["stopping"] is True
    assert (
        coordination.live_workers(table.scan_table("worker/").records, w.clock.wall(), 60.0) == {}
    )


@pytest.mark.parametrize(("assignment", "resigns"), [("worker", False), ("leader", True),
                                                     ("auto", True)])  # fmt: skip
def test_a_stopping_leader_that_may_assign_resigns_before_handing_out(
    monkeypatch: Any, assignment: str, resigns: bool
) -> None:
    """So the next leader decides (and assigns) now, not a failover time later; in "auto" also
    when it had only decided to assign, its record not saying so yet."""
    from kclpy_spark.moves import stopping

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, lease_assignment=assignment)
    w.status_writer = coordination.StatusWriter(table, ME)
    w.leader = lease_election(w.cfg, table, w.clock)
    assert w.leader.tick()
    w.leader.set_assigns(True)
    monkeypatch.setattr(stopping, "status_payload", lambda worker, now: {"leases": {}})
    asyncio.run(stopping.announce_stopping(w, io))
    record = table.get_record(LEADER_KEY)
    assert record is not None and (record.owner is None) is resigns


@pytest.mark.parametrize(
    ("figures", "metric", "steals"),
    [
        ({}, "auto", True),  # no CPU published (an older version): the bytes decide
        ({"peer": (50.0, True), ME: (48.0, True)}, "auto", False),  # CPU even: nothing moves
        ({"peer": (90.0, True), ME: (20.0, False)}, "auto", False),  # ours predates a change
        ({"peer": (50.0, True), ME: (48.0, True)}, "throughput", True),  # CPU not used
    ],
)
def test_a_round_balances_by_the_cpu_the_status_records_publish(
    figures: dict[str, tuple[float, bool]], metric: str, steals: bool
) -> None:
    """By bytes 'peer' (three leases of 10 KB/s) carries far more than we do (one of 1 KB/s);
    when every worker publishes its CPU and the fleet is busy, the CPU decides instead."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(3):
        put(table, f"p{i}", lease_owner="peer", throughput_kbps=10.0)
    put(table, "m0", lease_owner=ME, throughput_kbps=1.0)
    now = clock.wall()
    for who in ("peer", ME):
        cpu = figures.get(who)
        extra = {} if cpu is None else {"cpu_percent": cpu[0], "cpu_settled": cpu[1]}
        status(table, who, now - 1.0, **extra)
    consumers = Consumers()
    consumers["m0"] = object()
    w = worker(table, consumers, clock)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, load_metric=metric)
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    asyncio.run(Taker(w, io).round())
    moved = [
        x.lease_key for x in table.list_leases() if x.lease_owner == ME and x.lease_key != "m0"
    ]
    assert bool(moved) is steals, moved


def test_load_metric_is_checked() -> None:
    from checkpoint.base.errors import ConfigError
    from kclpy_spark.config import from_mapping

    cfg = from_mapping({"stream_name": "s", "load_metric": "throughput"})
    assert cfg.load_metric == "throughput"
    with pytest.raises(ConfigError, match="'load_metric' must be one of 'auto', 'throughput'"):
        from_mapping({"stream_name": "s", "load_metric": "cpu"})


@pytest.mark.parametrize(
    ("publishes", "stamped", "checkpoint_owner"),
    [(True, False, "peer"), (False, True, "peer"), (False, False, None)],
)
def test_a_steal_asks_a_graceful_handoff_only_of_a_kclpy_spark_worker(
    publishes: bool, stamped: bool, checkpoint_owner: str | None
) -> None:
    """A KCL worker (no status record, no stamp of ours on its leases) treats a hand-off request
    as a lost lease (kcl-rs: records it read meanwhile come twice): its leases are stolen the KCL
    2.x way instead; a kclpy-spark worker is asked, known by either sign."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(4):
        put(table, f"p{i}", lease_owner="peer")
    if publishes:  # a status record
        status(table, "peer", clock.wall() - 1.0)
    if stamped:  # an older kclpy-spark (records elsewhere) or a stale status: our stamp shows
        for lease in table.list_leases():
            table.renew_lease(lease)
    w = worker(table, Consumers(), clock)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True)
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    asyncio.run(Taker(w, io).round())  # first seen: live (the peer's writes are unstamped)
    moved = [x for x in table.list_leases() if x.lease_owner == ME]
    assert moved and all(x.checkpoint_owner == checkpoint_owner for x in moved), moved


class WithKclWorkers(CountingTable):
    """A lease table whose scans also show KCL 3.x workers' metrics entities (as DynamoDB's do)."""

    def __init__(
        self, clock: ManualClock, sightings: dict[str, float], version: str | None = None
    ) -> None:
        super().__init__(clock)
        self.sightings = sightings  # worker id -> lut
        self.version = version  # the fleet's Migration3.0 client version

    def scan_table(self, record_prefix: str) -> TableScan:
        scan = super().scan_table(record_prefix)
        seen = tuple(KclWorkerSighting(k, v) for k, v in self.sightings.items())
        return replace(scan, kcl_workers=seen, kcl_client_version=self.version)


def round_worker(table: MemoryLeaseTable, clock: ManualClock) -> Any:
    w = worker(table, Consumers(), clock)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, graceful_handoff=True)
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    return w


@pytest.mark.parametrize(("age", "handed"), [(1.0, 1), (59.0, 1), (61.0, 0)])
def test_a_stopping_worker_hands_its_leases_to_a_kcl3_worker_its_metrics_entity_shows(
    age: float, handed: int
) -> None:
    """A KCL 3.x worker follows hand-offs (it leaves a lease whose checkpointOwner is set and
    discovers it once the old owner completed the hand-off): known by a metrics entity written
    within 60 s (its leader's rule), it gets our leases though it holds none; a stale entity (a
    stopped worker's stays a day) counts for nothing, and the lease is left to the release."""
    clock = ManualClock()
    table = WithKclWorkers(clock, {"kcl3-worker": clock.wall() - age})
    mine = table.take_lease(put(table, "mine"), ME)
    assert mine is not None
    w = round_worker(table, clock)
    w.holder.add_taken(mine)
    assert asyncio.run(Taker(w, io).hand_out()) == handed
    stored = table.get_lease("mine")
    assert stored is not None
    if handed:
        assert (stored.lease_owner, stored.checkpoint_owner) == ("kcl3-worker", ME)
    else:
        assert (stored.lease_owner, stored.checkpoint_owner) == (ME, None)


@pytest.mark.parametrize(
    ("version", "handed"),
    [
        (None, 1),
        ("CLIENT_VERSION_3X", 1),
        ("CLIENT_VERSION_3X_WITH_ROLLBACK", 1),
        ("CLIENT_VERSION_UPGRADE_FROM_2X", 0),
        ("CLIENT_VERSION_2X", 0),
    ],
)
def test_kcl3_workers_of_a_fleet_still_migrating_from_2x_are_not_handed_leases(
    version: str | None, handed: int
) -> None:
    """In CLIENT_VERSION_UPGRADE_FROM_2X (or 2X) a KCL 3.x worker runs as a 2.x one: it writes
    its metrics but never looks for a lease handed or assigned to it. Handed one anyway, the
    lease sat idle until it expired; now it is released, as to any KCL 2.x worker."""
    clock = ManualClock()
    table = WithKclWorkers(clock, {"kcl3-worker": clock.wall() - 1.0}, version)
    mine = table.take_lease(put(table, "mine"), ME)
    assert mine is not None
    w = round_worker(table, clock)
    w.holder.add_taken(mine)
    assert asyncio.run(Taker(w, io).hand_out()) == handed
    stored = table.get_lease("mine")
    assert stored is not None
    assert stored.lease_owner == ("kcl3-worker" if handed else ME)


def test_a_round_counts_kcl3_workers_and_asks_them_for_hand_offs() -> None:
    """KCL 3.x workers known by their metrics entities count in our share like workers with a
    status record (fresh ones only), and a steal from one is a graceful hand-off request."""
    clock = ManualClock()
    now = clock.wall()
    sightings = {"kcl3-a": now - 5.0, "kcl3-idle": now - 5.0, "kcl3-gone": now - 61.0}
    table = WithKclWorkers(clock, sightings)
    for i in range(9):
        put(table, f"s{i}")
    w = round_worker(table, clock)
    asyncio.run(Taker(w, io).round())
    assert len(w.consumers) == 3  # a third: kcl3-a, kcl3-idle and us

    table = WithKclWorkers(clock, sightings)
    for i in range(4):
        put(table, f"s{i}", lease_owner="kcl3-a")
    w = round_worker(table, clock)
    asyncio.run(Taker(w, io).round())  # first seen: live
    asked = [x for x in table.list_leases() if x.lease_owner == ME]
    assert len(asked) == 1 and asked[0].checkpoint_owner == "kcl3-a"  # asked, not taken
    assert not w.consumers


@pytest.mark.parametrize("follows", [False, True])
def test_steal_from_kcl_workers_off_leaves_only_the_workers_that_do_not_follow_hand_offs(
    follows: bool,
) -> None:
    """``steal_from_kcl_workers = false`` (moving a fleet over with nothing twice): no steal from
    a KCL 2.x worker or kcl-rs; a worker that follows hand-offs is still asked, and a free lease
    is still taken."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(4):
        put(table, f"p{i}", lease_owner="peer")
    put(table, "free")
    if follows:
        status(table, "peer", clock.wall() - 1.0)
    w = round_worker(table, clock)
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, steal_from_kcl_workers=False)
    taker = Taker(w, io)
    asyncio.run(taker.round())  # a free lease first (the KCL steals only when none is free)
    asyncio.run(taker.round())  # then a steal, or none
    assert set(w.consumers) == {"free"}
    asked = [x for x in table.list_leases() if x.lease_owner == ME and x.lease_key != "free"]
    assert [x.checkpoint_owner for x in asked] == (["peer"] if follows else [])


@pytest.mark.parametrize(("stamped", "renew_cadence"), [(True, False), (False, True)])
def test_rounds_come_every_renewal_interval_beside_a_worker_whose_writes_carry_no_stamp(
    stamped: bool, renew_cadence: bool
) -> None:
    """A KCL worker's renewals carry no write stamp: the observer dates them by the scan that
    sees them, so scans come as often as renewals while one holds leases (a dead one's leases
    then move about a failover time after its last renewal, not up to a take interval more)."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(2):
        put(table, f"p{i}", lease_owner="peer")
    if stamped:  # a kclpy-spark peer: our stores stamp its writes
        for lease in table.list_leases():
            table.renew_lease(lease)
    w = round_worker(table, clock)
    taker = Taker(w, io)
    assert taker.interval() == w.timing.take_interval  # nobody seen yet
    asyncio.run(taker.round())
    expected = w.timing.renew_interval if renew_cadence else w.timing.take_interval
    assert taker.interval() == expected
    assert w.timing.renew_interval < w.timing.take_interval


@pytest.mark.parametrize("runs_again", [False, True])
def test_a_worker_seen_to_stop_renewing_is_not_counted_in_the_share(runs_again: bool) -> None:
    """Its leases moved on and its status record is still fresh: the never-renewed leases are
    shared without it (all 10 are ours, not half: "peer" holds more than we do), until its
    status is written again."""
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(1, 11):
        put(table, f"s{i:02d}")
    theirs = table.take_lease(put(table, "s00"), "peer")
    assert theirs is not None and table.take_lease(put(table, "k"), "killed") is not None
    status(table, "killed", clock.wall())
    w = round_worker(table, clock)
    w.streams = SimpleNamespace(context_of=lambda lease: object())
    w.cfg = WorkerConfig(stream_name="s", worker_id=ME, lease_assignment="worker")
    taker = Taker(w, io)
    for wait in (11.0, 0.0):  # "killed" renews nothing; "peer" writes its status
        status(table, "peer", clock.wall())
        theirs = table.renew_lease(theirs)
        assert theirs is not None and asyncio.run(taker.scan()) is not None
        clock.advance(wait)
    taken = table.take_lease(table.get_lease("k"), "peer")
    assert taken is not None
    if runs_again:
        status(table, "killed", clock.wall())
    asyncio.run(taker.round())
    assert len(w.consumers) == (5 if runs_again else 10)


def test_a_handoff_to_a_worker_that_is_stopping_too_is_taken_back_at_release() -> None:
    """Handed to a worker whose status said it ran when we chose it, and which began to stop
    before our release: completing the handoff gave it a lease its ended take loop would never
    take, and nobody read the shard until the lease expired (22 s at the defaults)."""
    from kclpy_spark.moves.stopping import release_all

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    pairs = (("to-stopping", "b"), ("to-running", "c"), ("to-kcl", "java"), ("to-suspended", "d"))
    for key, target in pairs:
        taken = table.take_lease(put(table, key), ME)
        assert taken is not None
        held = w.holder.add_taken(taken)
        begin = functools.partial(lambda x, t: table.initiate_handoff(x, t), t=target)
        assert w.holder.update(key, held.token, begin).won
    status(table, "b", w.clock.wall(), stopping=True)
    status(table, "c", w.clock.wall())  # "java": a KCL 3.x worker writes no record of ours
    status(table, "d", w.clock.wall(), suspended=True)
    asyncio.run(release_all(w, io, resign=False))
    owners = {x.lease_key: (x.lease_owner, x.checkpoint_owner) for x in table.list_leases()}
    assert owners == {"to-stopping": (None, None), "to-running": ("c", None),
                      "to-kcl": ("java", None), "to-suspended": (None, None)}  # fmt: skip
    assert not w.holder.held()
    # Taken back, the lease never left us: no owner switch counted (ownerSwitchesSinceCheckpoint).
    switches = {x.lease_key: x.owner_switches_since_checkpoint for x in table.list_leases()}
    assert switches["to-stopping"] == switches["to-suspended"] == 0


@pytest.mark.parametrize(("left", "waited"), [(20.0, 6.5), (4.0, 2.0), (-3.0, 0.0)])
def test_a_stop_lets_new_owners_see_for_at_most_half_the_grace_left(
    left: float, waited: float
) -> None:
    """It waited a share of the configured grace whatever the stop's slow writes had spent of
    it, and the processors then got none (cancelled without their shutdown checkpoint)."""
    from kclpy_spark.moves.stopping import let_new_owners_see

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    w = SimpleNamespace(
        timing=SimpleNamespace(take_interval=5.5),
        cfg=SimpleNamespace(worker_id="w", shutdown_grace=20.0),
        sleep=sleep,
    )
    assert asyncio.run(let_new_owners_see(w, left)) == waited  # type: ignore[arg-type]
    assert slept == [waited]


def test_a_stopping_worker_gives_back_the_leases_ours_that_it_never_took() -> None:
    """Assigned to us by the leader (or handed to us) after our last look, and then we stop:
    nobody read them until they counted as expired, twice the failover time for a lease just
    moved. A lease still mid-handoff to us is its old owner's to settle."""
    from kclpy_spark.moves.stopping import release_all

    table = MemoryLeaseTable()
    w = worker(table, Consumers())
    held = w.holder.add_taken(table.take_lease(put(table, "held"), ME))  # type: ignore[arg-type]
    assert held is not None
    table.take_lease(put(table, "assigned"), ME)  # the leader's write: ours, never taken here
    peer = table.take_lease(put(table, "handing"), "peer")
    assert peer is not None and table.initiate_handoff(peer, ME) is not None
    table.take_lease(put(table, "theirs"), "peer")
    asyncio.run(release_all(w, io, resign=False))
    owners = {x.lease_key: (x.lease_owner, x.checkpoint_owner) for x in table.list_leases()}
    assert owners == {"held": (None, None), "assigned": (None, None),
                      "handing": (ME, "peer"), "theirs": ("peer", None)}  # fmt: skip


def test_a_worker_just_resumed_takes_its_share_once_the_others_say_they_run_again() -> None:
    """Worker mode: the first to resume scanned while the others' status still said suspended,
    counted itself alone and took every released lease (then gave them back one a round)."""
    table = MemoryLeaseTable()
    for i in range(9):
        put(table, f"s{i}")
    w = worker(table, Consumers())
    for other in ("b", "c"):
        status(table, other, w.clock.wall(), suspended=True)
    w.run_state.suspend()
    w.run_state.resume()
    taker = Taker(w, io)
    asyncio.run(taker.round())
    assert all(x.lease_owner is None for x in table.list_leases())  # the others still suspended
    w.clock.advance(w.timing.lease_duration + w.timing.max_clock_skew)
    for other in ("b", "c"):
        status(table, other, w.clock.wall())  # their control rounds: running again
    asyncio.run(taker.round())
    assert [x.lease_owner for x in table.list_leases()].count(ME) == 3


def test_a_take_tells_health_whether_its_write_answered() -> None:
    """Readiness counts failing writes (scans answering kept a worker whose writes were all
    denied ready): a take's write is one."""
    table = MemoryLeaseTable()
    put(table, "s0")
    w = worker(table, Consumers())
    told: list[tuple[int, list[Any]]] = []
    w.health = SimpleNamespace(
        store_ok=lambda **_: None, writes=lambda n, failed: told.append((n, failed)),
        all_parked=False,
    )  # fmt: skip
    denied = DependencyError("AccessDenied: UpdateItem")

    def refuse(lease: Lease, owner: str) -> Lease | None:
        raise denied

    table.take_lease = refuse  # type: ignore[method-assign]
    with pytest.raises(DependencyError):
        asyncio.run(Taker(w, io).round())
    assert told == [(0, [denied])]
    del table.take_lease  # the real one again
    asyncio.run(Taker(w, io).round())
    assert told[-1] == (1, [])


def test_a_stopping_worker_hands_nothing_to_a_worker_whose_leases_went_unrenewed_lately() -> None:
    """Killed 9 s ago, its lease not yet expired and its status record fresh, "killed" holds the
    fewest leases; a lease handed to it waited for its own expiry again. A KCL worker's are
    never judged so (test_assign_rule.py)."""
    clock = ManualClock()
    table = CountingTable(clock)
    mine = table.take_lease(put(table, "mine"), ME)
    theirs = table.take_lease(put(table, "theirs"), "killed")
    peers = [table.take_lease(put(table, f"peer{i}"), "peer") for i in range(2)]
    assert mine is not None and theirs is not None and all(peers)
    w, taker = stopping(table, clock, mine)
    for wait in (9, 0):  # a round, then one 9 s later: "killed" renewed nothing since
        for worker_id in ("killed", "peer"):
            status(table, worker_id, clock.wall())
        peers = [table.renew_lease(p) for p in peers if p is not None]
        assert asyncio.run(taker.scan()) is not None
        tick(w, clock, wait)
    assert asyncio.run(taker.hand_out()) == 1
    handed = table.get_lease("mine")
    assert handed is not None and handed.lease_owner == "peer"
