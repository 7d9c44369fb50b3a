"""The worker's periodic loops: renewals keep their rate when a round is slow; leadership is
renewed at the pace its record's life sets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from checkpoint.base.clock import ManualClock
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.moves.assigning import leader_election, lease_timing
from kclpy_spark.runtime.loop_watch import watch_the_loop
from kclpy_spark.runtime.worker import Worker


def _sleeps(rate: bool, step_seconds: float, interval: float = 3.3) -> list[float]:
    clock = ManualClock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        if len(slept) == 3:
            raise asyncio.CancelledError

    async def step() -> None:
        clock.advance(step_seconds)

    fake = SimpleNamespace(clock=clock, sleep=sleep, cfg=SimpleNamespace(worker_id="w"))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Worker._loop(fake, step, interval, first=True, rate=rate))  # type: ignore[arg-type]
    return slept


def test_a_rate_loop_starts_each_round_one_interval_after_the_last_began() -> None:
    assert _sleeps(rate=True, step_seconds=2.0) == [1.3, 1.3, 1.3]
    assert _sleeps(rate=True, step_seconds=5.0) == [0.0, 0.0, 0.0]  # late: at once


def test_other_loops_wait_one_interval_after_the_last_ended() -> None:
    assert _sleeps(rate=False, step_seconds=2.0) == [3.3, 3.3, 3.3]


def test_a_loop_asks_a_callable_interval_after_every_step() -> None:
    paces = iter([10.0, 3.0, 2.5])
    clock = ManualClock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            raise asyncio.CancelledError

    async def step() -> None:
        clock.advance(0.5)

    fake = SimpleNamespace(clock=clock, sleep=sleep, cfg=SimpleNamespace(worker_id="w"))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Worker._loop(fake, step, lambda: next(paces)))  # type: ignore[arg-type]
    assert slept == [10.0, 3.0, 2.5]


def test_the_leader_loop_runs_at_the_pace_of_its_record_life() -> None:
    """lease_assignment = "auto": a leader that assigns lives one failover time and renews
    every third of it (ticks every sixth); a loop at a fixed pace set for the three-failover
    life would let it lapse."""
    store, clock = MemoryLeaseTable(), ManualClock()
    cfg = WorkerConfig(stream_name="s", worker_id="w", failover_time=10.0)
    leader = leader_election(cfg, store, lease_timing(cfg), clock)
    fake = SimpleNamespace(
        leader=leader,
        holder=SimpleNamespace(round_interval=0.83),
        cfg=cfg,
        timing=lease_timing(cfg),
        _io=lambda *args: None,
        _renew_round=None,
        _maintenance_round=None,
        _control_round=None,
    )
    loops = Worker._periodic(fake)  # type: ignore[arg-type]
    assert loops[0][2] == {"rate": True, "first": True}  # renewals at once, the others later
    (pace,) = [every for step, every, _ in loops if getattr(step, "args", None) == (leader.tick,)]
    assert callable(pace)
    assert leader.tick()
    assert pace() == 5.0  # a sixth of its 30 s life
    leader.set_assigns(True)
    assert leader.tick() and pace() == pytest.approx(10 / 6)


def test_leases_held_is_counted_at_every_scrape_not_at_renewal_rounds() -> None:
    """A lease taken (or dropped) shows in ``kclpy_spark_leases_held`` at once: the soak judges
    the threads and tasks a worker holds against it, and a gauge set only at renewal rounds
    lagged a take by up to a round."""
    from checkpoint.lease import Lease
    from checkpoint.sequence import TRIM_HORIZON

    store, clock = MemoryLeaseTable(), ManualClock()
    cfg = WorkerConfig(stream_name="s", worker_id="w", failover_time=10.0)
    worker = Worker(cfg, lambda: None, store=store, kinesis_sync=None, kinesis_async=None,
                    clock=clock)  # type: ignore[arg-type,return-value]  # fmt: skip

    def held() -> float:
        text = worker.metrics.exposition().decode()
        [line] = [x for x in text.splitlines() if x.startswith("kclpy_spark_leases_held")]
        return float(line.rsplit(" ", 1)[1])

    assert held() == 0
    for key in ("a", "b"):
        store.create_lease_if_absent(Lease(lease_key=key, checkpoint=TRIM_HORIZON, lease_owner="w"))
    taken = [worker.holder.add_taken(lease) for lease in store.list_leases()]
    assert held() == 2
    worker.holder.drop("a", taken[0].token)
    assert held() == 1
    clock.advance(11.0)  # not renewed within the lease duration: no longer held
    assert held() == 0


def test_a_blocked_event_loop_is_told_of_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Renewal rounds are scheduled on the event loop: an async processor method that blocks it
    for about half the failover time loses leases, which no log line explained."""
    clock = ManualClock()
    woke_late = iter([0.1, 3.0, 0.2, 2.4])  # seconds each sleep overran; the limit is 10 / 4
    stalls: list[int] = []

    async def sleep(seconds: float) -> None:
        try:
            clock.advance(seconds + next(woke_late))
        except StopIteration:
            raise asyncio.CancelledError from None

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(watch_the_loop(clock, sleep, lease_duration=10.0,
                                   on_stall=lambda: stalls.append(1), worker_id="w"))  # fmt: skip
    assert len(stalls) == 1
    assert [r.getMessage() for r in caplog.records if "event loop was blocked for 3.0 s" in
            r.getMessage()]  # fmt: skip


def test_a_wake_up_asked_during_a_take_round_starts_the_next_round_at_once() -> None:
    """The event was cleared after the round: a shard's end (its children to take) or new
    leases told meanwhile waited out a whole take interval."""
    wake = asyncio.Event()
    rounds: list[int] = []

    async def one_round() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            wake.set()  # a shard ended while this round ran
        elif len(rounds) == 2:
            raise asyncio.CancelledError

    async def wait(event: asyncio.Event, interval: float) -> None:
        if not event.is_set():
            raise AssertionError(f"waited the interval ({interval} s) for a wake-up already told")

    fake = SimpleNamespace(
        run_state=SimpleNamespace(suspended=False),
        taker=SimpleNamespace(round=one_round, wait=wait, interval=lambda: 30.0),
        _take_now=wake,
        cfg=SimpleNamespace(worker_id="w"),
    )
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Worker._take_loop(fake))  # type: ignore[arg-type]
    assert rounds == [0, 1]
