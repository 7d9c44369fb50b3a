"""The status page's model: what it shows from a lease scan and the workers' published records,
and that everything it keeps is bounded by what is alive. Pure: times are given."""

from __future__ import annotations

import itertools
from typing import Any

from checkpoint.lease import Lease
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.board.model import Board

SEQ = ExtendedSequenceNumber("49600000000000000000000000000000000000000000000000000002")


def status(at: float, leases: dict[str, tuple[int, int | None]], **extra: Any) -> dict[str, Any]:
    """A worker's published record: lease -> (records so far, millis behind)."""
    figures = {k: {"records": r, "millis_behind_latest": lag} for k, (r, lag) in leases.items()}
    return {"updated_at": at, "leases": figures, "ready": True, "readiness": "ready", **extra}


def lease(key: str, owner: str | None = "w1", **fields: Any) -> Lease:
    return Lease(key, fields.pop("checkpoint", SEQ), lease_owner=owner, **fields)


def test_rates_come_from_the_owners_counts_between_two_publications() -> None:
    board = Board("app", "stream")
    board.observe([lease("s0")], {"w1": status(100.0, {"s0": (1000, 50)})}, 101.0)
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (1500, 20)})}, 111.0)
    snap = board.snapshot()
    row = snap["leases"][0]
    assert row["records_per_s"] == 50.0
    assert row["millis_behind_latest"] == 20
    assert snap["series"]["s0"] == {"t": [101.0, 111.0], "lag": [50, 20], "rate": [None, 50.0]}
    assert snap["step"] == 10.0  # the page breaks a line where points are further apart
    assert snap["workers"][0]["records_per_s"] == 50.0
    assert snap["workers"][0]["cpu_percent"] is None  # not published
    board.observe([lease("s0")], {"w1": status(120.0, {"s0": (1600, 0)}, cpu_percent=37.5)}, 121.0)
    assert board.snapshot()["workers"][0]["cpu_percent"] == 37.5


def test_a_dead_owners_last_rate_and_lag_are_not_shown_on() -> None:
    """A killed worker (or fleet) kept its last records/s and lag on the page, charts drawing
    flat lines up to now: a stopped application looked healthy."""
    board = Board("app", "stream", worker_ttl=30.0)
    board.observe([lease("s0")], {"w1": status(100.0, {"s0": (1000, 50)})}, 101.0)
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (1500, 20)})}, 111.0)
    assert board.snapshot()["leases"][0]["records_per_s"] == 50.0
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (1500, 20)})}, 2400.0)  # 38 min on
    snap = board.snapshot()
    assert snap["leases"][0]["records_per_s"] is None
    assert snap["workers"][0]["records_per_s"] in (None, 0, 0.0)
    assert snap["series"].get("s0", {"t": []})["t"][-1:] != [2400.0]  # no new point


def test_a_lease_whose_owner_went_silent_shows_expired_on_the_page() -> None:
    """Its lease table row said ASSIGNED with the last lag (`status` had the same defect)."""
    board = Board("app", "stream", silent_after=11.0)
    published = status(110.0, {"s0": (1500, 0)})
    published["leases"]["s0"]["last_renewal"] = 110.0
    board.observe([lease("s0")], {"w1": published}, 115.0)
    assert board.snapshot()["leases"][0]["state"] == "ASSIGNED"
    board.observe([lease("s0")], {"w1": published}, 2400.0)
    row = board.snapshot()["leases"][0]
    assert (row["state"], row["millis_behind_latest"]) == ("EXPIRED", None)


def test_the_same_publication_seen_twice_keeps_the_last_rate() -> None:
    board = Board("app", "stream", step=1.0)
    board.observe([lease("s0")], {"w1": status(100.0, {"s0": (0, 0)})}, 100.0)
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (100, 0)})}, 110.0)
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (100, 0)})}, 115.0)
    assert board.snapshot()["series"]["s0"]["rate"] == [None, 10.0, 10.0]


