"""Leader assignment at run time (kclpy_spark.moves.assigning), on the memory store with
stand-in workers: the leader assigns, led workers find and take what they were given, and a
leadership that changes (or lapses) mid-assignment never gives one lease two runners."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from types import SimpleNamespace
from typing import Any

import pytest

from checkpoint import coordination
from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import InvalidStateError, ThrottledError
from checkpoint.port import CoordinationRecord
from checkpoint.sequence import SHARD_END
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.moves.assigning import (
    DECLINED_FOR,
    Led,
    leader_assignment_pays,
    leader_election,
    lease_timing,
)
from kclpy_spark.moves.taking import Taker
from tests.unit.moves.test_taking import Consumers, io, put, status, worker


class Leader:
    """A stand-in election: whether we lead, and who else does."""

    def __init__(self, leading: bool, other: str | None = None, assigns: bool = True) -> None:
        self.is_leader, self.other, self.other_assigns = leading, other, assigns

    @property
    def assigning(self) -> bool:  # lease_assignment = "leader": as soon as it leads
        return self.is_leader

    def led_by(self) -> str | None:
        return None if self.is_leader else self.other

    def observe(self, records: Any, returned_at: float) -> None:
        pass


class Reads(MemoryLeaseTable):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.calls: list[str] = []

    def get_lease(self, lease_key: str) -> Any:
        self.calls.append(f"get {lease_key}")
        return super().get_lease(lease_key)

    def scan_table(self, record_prefix: str) -> Any:
        self.calls.append("scan")
        return super().scan_table(record_prefix)

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        self.calls.append("query")
        return super().list_lease_keys_by_owner(owner)


def led_worker(table: MemoryLeaseTable, me: str, leader: Leader, clock: ManualClock) -> Any:
    w = worker(table, Consumers(), clock)
    w.cfg = WorkerConfig(stream_name="s", worker_id=me, lease_assignment="leader")
    w.holder = type(w.holder)(table, me, clock, 10.0)
    w.events = type(w.events)(me, clock.wall)
    w.leader = leader
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    return w


def fleet(n_leases: int, names: list[str]) -> tuple[ManualClock, Reads, dict[str, Taker]]:
    clock = ManualClock()
    table = Reads(clock)
    for i in range(n_leases):
        put(table, f"s{i:02d}")
    for name in names:
        status(table, name, clock.wall())
    takers = {
        name: Taker(led_worker(table, name, Leader(i == 0, names[0]), clock), io)
        for i, name in enumerate(names)
    }
    return clock, table, takers


def run(taker: Taker) -> None:
    asyncio.run(taker.round())


def runners(takers: dict[str, Taker]) -> dict[str, set[str]]:
    return {name: set(t.worker.consumers) for name, t in takers.items()}


def test_the_leader_assigns_a_fair_share_and_the_led_take_theirs_without_scanning() -> None:
    _, table, takers = fleet(9, ["lead", "b", "c"])
    run(takers["lead"])
    owners = [x.lease_owner for x in table.list_leases()]
    assert sorted(owners.count(n) for n in takers) == [3, 3, 3]
    assert len(takers["lead"].worker.consumers) == 3  # its own share taken at once
    table.calls.clear()
    for name in ("b", "c"):
        assert takers[name].interval() == takers[name].worker.timing.renew_interval
        run(takers[name])
    assert "scan" not in table.calls and table.calls.count("query") == 2
    running = runners(takers)
    assert [len(keys) for keys in running.values()] == [3, 3, 3]
    assert set().union(*running.values()) == {x.lease_key for x in table.list_leases()}
    for lease in table.list_leases():  # each taken by its runner's own write
        assert lease.lease_key in running[lease.lease_owner]  # type: ignore[index]
        assert lease.lease_counter == (1 if lease.lease_owner == "lead" else 2)


def test_a_led_worker_reads_only_keys_it_does_not_run_and_declined_ones_rarely() -> None:
    clock, table, takers = fleet(0, ["lead", "b"])
    put(table, "mine", lease_owner="b")
    put(table, "done", lease_owner="b", checkpoint=SHARD_END)
    b = takers["b"]
    run(b)
    assert set(b.worker.consumers) == {"mine"}
    table.calls.clear()
    run(b)
    assert table.calls == ["query"]  # runs "mine"; "done" was declined
    clock.advance(DECLINED_FOR + 1)
    table.calls.clear()
    run(b)
    assert table.calls == ["query", "get done"]


def test_two_leaders_mid_assignment_never_give_a_lease_two_runners() -> None:
    """The old leader's leadership lapsed but its round runs on a scan it made before; the new
    one scans too. Both assign every lease; each write is conditional on the counter seen."""
    _, table, takers = fleet(6, ["old", "new", "b"])
    takers["new"].worker.leader = Leader(True)
    stale = table.scan_table("worker/")  # what the old leader saw before the new one wrote

    class Stale:
        def __getattr__(self, name: str) -> Any:
            return getattr(table, name)

        def scan_table(self, record_prefix: str) -> Any:
            return stale

    run(takers["new"])
    takers["old"].worker.store = Stale()
    run(takers["old"])  # plans on the stale scan; its writes lose: the counters moved
    assert not takers["old"].worker.consumers
    assert sorted(x.lease_owner for x in table.list_leases()).count("old") == 2  # new's share
    for t in takers.values():
        t.worker.leader = Leader(False, "new")
    takers["new"].worker.leader = Leader(True)
    for name in ("old", "b"):
        run(takers[name])
    running = runners(takers)
    everyone = [k for keys in running.values() for k in keys]
    assert sorted(everyone) == sorted(x.lease_key for x in table.list_leases())


def test_a_leader_whose_leadership_lapses_mid_round_stops_writing() -> None:
    _, table, takers = fleet(6, ["lead", "b", "c"])
    lead = takers["lead"]
    real_take = table.take_lease

    def take_then_lapse(lease: Any, owner: str) -> Any:
        lead.worker.leader.is_leader = False  # lapsed during this write
        return real_take(lease, owner)

    table.take_lease = take_then_lapse  # type: ignore[method-assign]
    run(lead)
    assert sum(1 for x in table.list_leases() if x.lease_owner is not None) == 1


def test_a_lease_assigned_to_a_dead_worker_is_assigned_again_after_two_lease_durations() -> None:
    """Not after one: a KCL 3.x worker finds a lease given to it about a failover time later and
    renews it up to a third of one after that (the Java leader waits two failover times too)."""
    clock, table, takers = fleet(4, ["lead", "dead"])
    run(takers["lead"])
    given = {x.lease_key for x in table.list_leases() if x.lease_owner == "dead"}
    assert len(given) == 2
    lead = takers["lead"]
    for step in (6.0, 5.2):  # the leader renews its own; "dead" never took its two
        clock.advance(step)
        lead.worker.holder.renew_all()
    run(lead)  # 11.2 s: K (a KCL 3.x worker) may not have found them yet
    assert {x.lease_key for x in table.list_leases() if x.lease_owner == "dead"} == given
    for step in (6.0, 5.2):
        clock.advance(step)
        lead.worker.holder.renew_all()
    run(lead)  # "dead" never took them: expired, and it is suspect now
    assert {x.lease_owner for x in table.list_leases()} == {"lead"}


def test_the_leader_moves_a_lease_to_a_joiner_by_a_graceful_handoff() -> None:
    clock, table, takers = fleet(4, ["lead", "b"])
    run(takers["lead"])
    run(takers["b"])
    status(table, "joiner", clock.wall())
    clock.advance(1.0)
    for t in takers.values():  # both renew: nothing is free
        t.worker.holder.renew_all()
    run(takers["lead"])
    moving = [x for x in table.list_leases() if x.handoff_pending]
    assert len(moving) == 1 and moving[0].lease_owner == "joiner"
    assert moving[0].checkpoint_owner in {"lead", "b"}


def test_the_leader_gives_a_worker_only_leases_of_the_streams_it_says_it_consumes() -> None:
    """A multi-stream fleet mid-deploy: "b" does not consume the clicks stream yet. It got a
    fair share of every stream's leases, declined the clicks ones, and each waited out its
    expiry unread (then was given to it again while it held the fewest)."""
    orders, clicks = "111122223333:orders:1700000000", "111122223333:clicks:1700000001"
    clock, table, takers = fleet(0, ["lead", "b"])
    for stream in (orders, clicks):
        for i in range(4):
            put(table, f"{stream}:shardId-{i:012d}")
    status(table, "b", clock.wall(), streams=[orders])
    b = takers["b"].worker
    b.streams = SimpleNamespace(context_of=lambda x: object() if x.stream_key == orders else None)
    run(takers["lead"])
    run(takers["b"])
    owned = {x.lease_key: x.lease_owner for x in table.list_leases()}
    assert {k for k, o in owned.items() if o == "b"} == set(b.consumers)  # all of them run
    assert not any(k.startswith(clicks) for k in b.consumers)
    assert b.consumers  # of orders' leases, as b held the fewest


def test_a_leader_just_resumed_waits_for_the_others_to_say_they_run_again() -> None:
    clock, table, takers = fleet(6, ["lead", "b"])
    lead = takers["lead"]
    lead.worker.run_state.suspend()
    lead.worker.run_state.resume()
    run(lead)
    assert all(x.lease_owner is None for x in table.list_leases())
    clock.advance(lead.worker.timing.lease_duration + lead.worker.timing.max_clock_skew)
    run(lead)  # b's status (written at the start) is still fresh
    assert sorted(x.lease_owner for x in table.list_leases()).count("b") == 3


def test_without_the_owner_index_a_led_worker_takes_as_every_worker_does() -> None:
    from checkpoint.base.errors import InvalidStateError

    _, table, takers = fleet(4, ["lead", "b"])
    b = takers["b"]

    def no_index(owner: str) -> list[str]:
        raise InvalidStateError("the table has no index LeaseOwnerToLeaseKeyIndex")

    table.list_lease_keys_by_owner = no_index  # type: ignore[method-assign]
    run(b)  # finds out, and from now on scans
    assert b.led is not None and b.led.role() == "worker"
    run(b)
    assert b.worker.consumers  # took its share by the KCL 2.x rule
    lead = takers["lead"]
    run(lead)  # a new leader checks the index first: it assigns nothing, it takes
    assert lead.led is not None and lead.led.role() == "worker"
    owners = {x.lease_owner for x in table.list_leases()}
    assert owners <= {"lead", "b"} and len(lead.worker.consumers) >= 1


def test_a_key_the_read_shows_owned_by_another_is_read_again_next_time() -> None:
    """The owner index is eventually consistent: a key may still be listed under us after it
    moved. Only leases that are really ours and that we do not take are left alone a while."""
    _, table, takers = fleet(0, ["lead", "b"])
    put(table, "moved", lease_owner="b")
    b = takers["b"]
    real_get = table.get_lease

    def stale_index_read(key: str) -> Any:
        lease = real_get(key)
        return None if lease is None else lease.bumped(lease_owner="other")

    table.get_lease = stale_index_read  # type: ignore[method-assign]
    run(b)
    table.get_lease = real_get  # type: ignore[method-assign]
    run(b)
    assert set(b.worker.consumers) == {"moved"}


def test_under_a_leader_that_does_not_assign_a_worker_takes_for_itself() -> None:
    """A fleet changing lease_assignment: the leader runs "worker"; the others must not wait
    for assignments that never come."""
    _, _, takers = fleet(4, ["lead", "b"])
    b = takers["b"]
    b.worker.leader = Leader(False, "lead", assigns=False)
    assert b.led is not None and b.led.role() == "worker"
    run(b)
    assert b.worker.consumers


def test_what_the_roles_remember_stays_bounded_over_many_rounds() -> None:
    """Weeks of rounds: keys declined by a led worker and leases the leader assigned are
    forgotten after their window; the led worker's observer keeps nothing of its takes."""
    clock, table, takers = fleet(0, ["lead", "b"])
    b, lead = takers["b"], takers["lead"]
    for i in range(200):  # a finished lease of ours every round: declined, then cleaned up
        done = put(table, f"done-{i}", lease_owner="b", checkpoint=SHARD_END)
        run(b)
        assert table.delete_lease(done)
        clock.advance(b.worker.timing.renew_interval)
    assert b.led is not None
    window = int(DECLINED_FOR / b.worker.timing.renew_interval) + 1
    assert len(b.led._declined) <= window
    assert len(b.observer._seen) == 0
    for i in range(100):  # a lease for the dead "b" every round, never taken
        put(table, f"s-{i}", lease_owner=None)
        status(table, f"w{i}", clock.wall())  # a fleet that keeps changing
        run(lead)
        clock.advance(lead.worker.timing.take_interval)
    assert lead.led is not None
    now, window = clock.monotonic(), lead.worker.timing.lease_duration
    keys = {x.lease_key for x in table.list_leases()}
    assert set(lead.led._owners) <= keys  # owners seen: the last scan's leases only
    assert set(lead.led._assigned) <= keys  # only leases alive in the table...
    assert all(now - at < window + lead.worker.timing.take_interval  # ...and recent
               for at in lead.led._assigned.values())  # fmt: skip
    fresh = 2 * window + lead.worker.timing.max_clock_skew
    assert len(lead.running) <= fresh / lead.worker.timing.take_interval + 3  # recent statuses
    for lease in table.list_leases():  # shard ends, cleanup deletes them all
        assert table.delete_lease(lease)
    for _ in range(3):
        clock.advance(window)
        run(lead)
    assert lead.led._assigned == {}


