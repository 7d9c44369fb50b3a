"""#44 item 4: a kinesis-kcl query holding KCL leases plans its batches (pure): only the shards
it holds, going on under one tenure, resuming a new tenure where the query or the lease got
furthest, never re-reading an ended shard; what a completed batch acknowledges; the registry of
held leases and what an acknowledgment does to a lease's checkpointer."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import (
    AT_TIMESTAMP,
    LATEST,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
)
from kclpy_spark.readstream.leased import (
    Ack,
    HeldShard,
    acknowledgments,
    next_leased_offset,
    owner_of,
    resume_start,
)
from kclpy_spark.readstream.offsets import Pin, SourceOffset, Start, first_offset
from kclpy_spark.readstream.query_worker import (
    HeldLeases,
    _Entry,
    acknowledge,
    hand_end,
    start_of,
)

ESN = ExtendedSequenceNumber
A = "query:host:1:abc#t1"
B = "query:host:1:abc#t2"


def held(sid: str, tenure: str = A, start: Start | None = None) -> HeldShard:
    return HeldShard(sid, tenure, start or Start(), None)


def batch0(*shards: str) -> SourceOffset:
    return next_leased_offset(first_offset("run", 1_000), {}, {s: held(s) for s in shards})


def test_only_the_held_shards_are_read_from_their_lease_checkpoints() -> None:
    one = next_leased_offset(
        first_offset("run", 1_000), {},
        {"s0": held("s0"), "s1": held("s1", start=Start(ESN("500")))},
    )  # fmt: skip
    assert one.batch == 0 and one.read_shards() == ["s0", "s1"]
    assert one.shards["s1"].start == Start(ESN("500")) and one.shards["s1"].tenure == A


def test_one_tenure_goes_on_after_its_pin() -> None:
    one = batch0("s0")
    pins = {"s0": Pin(ESN("10"), ESN("20"), 2, next_iterator="it")}
    two = next_leased_offset(one, pins, {"s0": held("s0")})
    assert two.shards["s0"].start == Start(ESN("20")) and two.shards["s0"].iterator == "it"


def test_a_shard_no_longer_held_is_not_read_but_its_position_is_kept() -> None:
    one = batch0("s0", "s1")
    pins = {"s0": Pin(ESN("10"), ESN("20"), 2), "s1": Pin(ESN("11"), ESN("21"), 2)}
    two = next_leased_offset(one, pins, {"s0": held("s0")})
    assert two.read_shards() == ["s0"]
    assert two.shards["s1"].start == Start(ESN("21")) and two.shards["s1"].tenure is None


@pytest.mark.parametrize(
    ("ours", "lease", "expected"),
    [
        (None, Start(ESN("30")), Start(ESN("30"))),  # never read here: the lease's
        (Start(ESN("20")), Start(ESN("30")), Start(ESN("30"))),  # another went further
        (Start(ESN("20")), Start(ESN("10")), Start(ESN("20"))),  # our last batch: ahead
        (Start(ESN("20")), Start(), Start(ESN("20"))),  # TRIM_HORIZON: never checkpointed
        (Start(ESN("20")), Start(AT_TIMESTAMP, 5), Start(ESN("20"))),
        (Start(), Start(ESN("30")), Start(ESN("30"))),
        (Start(AT_TIMESTAMP, 5), Start(ESN("30")), Start(ESN("30"))),
    ],
)
def test_a_new_tenure_resumes_where_the_query_or_the_lease_got_furthest(
    ours: Start | None, lease: Start, expected: Start
) -> None:
    assert resume_start(ours, lease) == expected


def test_a_shard_taken_again_under_a_new_tenure_resumes_by_the_rule() -> None:
    one = batch0("s0")
    pins = {"s0": Pin(ESN("10"), ESN("20"), 2, caught_up=True, next_iterator="it")}
    ahead = next_leased_offset(one, pins, {"s0": held("s0", B, Start(ESN("90")))})
    assert ahead.shards["s0"].start == Start(ESN("90")) and ahead.shards["s0"].iterator is None
    behind = next_leased_offset(one, pins, {"s0": held("s0", B, Start(ESN("5")))})
    assert behind.shards["s0"].start == Start(ESN("20")) and behind.shards["s0"].tenure == B


def test_an_ended_shard_is_never_read_again_even_while_still_held() -> None:
    one = batch0("s0")
    two = next_leased_offset(one, {"s0": Pin(ESN("1"), ESN("2"), 2, ended=True)},
                             {"s0": held("s0"), "s1": held("s1")})  # fmt: skip
    assert two.read_shards() == ["s1"] and "s0" in two.ended


def test_a_skipped_shard_stays_where_the_batch_began() -> None:
    seven = {"s0": held("s0", start=Start(ESN("7")))}
    one = next_leased_offset(first_offset("run", 1_000), {}, seven)
    two = next_leased_offset(one, {"s0": Pin(ESN("8"), ESN("9"), 2)}, {}, skipped={"s0"})
    assert two.shards["s0"].start == Start(ESN("7"))


def test_available_now_ends_when_every_held_shard_is_caught_up_under_the_bound() -> None:
    start = first_offset("run", 1_000)
    one = next_leased_offset(start, {}, {"s0": held("s0")}, until_ms=50)
    pins = {"s0": Pin(ESN("1"), ESN("2"), 2, caught_up=True)}
    assert next_leased_offset(one, pins, {"s0": held("s0")}, until_ms=50) is one
    # a new tenure has not read under the bound yet
    again = next_leased_offset(one, pins, {"s0": held("s0", B)}, until_ms=50)
    assert again.read_shards() == ["s0"]


def test_shards_that_aged_out_of_the_listing_are_forgotten() -> None:
    one = batch0("s0", "s1")
    pins = {"s0": Pin(None, None, 0), "s1": Pin(None, None, 0)}
    two = next_leased_offset(one, pins, {}, listed={"s0"})
    assert set(two.shards) == {"s0"}


def test_offsets_with_tenures_survive_the_journal() -> None:
    one = batch0("s0")
    assert SourceOffset.from_json(one.to_json()) == one


def test_a_completed_batch_acknowledges_what_its_shards_found() -> None:
    one = batch0("s0", "s1", "s2")
    pins = {
        "s0": Pin(ESN("1"), ESN("2"), 2),
        "s1": Pin(None, None, 0),  # nothing read: nothing to acknowledge
        "s2": Pin(ESN("3"), ESN("4"), 2, ended=True, children=({"ShardId": "s9"},)),
    }
    acks = acknowledgments(one, pins)
    assert [(a.shard_id, a.tenure, a.ended) for a in acks] == [("s0", A, False), ("s2", A, True)]
    assert acknowledgments(one, pins, skipped={"s0"}, read_under={"s2": B})[0].tenure == B


def test_a_tenure_names_its_worker() -> None:
    assert owner_of(A) == "query:host:1:abc"


@pytest.mark.parametrize(
    ("checkpoint", "position", "expected"),
    [
        (ESN("42"), InitialPosition.latest(), Start(ESN("42"))),
        (TRIM_HORIZON, InitialPosition.latest(), Start()),
        # the moment, less twice the margin the consumer pins: duplicates possible, no gap
        (LATEST, InitialPosition.latest(), Start(AT_TIMESTAMP, 90_000)),
    ],
)
def test_a_consumers_start_becomes_a_planned_start(
    checkpoint: ESN, position: InitialPosition, expected: Start
) -> None:
    assert start_of(checkpoint, position, 100.0) == expected


def test_an_at_timestamp_lease_without_a_time_is_refused_not_read_from_now() -> None:
    """A Java KCL's AT_TIMESTAMP lease keeps no time: the query read it from the moment it took
    it, skipping what came while no worker ran (the daemon refuses it with one line)."""
    with pytest.raises(ConfigError, match="AT_TIMESTAMP without a time of its own"):
        start_of(AT_TIMESTAMP, InitialPosition.latest(), 100.0)
    at = InitialPosition.parse("AT_TIMESTAMP:1700000000")
    assert start_of(AT_TIMESTAMP, at, 100.0) == Start(AT_TIMESTAMP, 1_700_000_000_000)


class _Checkpointer:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._fail = fail

    def set_largest_permitted(self, position: ESN, sequence_numbers: Any) -> None:
        self.calls.append(("permit", position))

    def checkpoint(self, sequence_number: str, sub_sequence_number: int) -> None:
        if self._fail is not None:
            raise self._fail
        self.calls.append(("checkpoint", (sequence_number, sub_sequence_number)))


def _registered(tenure: str = A) -> tuple[HeldLeases, _Checkpointer, list[Any]]:
    leases, posted, cp = HeldLeases(), [], _Checkpointer()
    leases.register(_Entry(held("s0", tenure), posted.append))
    assert leases.readable() == {}  # not announced yet: its consumer has not started reading
    leases.announce("s0", cp)
    assert set(leases.readable()) == {"s0"}
    return leases, cp, posted


def test_an_acknowledgment_checkpoints_the_pins_last_record() -> None:
    leases, cp, posted = _registered()
    assert acknowledge(leases, Ack("s0", A, Pin(ESN("1"), ESN("2", 3), 2)))
    assert cp.calls == [("permit", ESN("2", 3)), ("checkpoint", ("2", 3))] and posted == []


def test_an_ended_shard_is_handed_to_its_consumer_with_its_children() -> None:
    leases, cp, posted = _registered()
    children = ({"ShardId": "s9", "ParentShards": ["s0"]},)
    assert acknowledge(leases, Ack("s0", A, Pin(ESN("1"), ESN("2"), 2, children=children), True))
    # the last records first; SHARD_END: the consumer's shard end writes it
    assert cp.calls == [("permit", ESN("2")), ("checkpoint", ("2", 0))]
    assert posted[0].shard_ended and posted[0].child_shards == [dict(children[0])]
    assert leases.readable() == {}  # handed its end: no longer read
    assert not hand_end(leases, "s0", [])  # once


def test_an_end_found_without_children_takes_them_from_the_listing() -> None:
    leases, _, posted = _registered()
    listing = [{"ShardId": "s9", "ParentShards": ["s0"]}]
    assert acknowledge(leases, Ack("s0", A, Pin(None, None, 0), True), lambda sid: listing)
    assert posted[0].child_shards == listing


def test_an_end_whose_children_are_not_listed_yet_is_handed_later() -> None:
    """Handed with no children, the consumer checkpointed SHARD_END with no child leased (the
    children waited minutes for the sync's audit, and the parent's lease was never cleaned up)."""
    leases, _, posted = _registered()
    assert acknowledge(leases, Ack("s0", A, Pin(None, None, 0), True), lambda sid: [])
    assert posted == [] and set(leases.readable()) == {"s0"}  # not handed: still its consumer's
    listing = [{"ShardId": "s9", "ParentShards": ["s0"]}]
    assert hand_end(leases, "s0", listing)
    assert posted[0].shard_ended and posted[0].child_shards == listing


def test_an_acknowledgment_of_another_tenure_moves_nothing() -> None:
    leases, cp, posted = _registered(tenure=B)
    assert not acknowledge(leases, Ack("s0", A, Pin(ESN("1"), ESN("2"), 2)))
    assert not acknowledge(leases, Ack("s1", A, Pin(ESN("1"), ESN("2"), 2)))
    assert cp.calls == [] and posted == []


def test_a_lost_lease_is_not_acknowledged() -> None:
    from checkpoint.checkpointer import CheckpointError

    leases, posted = HeldLeases(), []
    leases.register(_Entry(held("s0"), posted.append))
    leases.announce("s0", _Checkpointer(CheckpointError("ShutdownException", "lost")))
    assert not acknowledge(leases, Ack("s0", A, Pin(ESN("1"), ESN("2"), 2)))


def test_waiting_on_the_registry_returns_at_the_change_or_the_deadline() -> None:
    import threading

    leases = HeldLeases()
    assert not leases.wait(lambda: bool(leases.readable()), 0.05)
    entry = _Entry(held("s0"), lambda item: None)
    leases.register(entry)
    timer = threading.Timer(0.05, leases.announce, ("s0", _Checkpointer()))
    timer.start()
    assert leases.wait(lambda: bool(leases.readable()), 5.0)
    leases.unregister(entry)
    assert leases.readable() == {}


def _lease(key: str, owner: str | None, counter: int, ended: bool = False) -> Any:
    from checkpoint.lease import Lease
    from checkpoint.sequence import SHARD_END

    return Lease(key, SHARD_END if ended else ESN("5"), owner, counter)


def test_available_now_waits_for_leases_unowned_ours_or_not_seen_renewed() -> None:
    from kclpy_spark.readstream.lease_driver import LeaseLiveness

    live = LeaseLiveness(failover_time=10)
    assert not live.quiet([_lease("s0", None, 1)], "me", 0.0)  # unowned: ours to take
    assert not live.quiet([_lease("s0", "me", 1)], "me", 0.0)  # ours, not read yet
    assert live.quiet([_lease("s0", "me", 1)], "me", 0.0, reading={"s0"})  # the planner's
    assert live.quiet([_lease("s0", "me", 1, ended=True)], "me", 0.0)  # finished
    other = LeaseLiveness(failover_time=10)
    assert not other.quiet([_lease("s1", "b", 1)], "me", 0.0)  # not yet seen renewed
    assert other.quiet([_lease("s1", "b", 2)], "me", 3.0)  # renewed: live, not ours
    assert other.quiet([_lease("s1", "b", 2)], "me", 12.0)
    assert not other.quiet([_lease("s1", "b", 2)], "me", 13.5)  # silent past failover


def test_children_come_from_a_listing_as_get_records_names_them() -> None:
    from checkpoint.lease import HashKeyRange
    from kclpy_spark.readstream.leased import children_in
    from shard_sync.shards import Shard

    listed = [
        Shard("s0", None, None, HashKeyRange(0, 9), "1", "5"),
        Shard("s1", "s0", None, HashKeyRange(0, 4), "6"),
        Shard("s2", "s0", None, HashKeyRange(5, 9), "6"),
        Shard("s3", "s1", "s2", HashKeyRange(0, 9), "8"),
    ]
    assert children_in(listed, "s0") == [
        {"ShardId": "s1", "ParentShards": ["s0"],
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "4"}},
        {"ShardId": "s2", "ParentShards": ["s0"],
         "HashKeyRange": {"StartingHashKey": "5", "EndingHashKey": "9"}},
    ]  # fmt: skip
    assert [c["ParentShards"] for c in children_in(listed, "s2")] == [["s1", "s2"]]
    assert children_in(listed, "s3") == []


def test_an_end_never_handed_is_handed_to_the_tenure_that_reads_the_shard_now() -> None:
    from kclpy_spark.readstream.leased import ends_to_hand

    one = batch0("s0", "s1")
    pins = {"s0": Pin(ESN("1"), ESN("2"), 2, ended=True), "s1": Pin(ESN("3"), ESN("4"), 2)}
    # the batch that ended s0 was never acknowledged; s0 is held again under a new tenure
    assert ends_to_hand(one, pins, {"s0", "s1"}) == ["s0"]
    two = next_leased_offset(one, pins, {"s0": held("s0", B), "s1": held("s1")})
    assert "s0" in two.ended and two.read_shards() == ["s1"]
    assert ends_to_hand(two, {"s1": Pin(None, None, 0)}, {"s0", "s1"}) == ["s0"]  # later too
    assert ends_to_hand(two, {"s1": Pin(None, None, 0)}, {"s1"}) == []  # not held: nothing


class _FakeWorker:
    def __init__(self, leases: list[Any]) -> None:
        self.leases = HeldLeases()
        self.store = self
        self.worker_id = "me"
        self._table = leases

    def list_leases(self) -> list[Any]:
        return self._table

    def running(self) -> bool:
        return True


def _driver(worker: _FakeWorker) -> Any:
    from kclpy_spark.readstream.lease_driver import LeaseDriver
    from kclpy_spark.readstream.options import SourceOptions

    options = {"streamName": "s", "region": "us-east-1", "leaseStore": "dynamodb",
               "applicationName": "app"}  # fmt: skip
    driver = LeaseDriver(SourceOptions.parse(options))
    driver._worker = worker  # type: ignore[assignment]
    return driver


def test_available_now_keeps_waiting_while_a_lease_waits_though_another_is_readable() -> None:
    worker = _FakeWorker([_lease("s0", "me", 1), _lease("s9", None, 1)])
    worker.leases.register(_Entry(held("s0"), lambda item: None))
    worker.leases.announce("s0", _Checkpointer())  # read to its bound: readable, nothing to plan
    assert not _driver(worker).settle(lambda: False, seconds=0.2)  # s9 waits for a taker
    worker._table = [_lease("s0", "me", 1)]
    assert _driver(worker).settle(lambda: False, seconds=0.2)  # s0 read to its bound: done
    worker._table = [_lease("s0", "me", 1, ended=True), _lease("s9", "other", 1)]
    assert not _driver(worker).settle(lambda: False, seconds=0.2)  # not yet seen renewed
    assert _driver(worker).settle(lambda: True, seconds=0.2)  # a plan would read: go on


def test_a_batchs_acknowledgments_run_side_by_side() -> None:
    """One after another, a hundred shards' checkpoint writes (~10 ms each on DynamoDB) held the
    batch's commit a second; each is its own lease's write, so they run at once, a few at a time."""
    import threading

    from kclpy_spark.readstream.query_worker import ACK_THREADS, acknowledge_all

    class Slow(_Checkpointer):
        running = most = 0
        lock = threading.Lock()
        all_in = threading.Barrier(ACK_THREADS, timeout=10)

        def checkpoint(self, sequence_number: str, sub_sequence_number: int) -> None:
            with Slow.lock:
                Slow.running += 1
                Slow.most = max(Slow.most, Slow.running)
            with contextlib.suppress(threading.BrokenBarrierError):
                Slow.all_in.wait()  # the first ACK_THREADS meet here: they run together
            super().checkpoint(sequence_number, sub_sequence_number)
            with Slow.lock:
                Slow.running -= 1

    leases = HeldLeases()
    checkpointers = {f"s{i}": Slow() for i in range(3 * ACK_THREADS)}
    for sid, cp in checkpointers.items():
        leases.register(_Entry(held(sid), lambda _: None))
        leases.announce(sid, cp)
    acks = [Ack(sid, A, Pin(ESN("1"), ESN("2"), 2)) for sid in checkpointers]
    assert acknowledge_all(leases, acks) == [True] * len(acks)
    assert Slow.most == ACK_THREADS
    assert all(cp.calls[-1] == ("checkpoint", ("2", 0)) for cp in checkpointers.values())


def test_a_runs_first_plan_waits_for_its_leases_and_later_plans_do_not() -> None:
    """A Trigger.Once run starts its worker at its first plan: no lease was taken yet, the plan
    read nothing and Spark ended the run without a batch (every run, for good)."""
    import threading
    import time

    worker = _FakeWorker([_lease("s0", None, 1)])
    driver = _driver(worker)

    def taken_later() -> None:
        time.sleep(0.3)
        worker.leases.register(_Entry(held("s0"), lambda item: None))
        worker.leases.announce("s0", _Checkpointer())

    threading.Thread(target=taken_later, daemon=True).start()
    start = first_offset("run", 1_000)
    planned = driver.plan(start, {}, [], None, set())
    assert planned.read_shards() == ["s0"]
    waits: list[int] = []
    driver.settle = lambda *a, **k: waits.append(1) or False  # type: ignore[method-assign]
    worker.leases = HeldLeases()  # nothing readable now
    assert driver.plan(start, {}, [], None, set()) is start and waits == []


def _acknowledged_after_a_restart(
    tmp_path: Any, held_from: str
) -> tuple[Any, _Checkpointer, SourceOffset]:
    """The earlier run's batch (s0 from 150, its pin 160..170) acknowledged by this run, which
    holds s0 again from ``held_from``: the driver, the lease's checkpointer and the batch."""
    from kclpy_spark.readstream.pins import DirectoryPins

    worker = _FakeWorker([])
    checkpointer = _Checkpointer()
    worker.leases.register(_Entry(held("s0", "me#t2", Start(ESN(held_from))), lambda item: None))
    worker.leases.announce("s0", checkpointer)
    earlier = {"s0": held("s0", "query:old#t1", Start(ESN("150")))}
    offset = next_leased_offset(first_offset("run", 1_000), {}, earlier)
    driver = _driver(worker)
    driver.acknowledge(
        offset, {"s0": Pin(ESN("160"), ESN("170"), 2)}, DirectoryPins(tmp_path), lambda s: []
    )
    return driver, checkpointer, offset