def test_a_lease_that_moves_starts_its_rate_again() -> None:
    board = Board("app", "stream")
    board.observe([lease("s0", "w1")], {"w1": status(100.0, {"s0": (9000, 0)})}, 100.0)
    board.observe(
        [lease("s0", "w2")], {"w2": status(120.0, {"s0": (10, 0)}), "w1": status(100.0, {})}, 120.0
    )
    assert board.snapshot()["leases"][0]["records_per_s"] is None  # not (10 - 9000) / 20
    board.observe([lease("s0", "w2")], {"w2": status(130.0, {"s0": (110, 0)})}, 130.0)
    assert board.snapshot()["leases"][0]["records_per_s"] == 10.0


def test_a_new_tenure_under_the_same_owner_gives_no_negative_rate() -> None:
    board = Board("app", "stream")
    board.observe([lease("s0")], {"w1": status(100.0, {"s0": (500, 0)})}, 100.0)
    board.observe([lease("s0")], {"w1": status(110.0, {"s0": (3, 0)})}, 110.0)
    assert board.snapshot()["leases"][0]["records_per_s"] is None


def test_series_keep_one_point_per_step_and_only_the_window() -> None:
    board = Board("app", "stream", window=100.0, step=10.0)
    for i in range(1000):  # a look every 2 s for 2000 s
        at = 1000.0 + 2 * i
        board.observe([lease("s0")], {"w1": status(at, {"s0": (i, i)})}, at)
    series = board.snapshot()["series"]["s0"]
    assert 10 <= len(series["t"]) <= 11
    assert min(series["t"]) >= 2998.0 - 100.0
    assert series["lag"][-1] == 999


def test_readings_every_3_s_for_two_minutes_make_a_point_a_step() -> None:
    """#45: a point replaced by each reading within 10 s of the last *reading* left one point
    for as long as readings came every 3 s (a running worker's page never grew)."""
    board = Board("app", "stream", step=10.0)
    for i in range(41):  # 0, 3, ..., 120 s
        at = 1000.0 + 3 * i
        board.observe([lease("s0")], {"w1": status(at, {"s0": (i, i)})}, at)
    times = board.snapshot()["series"]["s0"]["t"]
    assert 11 <= len(times) <= 13, times
    assert all(b - a >= 3.0 for a, b in itertools.pairwise(times))
    assert times[-1] == 1120.0  # the newest reading is always drawn


def test_leases_gone_from_the_table_leave_the_board() -> None:
    board = Board("app", "stream")
    figures = {"s0": (1, 1), "s1": (1, 1)}
    board.observe([lease("s0"), lease("s1")], {"w1": status(100.0, figures)}, 100.0)
    board.observe([lease("s1")], {"w1": status(110.0, {})}, 110.0)
    snap = board.snapshot()
    assert [x["lease_key"] for x in snap["leases"]] == ["s1"]
    assert set(snap["series"]) == {"s1"}


def test_what_the_board_keeps_per_lease_is_bounded_by_the_live_leases() -> None:
    """#49 item 12: counts and rates of leases that had no series (beyond ``max_series``) were
    kept for every lease ever seen: 1,300 entries for 160 live leases after 20 reshards."""
    board = Board("app", "stream", max_series=10)
    for round_ in range(20):  # every round a reshard replaces every lease
        keys = [f"shardId-{round_:03d}-{i:03d}" for i in range(160)]
        figures = {k: (round_, 0) for k in keys}
        at = 100.0 + 20 * round_
        board.observe([lease(k) for k in keys], {"w1": status(at, figures)}, at)
        assert board.series_limited
        assert len(board._counts) <= 160 and len(board._rates) <= 160
        assert len(board.snapshot()["series"]) <= 10


def test_states_graph_places_and_parent_keys() -> None:
    parent = lease("p", None, checkpoint=SHARD_END, child_shard_ids=frozenset({"c"}))
    child = lease("c", None, checkpoint=TRIM_HORIZON, parent_shard_ids=frozenset({"p"}),
                  closed_until=500.0)  # fmt: skip
    board = Board("app", "stream")
    board.observe([parent, child], {}, 100.0)
    rows = {x["lease_key"]: x for x in board.snapshot()["leases"]}
    assert rows["p"]["state"] == "COMPLETED" and rows["p"]["column"] == 0
    assert rows["c"]["state"] == "CLOSED" and rows["c"]["reopen_at"] == 500.0
    assert rows["c"]["column"] == 1 and rows["c"]["parent_keys"] == ["p"]