@pytest.mark.parametrize(
    ("store", "assignment", "leases", "workers", "pays"),
    [
        ("dynamodb", "worker", 128, 8, True),  # 11% fewer units, simulated
        ("dynamodb", "worker", 1000, 50, True),
        ("dynamodb", "worker", 127, 8, False),  # too few leases: every worker's Scan is cheap
        ("dynamodb", "worker", 1000, 7, False),  # too few workers: within a few percent
        ("dynamodb", "worker", 16, 50, False),
        ("dynamodb", "leader", 1000, 50, False),  # already
        ("sqlite:leases.db", "worker", 1000, 50, False),  # no capacity units to save
        ("memory", "worker", 1000, 50, False),
    ],
)
def test_leader_assignment_pays_from_128_leases_and_8_workers_on_dynamodb(
    store: str, assignment: str, leases: int, workers: int, pays: bool
) -> None:
    assert leader_assignment_pays(store, assignment, leases, workers) is pays


def _fleet_round(
    store: str, leases: int, peers: int, rounds: int, caught_up: object = None
) -> Taker:
    clock = ManualClock()
    table = MemoryLeaseTable(clock)
    for i in range(leases):
        put(table, f"s{i:03d}")
    for i in range(peers):
        status(table, f"peer{i}", clock.wall())
    w = worker(table, Consumers(), clock)
    w.cfg = WorkerConfig(
        stream_name="s", worker_id="me", lease_store=store, lease_assignment="worker"
    )
    w.caught_up = caught_up
    w.board = SimpleNamespace(on_scan=lambda leases: None)
    w.health = SimpleNamespace(store_ok=lambda **_: None, writes=lambda *_: None, all_parked=False)
    taker = Taker(w, io)
    for _ in range(rounds):
        asyncio.run(taker.round())
    return taker


