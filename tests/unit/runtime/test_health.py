"""Readiness means progress (issue 15): the rules of Health, on a manual clock."""

from __future__ import annotations

from checkpoint.base.clock import ManualClock
from checkpoint.base.errors import CorruptLeaseError, DependencyError, ResourceNotFoundError
from kclpy_spark.runtime.health import ConsumerView, Health


def health(clock: ManualClock) -> Health:
    h = Health(clock.monotonic, store_interval=3.0, missing_timeout=60.0, table_name="app")
    h.started = True
    h.store_ok()
    return h


def ready(h: Health, *consumers: ConsumerView, missing: tuple[str, ...] = ()) -> tuple[bool, str]:
    return h.readiness(suspended=False, consumers=consumers, missing_streams=missing)


def test_ready_when_started_and_the_table_answers() -> None:
    clock = ManualClock()
    h = Health(clock.monotonic, store_interval=3.0, missing_timeout=60.0, table_name="app")
    assert ready(h) == (False, "starting")
    h.started = True
    assert ready(h) == (False, "no lease-table round trip yet")
    h.store_ok()
    assert ready(h) == (True, "ready")
    clock.advance(10.0)
    assert ready(h)[0] is False and "unreachable" in ready(h)[1]


def test_a_stalled_shard_a_missing_stream_or_all_leases_parked_is_not_ready() -> None:
    clock = ManualClock()
    h = health(clock)
    ok = ConsumerView("shardId-0", "processing", stalled=False)
    stuck = ConsumerView("shardId-1", "processing", stalled=True)
    assert ready(h, ok) == (True, "ready")
    assert ready(h, ok, stuck) == (False, "no successful read lately on shard(s) shardId-1")
    assert ready(h, ok, missing=("orders",)) == (False, "stream(s) gone or not readable: orders")
    h.all_parked = True
    assert ready(h, ok) == (False, "every lease of the application is parked (see status)")
    assert h.readiness(suspended=True, consumers=[ok], missing_streams=[]) == (True, "suspended")


def test_a_lease_table_gone_is_not_ready_then_fatal_after_the_timeout() -> None:
    clock = ManualClock()
    h = health(clock)
    h.store_failed(DependencyError("throttled"))  # not gone: only a failure
    assert h.table_gone_since is None
    h.store_failed(ResourceNotFoundError("table app does not exist"))
    clock.advance(59.0)
    assert ready(h) == (False, "lease table app gone for 59s")
    assert h.fatal({}) is None
    clock.advance(1.0)
    reason = h.fatal({})
    assert reason is not None and "lease table app has been gone for 60s" in reason
    h.store_ok()  # back: the clock restarts
    assert h.fatal({}) is None and ready(h) == (True, "ready")


def test_a_coordination_table_gone_is_not_cleared_by_the_lease_tables_answers() -> None:
    """Each renewal of the lease table cleared it: the daemon never gave up (exit 3), /readyz
    flickered to ready, and the log had an ERROR and a WARNING every round."""
    clock = ManualClock()
    h = health(clock)
    gone = ResourceNotFoundError("table app-KclpySparkState does not exist")
    gone.resource = "app-KclpySparkState"
    for _ in range(20):  # three seconds a round: a failed publish, then a renewal that worked
        h.store_failed(gone)
        h.store_ok()
        clock.advance(3.0)
    assert ready(h) == (False, "coordination table app-KclpySparkState gone for 60s")
    reason = h.fatal({})
    assert reason is not None and "coordination table app-KclpySparkState" in reason
    h.store_ok(coordination=True)  # the coordination records answer again
    assert h.fatal({}) is None and ready(h) == (True, "ready")


def test_a_stream_gone_for_the_timeout_is_fatal() -> None:
    clock = ManualClock()
    h = health(clock)
    since = clock.monotonic()
    clock.advance(30.0)
    assert h.fatal({"orders": since}) is None
    clock.advance(30.0)
    assert "stream orders has been gone for 60s" in (h.fatal({"orders": since}) or "")


def test_one_deleted_stream_of_several_is_not_fatal_all_of_them_are() -> None:
    """Every worker exited when one of its streams was deleted, and again after each restart
    (the stream still configured): the healthy streams got five-minute windows."""
    clock = ManualClock()
    h = health(clock)
    since = clock.monotonic()
    clock.advance(61.0)
    assert h.fatal({"orders": since}, streams=2) is None
    assert ready(h, missing=("orders",))[0] is False  # still not ready: it is gone
    reason = h.fatal({"orders": since, "clicks": since + 1.0}, streams=2) or ""
    assert "streams clicks, orders have been gone for 60s" in reason