def test_multi_stream_parents_are_drawn_within_their_stream() -> None:
    a = "123:s1:1:shardId-0"
    b = "123:s2:1:shardId-0"
    child = Lease("123:s1:1:shardId-1", TRIM_HORIZON, parent_shard_ids=frozenset({"shardId-0"}))
    board = Board("app", "s1,s2")
    board.observe([Lease(a, SHARD_END), Lease(b, SEQ), child], {}, 100.0)
    rows = {x["lease_key"]: x for x in board.snapshot()["leases"]}
    assert rows[child.lease_key]["parent_keys"] == [a]
    assert rows[child.lease_key]["column"] == 1 and rows[b]["column"] == 0


def test_workers_show_their_leases_liveness_and_sink_figures() -> None:
    board = Board("app", "stream", worker_ttl=30.0)
    sink = {"batches": 4, "rows": 400, "failed_attempts": 1, "dead_lettered_batches": 0,
            "parked_batches": 0}  # fmt: skip
    statuses = {
        "w1": status(100.0, {"s0": (1, 0)}, leader=True, assigns=True, sink=sink),
        "w2": status(50.0, {}),  # silent for 60 s: gone
        "w3": {**status(99.0, {}), "stopped": True},
    }
    board.observe([lease("s0", "w1"), lease("s1", "w1"), lease("s2", "w2")], statuses, 110.0)
    workers = {w["worker_id"]: w for w in board.snapshot()["workers"]}
    assert workers["w1"]["leases"] == 2 and workers["w1"]["live"] and workers["w1"]["leader"]
    assert workers["w1"]["assigns"] and not workers["w2"]["assigns"]
    assert workers["w1"]["sink"] == sink
    assert not workers["w2"]["live"] and workers["w2"]["leases"] == 1
    assert not workers["w3"]["live"] and workers["w3"]["sink"] is None


def event(at: float, key: str, kind: str, worker: str = "w1") -> dict[str, Any]:
    return {"at": at, "lease_key": key, "kind": kind, "worker": worker, "detail": "why"}


def test_events_are_merged_once_newest_first_and_bounded() -> None:
    board = Board("app", "stream", max_events=5)
    first = [event(10.0, "s0", "took"), event(12.0, "s1", "parked")]
    board.observe([], {"w1": status(100.0, {}, events=first)}, 100.0)
    board.observe(
        [],
        {"w1": status(110.0, {}, events=first), "w2": status(110.0, {}, events=[
            event(11.0, "s0", "lost", "w2")])},
        110.0,
    )  # fmt: skip
    events = board.snapshot()["events"]
    assert [(e["at"], e["kind"]) for e in events] == [(11.0, "lost"), (12.0, "parked"),
                                                      (10.0, "took")]  # fmt: skip
    many = [event(200.0 + i, f"s{i}", "took") for i in range(50)]
    board.observe([], {"w1": status(300.0, {}, events=many)}, 300.0)
    events = board.snapshot()["events"]
    assert len(events) == 5 and events[0]["at"] == 249.0


def test_what_the_board_remembers_of_events_is_bounded() -> None:
    board = Board("app", "stream", max_events=10)
    for round_ in range(200):
        published = [event(float(round_ * 10 + i), f"s{i}", "took") for i in range(10)]
        board.observe([], {"w1": status(float(round_), {}, events=published)}, float(round_))
    assert len(board._seen_events) <= 20


def test_series_are_capped_and_a_lease_without_figures_has_none() -> None:
    board = Board("app", "stream", max_series=3)
    leases = [lease(f"s{i}") for i in range(10)]
    board.observe([*leases, lease("idle", None)], {"w1": status(100.0, {
        f"s{i}": (i, i) for i in range(10)})}, 100.0)  # fmt: skip
    snap = board.snapshot()
    assert len(snap["series"]) == 3 and snap["series_limited"] and "idle" not in snap["series"]


def test_a_series_without_new_figures_ages_out() -> None:
    board = Board("app", "stream", window=100.0)
    board.observe([lease("s0")], {"w1": status(100.0, {"s0": (1, 5)})}, 100.0)
    board.observe([lease("s0", "w2")], {}, 150.0)  # moved; its new owner's record not read
    assert board.snapshot()["series"]["s0"]["lag"] == [5]
    board.observe([lease("s0", "w2")], {}, 201.0)
    assert board.snapshot()["series"] == {}