def test_a_large_fleet_scanning_on_dynamodb_is_told_once_that_leader_assignment_pays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kclpy_spark.moves.assigning")
    _fleet_round("dynamodb", leases=128, peers=7, rounds=3)
    hints = [r.getMessage() for r in caplog.records if "lease_assignment" in r.getMessage()]
    assert len(hints) == 1
    assert "128 open leases and 8 running workers" in hints[0]


def test_a_small_fleet_or_an_embedded_store_gets_no_leader_assignment_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kclpy_spark.moves.assigning")
    _fleet_round("dynamodb", leases=128, peers=6, rounds=2)  # 7 workers
    _fleet_round("dynamodb", leases=127, peers=7, rounds=2)
    _fleet_round("sqlite:leases.db", leases=200, peers=7, rounds=2)  # large, but embedded
    assert not [r for r in caplog.records if "lease_assignment" in r.getMessage()]


def test_a_job_gets_no_leader_assignment_hint(caplog: pytest.LogCaptureFixture) -> None:
    """``--until-caught-up`` takes as every worker does in either mode: nothing to advise."""
    caplog.set_level(logging.INFO, "kclpy_spark.moves.assigning")
    job = SimpleNamespace(remaining=lambda leases: ["s000"], is_ended=lambda key: False)
    _fleet_round("dynamodb", leases=128, peers=7, rounds=1, caught_up=job)
    assert not [r for r in caplog.records if "lease_assignment" in r.getMessage()]