def test_a_processor_call_that_does_not_return_is_not_ready_naming_the_shard() -> None:
    clock = ManualClock()
    h = health(clock)
    ok = ConsumerView("shardId-0", "processing", stalled=False)
    hung = ConsumerView("shardId-1", "processing", stalled=False, hung_for=901.4)
    assert ready(h, ok) == (True, "ready")
    assert ready(h, ok, hung) == (
        False,
        "a processor call has not returned on shard(s) shardId-1 (901s)",
    )


def test_a_corrupt_lease_is_not_ready_until_a_scan_reads_every_item() -> None:
    """#49 item 6: a lease item no code can read made every scan fail ("lease taking failed"
    every 1.7 s) while /readyz said 200."""
    clock = ManualClock()
    h = health(clock)
    h.store_failed(CorruptLeaseError("shardId-7", "attribute 'leaseCounter' is out of range"))
    assert ready(h) == (
        False,
        "lease 'shardId-7' is corrupt: attribute 'leaseCounter' is out of range (mend or delete "
        "the item)",
    )
    h.store_ok()  # a renewal answered: the table is there, the item still corrupt
    assert not ready(h)[0]
    h.store_ok(scanned=True)
    assert ready(h) == (True, "ready")


def test_a_leader_whose_last_shard_sync_failed_is_not_ready() -> None:
    """#49 item 10: a failed first sync (ListShards answering {} past its retries) left the
    leader ready with no lease until the next sync."""
    h = health(ManualClock())
    failing = ["orders (ListShards on stream 'orders': an answer without a Shards list)"]
    assert h.readiness(
        suspended=False, consumers=[], missing_streams=[], failing_syncs=failing
    ) == (False, f"shard sync failed for stream(s) {failing[0]}")
    assert ready(h) == (True, "ready")  # synced again (nothing failing): ready


def test_a_suspended_worker_is_judged_by_its_control_rounds_reads() -> None:
    """Suspended, only the control round (once a lease duration) reads the table: judged by
    three renewal intervals, the readiness flapped 503 "unreachable" between two rounds."""
    clock = ManualClock()
    h = Health(clock.monotonic, store_interval=1.0, missing_timeout=60.0, table_name="app",
               quiet_interval=3.0)  # fmt: skip
    h.started = True
    h.store_ok()
    clock.advance(6.5)  # a round late, one read failed: not yet a table that does not answer
    assert h.readiness(suspended=True, consumers=[], missing_streams=[]) == (True, "suspended")
    assert not ready(h)[0]  # not suspended: renewals and scans would have answered by now
    clock.advance(3.0)
    assert h.readiness(suspended=True, consumers=[], missing_streams=[])[0] is False


def test_a_gone_coordination_table_is_named_as_such_not_as_the_lease_table() -> None:
    clock = ManualClock()
    h = health(clock)
    gone = ResourceNotFoundError("GetItem on table 'app-KclpySparkState': not found")
    gone.resource = "app-KclpySparkState"
    h.store_failed(gone)
    clock.advance(5.0)
    assert ready(h) == (False, "coordination table app-KclpySparkState gone for 5s")
    clock.advance(55.0)
    reason = h.fatal({})
    assert reason is not None
    assert reason.startswith("the coordination table app-KclpySparkState has been gone for 60s")
    assert "checkpoints are lost" not in reason


def test_lease_table_writes_failing_are_not_ready_though_scans_answer() -> None:
    """A throttled lease table, or writes denied by IAM: every renewal and take failed, the
    worker kept no lease and read nothing, and was ready all along (its scans answered). The
    holder drops a lease whose renewals failed once it expires locally (~10 s): the rounds after
    that renew nothing, which must not clear the failure; the next take fails in turn."""
    clock = ManualClock()
    h = health(clock)
    denied = DependencyError("AccessDenied: UpdateItem on table app")
    for _ in range(3):  # renewals fail from 0 to 6 s; the lease is dropped then
        h.writes(0, [denied])
        h.store_ok(scanned=True)  # the take loop's scans still answer
        clock.advance(3.0)
    for _ in range(2):  # 9 to 12 s: nothing held, nothing renewed
        h.writes(0, [])
        h.store_ok(scanned=True)
        clock.advance(1.5)
    ok, why = ready(h)
    assert not ok and why.startswith("lease-table writes failing for 12s") and "AccessDenied" in why
    h.writes(0, [denied])  # the take of its expired lease fails too
    assert not ready(h)[0]
    h.writes(1, [])  # one write answered: the table takes writes again
    assert ready(h) == (True, "ready")
    h.writes(0, [denied])
    clock.advance(3.0)
    h.store_ok()
    assert ready(h) == (True, "ready")  # failing since 3 s only
    clock.advance(60.0)  # an old failure, and no write since (nothing to hold or take)
    h.store_ok()
    assert ready(h) == (True, "ready")
