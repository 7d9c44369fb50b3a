"""AckTracker: the contiguous acknowledged prefix, negative acks, expiry, multi-sink counts."""

from __future__ import annotations

import threading

import pytest

from checkpoint.acks import AckError, AckHandle, AckRange, AckTracker
from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import KclpySparkError
from checkpoint.sequence import ExtendedSequenceNumber

TIMEOUT = 30.0


def esn(seq: int, sub: int = 0) -> ExtendedSequenceNumber:
    return ExtendedSequenceNumber(str(seq), sub)


# Three batches delivered in order: records 1-10, 11-20, 21-30.
BATCHES = [(1, 10), (11, 20), (21, 30)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def tracker(clock: ManualClock) -> AckTracker:
    return AckTracker(clock, TIMEOUT)


def deliver_all(tracker: AckTracker) -> list[AckHandle]:
    return [tracker.deliver(esn(first), esn(last)) for first, last in BATCHES]


@pytest.mark.parametrize(
    ("answers", "checkpointable", "redeliver_from"),
    [
        ([], None, None),
        (["+0"], 10, None),
        (["+0", "+1", "+2"], 30, None),  # in order
        (["+2", "+1"], None, None),  # out of order: waits for the first batch
        (["+2", "+1", "+0"], 30, None),  # ...then jumps over the whole prefix
        (["+0", "+2"], 10, None),  # a hole stops the prefix
        (["+1", "+0"], 20, None),
        (["-0"], None, 1),  # nack: nothing checkpointable, redeliver everything
        (["+0", "-1", "+2"], 10, 11),  # checkpoint stays; redeliver from the first unacked batch
        (["+0", "+2", "-1"], 10, 11),
        (["-2", "+0", "+1"], 20, 21),
        (["+0", "+1", "-2"], 20, 21),
    ],
)
def test_contiguous_prefix(
    tracker: AckTracker,
    answers: list[str],
    checkpointable: int | None,
    redeliver_from: int | None,
) -> None:
    handles = deliver_all(tracker)
    for answer in answers:
        handle = handles[int(answer[1:])]
        assert (handle.ack() if answer[0] == "+" else handle.nack()) is True
    assert tracker.checkpointable() == (None if checkpointable is None else esn(checkpointable))
    assert tracker.redelivery_from() == (None if redeliver_from is None else esn(redeliver_from))


def test_answers_after_a_failure_are_not_counted(tracker: AckTracker) -> None:
    handles = tracker.deliver_to(esn(1), esn(10), ["opensearch", "s3"])
    assert handles[0].nack() is True
    assert handles[1].ack() is False  # the batch will be delivered again anyway
    assert tracker.checkpointable() is None


def test_each_handle_answers_once(tracker: AckTracker) -> None:
    handle = tracker.deliver(esn(1), esn(10))
    handle.ack()
    for again in (handle.ack, handle.nack):
        with pytest.raises(AckError, match="already answered"):
            again()
    other = tracker.deliver(esn(11), esn(20))
    other.nack()
    with pytest.raises(AckError):
        other.ack()
    assert issubclass(AckError, KclpySparkError)


@pytest.mark.parametrize("sinks", [2, ["opensearch", "s3", "stdout"]])
def test_a_batch_routed_to_several_sinks_needs_every_ack(
    tracker: AckTracker, sinks: int | list[str]
) -> None:
    handles = tracker.deliver_to(esn(1), esn(10), sinks)
    n = sinks if isinstance(sinks, int) else len(sinks)
    assert len(handles) == n
    if not isinstance(sinks, int):
        assert [h.sink for h in handles] == sinks
    for handle in handles[:-1]:
        assert handle.ack()
        assert tracker.checkpointable() is None
    handles[-1].ack()
    assert tracker.checkpointable() == esn(10)


def test_a_double_ack_does_not_stand_in_for_a_missing_sink(tracker: AckTracker) -> None:
    first, second = tracker.deliver_to(esn(1), esn(10), 2)
    first.ack()
    with pytest.raises(AckError):
        first.ack()
    assert tracker.checkpointable() is None
    second.ack()
    assert tracker.checkpointable() == esn(10)


@pytest.mark.parametrize("sinks", [0, [], ["a", "a"]])
def test_bad_sink_lists(tracker: AckTracker, sinks: int | list[str]) -> None:
    with pytest.raises(ValueError, match="sink"):
        tracker.deliver_to(esn(1), esn(10), sinks)


def test_expiry_fails_unacknowledged_batches(tracker: AckTracker, clock: ManualClock) -> None:
    first, second = deliver_all(tracker)[:2]
    first.ack()
    clock.advance(TIMEOUT)
    assert tracker.poll_expired() == []  # exactly at the deadline: still in time
    clock.advance(0.001)
    assert tracker.poll_expired() == [AckRange(esn(11), esn(20)), AckRange(esn(21), esn(30))]
    assert tracker.poll_expired() == []  # reported once
    assert tracker.checkpointable() == esn(10)
    assert tracker.redelivery_from() == esn(11)
    assert second.ack() is False  # too late: like a negative ack


def test_expiry_seen_by_any_call_is_still_reported_once(
    tracker: AckTracker, clock: ManualClock
) -> None:
    handle = tracker.deliver(esn(1), esn(10))
    clock.advance(TIMEOUT + 1)
    assert handle.ack() is False
    assert tracker.redelivery_from() == esn(1)
    assert tracker.poll_expired() == [AckRange(esn(1), esn(10))]


def test_each_batch_has_its_own_deadline(tracker: AckTracker, clock: ManualClock) -> None:
    early = tracker.deliver(esn(1), esn(10))
    clock.advance(TIMEOUT / 2)
    late = tracker.deliver(esn(11), esn(20))
    clock.advance(TIMEOUT / 2 + 1)
    assert tracker.poll_expired() == [early.range]
    assert late.ack() is True


def test_rewind_discards_what_follows_the_prefix(tracker: AckTracker) -> None:
    handles = deliver_all(tracker)
    handles[0].ack()
    handles[1].nack()
    assert tracker.rewind() == esn(11)
    assert tracker.outstanding() == []
    assert tracker.redelivery_from() is None
    assert handles[2].ack() is False  # stale: ignored
    with pytest.raises(ValueError, match="not after"):
        tracker.deliver(esn(5), esn(12))  # before the checkpointable position
    again = tracker.deliver(esn(11), esn(20))
    again.ack()
    assert tracker.checkpointable() == esn(20)
    assert tracker.rewind() is None


def test_deliveries_must_come_in_order(tracker: AckTracker) -> None:
    tracker.deliver(esn(1), esn(10, 3))
    with pytest.raises(ValueError, match="not after"):
        tracker.deliver(esn(10, 3), esn(20))
    tracker.deliver(esn(10, 4), esn(20))  # the next KPL sub-record is fine
    with pytest.raises(ValueError, match="before first"):
        tracker.deliver(esn(40), esn(30))


def test_outstanding_lists_batches_not_yet_checkpointable(tracker: AckTracker) -> None:
    handles = deliver_all(tracker)
    handles[1].ack()
    assert tracker.outstanding() == [AckRange(esn(f), esn(la)) for f, la in BATCHES]
    handles[0].ack()
    assert tracker.outstanding() == [AckRange(esn(21), esn(30))]


def test_timeout_must_be_positive(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="timeout"):
        AckTracker(clock, 0)


def test_sinks_ack_from_many_threads(tracker: AckTracker) -> None:
    batches = [tracker.deliver_to(esn(i * 10 + 1), esn(i * 10 + 10), 3) for i in range(200)]
    start = threading.Barrier(3)

    def sink(index: int) -> None:
        start.wait()
        for handles in reversed(batches):  # the worst order: nothing moves until the end
            assert handles[index].ack()

    threads = [threading.Thread(target=sink, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert tracker.checkpointable() == esn(2000)
    assert tracker.outstanding() == []