def _auto_fleet(n_leases: int, names: list[str]) -> tuple[ManualClock, Reads, dict[str, Taker]]:
    """lease_assignment = "auto" with the real election, assigning from 6 leases and 3 workers."""
    clock, table, takers = fleet(n_leases, names)
    for name, taker in takers.items():
        w = taker.worker
        w.cfg = WorkerConfig(stream_name="s", worker_id=name, auto_assignment_leases=6,
                             auto_assignment_workers=3)  # fmt: skip
        w.leader = leader_election(w.cfg, table, lease_timing(w.cfg), clock)
        taker.led = Led(taker)
    return clock, table, takers


def test_an_auto_fleet_switches_to_leader_assignment_when_large_and_back_when_small(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "kclpy_spark.moves.assigning")
    clock, table, takers = _auto_fleet(6, ["a", "b", "c"])
    a, b, c = (takers[n] for n in "abc")
    elections = [t.worker.leader for t in (a, b, c)]
    assert [e.tick() for e in elections] == [True, False, False]
    run(a)  # its scan: 6 open leases, 3 running workers; it takes its share as a worker
    assert a.led is not None and a.led.role() == "worker" and not a.worker.leader.assigning
    assert len(a.worker.consumers) == 2
    clock.advance(1.0)
    assert [e.tick() for e in elections] == [True, False, False]  # the record says it now
    assert a.worker.leader.assigning and b.worker.leader.other_assigns
    assert b.interval() == b.worker.timing.renew_interval
    run(a)  # the leader: assigns the four free leases to b and c
    table.calls.clear()
    run(b)
    run(c)
    assert "scan" not in table.calls and table.calls.count("query") == 2  # led: no scan
    assert [len(keys) for keys in runners(takers).values()] == [2, 2, 2]
    # c stops: two running workers are under three quarters of three
    now = clock.wall()
    stopped = {"updated_at": now, "stopping": True}
    record = CoordinationRecord(coordination.worker_key("c"), "c", 2, now, json.dumps(stopped))
    assert table.put_record(record, 1)
    run(a)
    clock.advance(1.0)
    assert [e.tick() for e in elections[:2]] == [True, False]
    assert not a.worker.leader.assigning and not b.worker.leader.other_assigns
    table.calls.clear()
    run(b)  # every worker takes for itself again
    assert table.calls.count("scan") == 1 and "query" not in table.calls
    said = [r.getMessage() for r in caplog.records if 'lease_assignment = "auto"' in r.getMessage()]
    assert len(said) == 2
    assert "6 open leases, 3 running workers: assigning" in said[0]
    assert "2 running workers: every worker takes its own leases again" in said[1]


