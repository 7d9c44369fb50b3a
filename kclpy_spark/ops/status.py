"""``kclpy-spark status``: an application's leases seen from the lease store.

Pure functions over a lease scan and the workers' published status records, so the table is tested
without any service. "Live" workers are judged by the wall-clock age of their
published status: fine for an operator's command, never used for lease decisions.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from checkpoint.lease import Lease, LeaseState, stream_name_of


@dataclass(frozen=True)
class LeaseRow:
    shard_id: str
    lease_key: str
    owner: str | None
    state: str
    checkpoint: str
    millis_behind_latest: int | None
    records: int | None
    parents: tuple[str, ...]
    children: tuple[str, ...]
    last_renewal: float | None  # wall seconds, as the owner published it
    reopen_at: float | None
    # With a Spark sink, as the owner published them: the lease's batches cut and not yet
    # checkpointed, and its records waiting to be cut.
    sink_in_flight: int | None = None
    sink_buffered: int | None = None


# A lease whose owner last renewed it longer ago than its expiry (``silent_after``): its owner
# stopped (killed, or the whole fleet is down). Its last figures are no news: a lag of 0 shown
# on drew a stopped application as a healthy one while records piled up unread.
EXPIRED = "EXPIRED"


def lease_rows(
    leases: Iterable[Lease],
    statuses: Mapping[str, Mapping[str, Any]],
    now_wall: float,
    *,
    silent_after: float | None = None,
) -> list[LeaseRow]:
    rows = []
    for lease in sorted(leases, key=lambda x: x.lease_key):
        published: Mapping[str, Any] = {}
        owner = lease.actual_owner  # the worker processing it (the old owner mid-handoff)
        if owner:
            published = owner_figures(lease, statuses.get(owner, {}))
        state = lease.state(now_wall).value
        if state == LeaseState.ASSIGNED and _silent(published, now_wall, silent_after):
            state = EXPIRED
            published = {**published, "millis_behind_latest": None}
        rows.append(
            LeaseRow(
                shard_id=lease.shard_id,
                lease_key=lease.lease_key,
                owner=owner,
                state=state,
                checkpoint=str(lease.checkpoint),
                millis_behind_latest=published.get("millis_behind_latest"),
                records=published.get("records"),
                parents=tuple(sorted(lease.parent_shard_ids)),
                children=tuple(sorted(lease.child_shard_ids)),
                last_renewal=published.get("last_renewal"),
                reopen_at=lease.closed_until,
                sink_in_flight=_int(published.get("sink_in_flight")),
                sink_buffered=_int(published.get("sink_buffered")),
            )
        )
    return rows


def _silent(published: Mapping[str, Any], now_wall: float, after: float | None) -> bool:
    """Whether the owner's last renewal it published is more than ``after`` seconds old."""
    renewed = published.get("last_renewal")
    if after is None or not isinstance(renewed, int | float):
        return False
    return now_wall - float(renewed) > after


def owner_figures(lease: Lease, status: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the lease's owner measured: from the lease itself (its renewals write the figures,
    with the time they were measured), else from the owner's status record (versions before that
    published them there), with the owner's Spark-sink figures from its status record."""
    published: Mapping[str, Any] = status.get("leases", {}).get(lease.lease_key, {})
    figures = lease.owner_figures  # None if another owner wrote them (an earlier tenure)
    if figures is None:
        return published
    return {
        **published,
        "records": figures.records,
        "millis_behind_latest": figures.millis_behind_latest,
        # The last counter move (a renewal or a checkpoint) shows the owner alive; the figures'
        # own time is when they were measured (the status page dates its rates by it).
        "last_renewal": lease.write_time if lease.write_time is not None else figures.at,
    }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sink(row: LeaseRow) -> str:
    if row.sink_in_flight is None and row.sink_buffered is None:
        return "-"
    return f"{row.sink_in_flight or 0} out, {row.sink_buffered or 0} buffered"


def render_json(rows: list[LeaseRow], extra: Mapping[str, Any]) -> str:
    return json.dumps({**extra, "leases": [asdict(r) for r in rows]}, indent=2)


def _age(now: float, then: float | None) -> str:
    return "-" if then is None else f"{max(0.0, now - then):.0f}s ago"


def render_table(rows: list[LeaseRow], now_wall: float) -> str:
    with_sink = any(r.sink_in_flight is not None or r.sink_buffered is not None for r in rows)
    # Several streams: a shard id names a shard of each, so the rows say their stream.
    streams = [stream_name_of(r.lease_key) for r in rows]
    with_stream = any(streams)
    header = (("stream",) if with_stream else ()) + (
        "shard", "state", "owner", "checkpoint", "lag ms", "records", "renewed", "parents",
        "children") + (("sink batches",) if with_sink else ())  # fmt: skip
    body = [
        ((stream or "-",) if with_stream else ()) + (
            r.shard_id,
            r.state if r.reopen_at is None or r.state != "CLOSED" else
            f"CLOSED (reopens in {max(0.0, r.reopen_at - now_wall):.0f}s)",
            r.owner or "-",
            r.checkpoint,
            "-" if r.millis_behind_latest is None else str(r.millis_behind_latest),
            "-" if r.records is None else str(r.records),
            _age(now_wall, r.last_renewal),
            ",".join(r.parents) or "-",
            ",".join(r.children) or "-",
        ) + ((_sink(r),) if with_sink else ())
        for r, stream in zip(rows, streams, strict=True)
    ]  # fmt: skip
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=False)]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True))
             for row in (header, *body)]  # fmt: skip
    return "\n".join(lines)