def test_compact_published_events_are_read_with_the_records_worker_beside_old_dicts() -> None:
    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.publish import published_events

    log = EventLog("w2", lambda: 1000.04)
    log.add("s1", "took", "it had no owner")
    compact = published_events(log.recent(), now_wall=1001.0)
    assert compact == [[1000.0, "took", "s1", "it had no owner"]]
    board = Board("app", "stream")
    statuses = {
        "w1": status(1001.0, {}, events=[event(999.0, "s0", "lost")]),  # an older worker's form
        "w2": status(1001.0, {}, events=[*compact, ["junk"], [1.0, 2, "s", ""], "x"]),
    }
    board.observe([], statuses, 1001.0)
    events = board.snapshot()["events"]
    assert events == [
        {
            "at": 1000.0,
            "lease_key": "s1",
            "kind": "took",
            "worker": "w2",
            "detail": "it had no owner",
        },
        {"at": 999.0, "lease_key": "s0", "kind": "lost", "worker": "w1", "detail": "why"},
    ]
    board.observe([], statuses, 1002.0)  # published again: not merged twice
    assert len(board.snapshot()["events"]) == 2


def test_a_published_event_is_under_half_the_bytes_of_its_dict() -> None:
    import json

    from kclpy_spark.runtime.events import EventLog
    from kclpy_spark.runtime.publish import published_events

    log = EventLog("worker-ip-10-0-0-17-3f9c2a", lambda: 1764369512.123456)
    log.add("shardId-000000000003", "took", "it had no owner")
    [as_dict] = log.recent()
    [compact] = published_events(log.recent(), now_wall=1764369513.0)
    assert len(json.dumps(compact)) < len(json.dumps(as_dict)) / 2


def test_the_page_says_when_each_checkpoint_last_moved() -> None:
    """#45: time since the last checkpoint, as the page's looks saw it move (no extra field in
    the table or the status records)."""
    board = Board("app", "stream")
    later = ExtendedSequenceNumber("49600000000000000000000000000000000000000000000000000009")
    board.observe([lease("s0"), lease("s1")], {"w1": status(100.0, {})}, 100.0)
    board.observe([lease("s0"), lease("s1", checkpoint=later)], {"w1": status(110.0, {})}, 110.0)
    board.observe([lease("s0"), lease("s1", checkpoint=later)], {"w1": status(120.0, {})}, 120.0)
    moved = {x["lease_key"]: x["checkpoint_moved_at"] for x in board.snapshot()["leases"]}
    assert moved == {"s0": None, "s1": 110.0}  # s0 not seen moving; s1 seen at the 110 s look
    board.observe([lease("s1", checkpoint=SHARD_END)], {"w1": status(130.0, {})}, 130.0)
    assert [x["checkpoint_moved_at"] for x in board.snapshot()["leases"]] == [130.0]
    assert set(board._checkpoints) == {"s1"}  # bounded by the leases in the table


def test_workers_show_bytes_per_second_errors_throttles_and_the_pages_version() -> None:
    import kclpy_spark

    board = Board("app", "stream")
    board.observe([lease("s0")], {"w1": status(100.0, {}, bytes=1_000)}, 100.0)
    board.observe([lease("s0")], {"w1": status(105.0, {}, bytes=2_000)}, 105.0)  # < a step
    assert board.snapshot()["workers"][0]["bytes_per_s"] is None
    board.observe([lease("s0")], {"w1": status(110.0, {}, bytes=21_000, failures=2,
                                               throttled=3)}, 110.0)  # fmt: skip
    snap = board.snapshot()
    worker = snap["workers"][0]
    assert (worker["bytes_per_s"], worker["failures"], worker["throttled"]) == (2_000.0, 2, 3)
    assert snap["version"] == kclpy_spark.__version__
    board.observe([lease("s0")], {"w1": status(120.0, {}, bytes=10)}, 120.0)  # restarted
    assert board.snapshot()["workers"][0]["bytes_per_s"] is None
    board.observe([lease("s0")], {}, 130.0)  # its record gone: nothing kept for it
    assert board._bytes == {} and board._byte_rates == {}
