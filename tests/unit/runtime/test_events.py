"""The worker's lease event log: bounded, and only the known kinds."""

from __future__ import annotations

import pytest

from kclpy_spark.runtime.events import EventLog


def test_the_log_keeps_the_newest_events_up_to_its_bound() -> None:
    now = [0.0]
    log = EventLog("w1", lambda: now[0], maxlen=3)
    for i in range(10):
        now[0] = float(i)
        log.add(f"s{i}", "took", "it had no owner")
    assert [e["lease_key"] for e in log.recent()] == ["s7", "s8", "s9"]
    assert log.recent(1) == [
        {"at": 9.0, "lease_key": "s9", "kind": "took", "worker": "w1", "detail": "it had no owner"}
    ]
    assert log.recent(0) == []


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown lease event kind"):
        EventLog("w1", lambda: 0.0).add("s0", "vanished")


@pytest.mark.parametrize(
    ("owner", "how", "kind", "why"),
    [
        (None, "took", "took", "it had no owner"),
        ("w2", "took", "took", "from w2, which stopped renewing it"),
        ("w2", "stole", "stole", "from w2, to balance the leases between workers"),
        ("w2", "handed", "took", "handed over to us (graceful handoff)"),
    ],
)
def test_a_take_says_why_the_lease_was_free(
    owner: str | None, how: str, kind: str, why: str
) -> None:
    from checkpoint.lease import Lease
    from checkpoint.sequence import TRIM_HORIZON
    from kclpy_spark.moves.reports import why_taken

    assert why_taken(Lease("s0", TRIM_HORIZON, lease_owner=owner), how) == (kind, why)