def test_an_auto_leader_never_assigns_without_the_owner_index() -> None:
    clock, table, takers = _auto_fleet(6, ["a", "b", "c"])
    table.list_lease_keys_by_owner = _no_index  # type: ignore[method-assign]
    a = takers["a"]
    assert a.worker.leader.tick()
    run(a)
    clock.advance(1.0)
    assert a.worker.leader.tick() and not a.worker.leader.assigning


def test_an_auto_leader_whose_owner_index_goes_missing_stops_saying_it_assigns() -> None:
    clock, table, takers = _auto_fleet(6, ["a", "b", "c"])
    a = takers["a"]
    assert a.worker.leader.tick()
    run(a)
    clock.advance(1.0)
    assert a.worker.leader.tick() and a.worker.leader.assigning
    table.list_lease_keys_by_owner = _no_index  # type: ignore[method-assign]
    run(a)  # its first round as the assigning leader finds no index: it scans and takes instead
    clock.advance(1.0)
    assert a.worker.leader.tick() and not a.worker.leader.assigning


def _no_index(owner: str) -> list[str]:
    raise InvalidStateError("the lease table has no LeaseOwnerToLeaseKeyIndex")


def test_a_job_in_auto_mode_never_assigns() -> None:
    clock, _, takers = _auto_fleet(6, ["a", "b", "c"])
    a = takers["a"]
    a.worker.caught_up = SimpleNamespace(remaining=lambda leases: ["s00"], is_ended=lambda k: False)
    assert a.worker.leader.tick()
    run(a)
    clock.advance(1.0)
    assert a.worker.leader.tick() and not a.worker.leader.assigning


@pytest.mark.parametrize("key", ["auto_assignment_leases", "auto_assignment_workers"])
def test_the_auto_thresholds_are_checked(key: str) -> None:
    from checkpoint.base.errors import ConfigError
    from kclpy_spark.config import from_mapping

    assert getattr(from_mapping({"stream_name": "s", key: 3}), key) == 3
    with pytest.raises(ConfigError, match=f"'{key}' must be >= 1, got 0"):
        from_mapping({"stream_name": "s", key: 0})
    assert from_mapping({"stream_name": "s"}).lease_assignment == "auto"