def test_a_batch_an_earlier_run_completed_is_acknowledged_under_the_tenure_held_again(
    tmp_path: Any,
) -> None:
    """Spark committed batch N, then the driver stopped: the next run acknowledged N under the
    earlier run's tenure, refused, so the lease stayed behind (a quiet shard for good, and a
    later move read the committed batch again); a Trigger.Once job never checkpointed."""
    driver, checkpointer, offset = _acknowledged_after_a_restart(tmp_path, held_from="150")
    assert ("checkpoint", ("170", 0)) in checkpointer.calls
    # the next plan goes on under the tenure held now (not the earlier run's: a new iterator)
    assert driver._read_under == {(offset.run, offset.batch): {"s0": "me#t2"}}


def test_an_earlier_runs_batch_is_not_acknowledged_when_the_lease_went_on_without_it(
    tmp_path: Any,
) -> None:
    _, checkpointer, _ = _acknowledged_after_a_restart(tmp_path, held_from="300")
    assert checkpointer.calls == []  # another owner read on past it: nothing moves back


def test_a_batch_planned_again_reads_the_same_shards_whatever_a_tenure_did_since(
    tmp_path: Any,
) -> None:
    """Spark plans a batch once per action (a foreachBatch with two actions, a Delta MERGE): the
    lease expired and was taken again here between two plans, and the second left the shard
    out for good, so the acknowledgment skipped it and the next batch read again what the
    first action had written (and the two actions saw different inputs)."""
    from kclpy_spark.readstream.pins import DirectoryPins

    worker = _FakeWorker([])
    first = _Entry(held("s0", "me#t1", Start(ESN("150"))), lambda item: None)
    worker.leases.register(first)
    worker.leases.announce("s0", _Checkpointer())
    offset = next_leased_offset(first_offset("run", 1_000), {}, worker.leases.readable())
    driver = _driver(worker)
    store = DirectoryPins(tmp_path)
    assert driver.replay_reads(offset, store) == ["s0"]
    worker.leases.unregister(first)  # expired, and taken again by this worker at the same start
    worker.leases.register(_Entry(held("s0", "me#t2", Start(ESN("150"))), lambda item: None))
    worker.leases.announce("s0", _Checkpointer())
    assert driver.replay_reads(offset, store) == ["s0"]
    assert store.skipped(offset.run, offset.batch) == set()