@pytest.mark.parametrize("seed", range(8))
def test_a_lease_just_handed_over_is_not_moved_on_before_its_new_owner_takes_it(seed: int) -> None:
    """A stopping worker x handed h to w, who had not taken it yet (its next look at the owner
    index is up to a renewal interval away), when the leader moved one of w's leases to a
    joiner: asked of h, the handoff from w, which never held it, was never ended (w's owner
    index no longer named it) and h waited to expire twice. The leader keeps leases whose owner
    changed between two of its scans from moves for a lease duration; w then takes h."""
    clock, table, takers = fleet(4, ["lead", "w"])
    lead, w = takers["lead"], takers["w"]
    lead.worker.rng = random.Random(seed)
    held_by_x = table.take_lease(put(table, "h"), "x")
    assert held_by_x is not None
    run(lead)  # s00-s03 shared; h held by x
    run(w)
    for _ in range(12):  # past the window in which the leader keeps what it assigned
        clock.advance(1.0)
        for t in (lead, w):
            t.worker.holder.renew_all()
        held_by_x = table.renew_lease(held_by_x)
        assert held_by_x is not None
        run(lead)  # h seen held by x, renewed
    handing = table.initiate_handoff(held_by_x, "w")
    assert handing is not None and table.complete_handoff(handing) is not None  # x stopping
    status(table, "v", clock.wall())  # a joiner: w (three) gives to it
    clock.advance(1.0)
    for t in (lead, w):
        t.worker.holder.renew_all()
    run(lead)
    assert any(x.handoff_pending for x in table.list_leases())  # the leader moved one of w's
    h = table.get_lease("h")
    assert h is not None and h.lease_owner == "w" and not h.handoff_pending
    run(w)
    assert "h" in w.worker.consumers


def test_a_lease_handed_to_us_and_asked_of_us_before_we_took_it_has_its_handoff_ended() -> None:
    """w watches h, which the stopping x hands it; before w takes h, a handoff of it to v is
    asked of w (the lease's owner by then). w never held it, and its owner index no longer
    names it: w ends that handoff as soon as it looks at h again, so v can take it (v unknown
    to w, which scans nothing: the lease's counter still bears our stores' stamp)."""
    _, table, takers = fleet(0, ["lead", "w", "v"])
    w = takers["w"]
    assert "v" not in w.running
    held_by_x = table.take_lease(put(table, "h"), "x")
    assert held_by_x is not None
    handing = table.initiate_handoff(held_by_x, "w")  # x stopping: hands h to w
    assert handing is not None
    run(w)  # w sees h coming and watches it
    assert "h" in w._incoming and "h" not in w.worker.consumers
    done = table.complete_handoff(handing)
    assert done is not None and table.initiate_handoff(done, "v") is not None
    asyncio.run(w._look_at_incoming())
    h = table.get_lease("h")
    assert h is not None and h.lease_owner == "v" and not h.handoff_pending


def test_a_handoff_asked_of_us_whose_end_failed_is_ended_at_the_next_look() -> None:
    """The key stayed on the watch list until the end landed: dropped before it, nothing looked
    at the lease again (the owner index no longer names it to us)."""
    _, table, takers = fleet(0, ["lead", "w", "v"])
    w = takers["w"]
    held_by_x = table.take_lease(put(table, "h"), "x")
    assert held_by_x is not None
    handing = table.initiate_handoff(held_by_x, "w")
    assert handing is not None
    run(w)
    done = table.complete_handoff(handing)
    assert done is not None and table.initiate_handoff(done, "v") is not None
    real, failures = table.complete_handoff, [ThrottledError("throttled")]

    def flaky(lease: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(lease)

    table.complete_handoff = flaky  # type: ignore[method-assign]
    asyncio.run(w._look_at_incoming())
    h = table.get_lease("h")
    assert h is not None and h.handoff_pending and "h" in w._incoming
    asyncio.run(w._look_at_incoming())
    h = table.get_lease("h")
    assert h is not None and h.lease_owner == "v" and not h.handoff_pending
    assert "h" not in w._incoming
