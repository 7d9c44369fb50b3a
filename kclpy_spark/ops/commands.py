"""Operator commands: ``status``, ``reset``, ``suspend`` and ``resume``.

Each reads the application's config (the same TOML and flags as ``run``) to find the lease store.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from checkpoint import coordination
from checkpoint.base.errors import ConfigError, KclpySparkError
from checkpoint.coordination import is_live
from checkpoint.lease import Lease, split_lease_key, stream_key_parts, stream_name_of
from kclpy_spark.config import WorkerConfig
from kclpy_spark.ops.status import lease_rows, render_json, render_table
from kclpy_spark.runtime.lease_store import CallBudget, LeaseStore, open_lease_store

# How often ``status --watch`` / ``--serve`` may read the table: each read is a whole-table Scan.
WATCH_SECONDS = (1.0, 86_400.0)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    if not WATCH_SECONDS[0] <= value <= WATCH_SECONDS[1]:  # 1e-9: a table read per call
        raise argparse.ArgumentTypeError(
            f"must be between {WATCH_SECONDS[0]:g} and {WATCH_SECONDS[1]:g} seconds, got {text!r}"
        )
    return value


def add_subcommands(sub: Any, add_table_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    status = sub.add_parser("status", help="the application's leases: owner, state, lag, ...")
    add_table_flags(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--watch", type=_positive_seconds, metavar="SECONDS", help="refresh every SECONDS"
    )
    status.add_argument(
        "--serve",
        metavar="[HOST:]PORT",
        help="serve the read-only status page on HOST:PORT (127.0.0.1 unless a host is given); "
        "the table is read every --watch seconds (default 10)",
    )
    status.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="with --serve: a host name the page answers to besides addresses, localhost and "
        "this machine's names (repeatable)",
    )
    reset = sub.add_parser("reset", help="move checkpoints to TRIM_HORIZON, LATEST or a time")
    add_table_flags(reset)
    reset.add_argument("--to", required=True, help="TRIM_HORIZON, LATEST or AT_TIMESTAMP:<time>")
    reset.add_argument("--shard", action="append", help="only this shard (repeatable)")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    reset.add_argument("--force", action="store_true", help="even while live workers hold leases")
    for name, what in (("suspend", "stop every worker taking and processing leases"),
                       ("resume", "let the workers take and process leases again")):  # fmt: skip
        p = sub.add_parser(name, help=what)
        add_table_flags(p)
        if name == "suspend":
            p.add_argument(
                "--wait", type=_wait_seconds, metavar="SECONDS",
                help="wait at most this long for the live workers to release their leases "
                "(default: three failover times and the shutdown grace; 0: return at once)",
            )  # fmt: skip


def _wait_seconds(text: str) -> float:
    return 0.0 if text.strip() in {"0", "0.0"} else _positive_seconds(text)


def publishing_workers(
    statuses: dict[str, dict[str, Any]], now: float, cfg: WorkerConfig
) -> dict[str, dict[str, Any]]:
    """The workers whose status records are fresh (holding leases or not, suspended or not,
    not stopped), each with what an operator asks of it: ready or why not, suspended, stopping."""
    max_age = status_max_age(cfg)
    return {
        worker: {
            "ready": data.get("ready"),
            "readiness": data.get("readiness"),
            "suspended": bool(data.get("suspended")),
            "stopping": bool(data.get("stopping")),
        }
        for worker, data in statuses.items()
        if not data.get("stopped") and is_live(data, now, max_age)
    }


def _worker_state(worker: dict[str, Any]) -> str:
    if worker["stopping"]:
        return "stopping"
    if worker["suspended"]:
        return "suspended"
    if worker["ready"] is False:
        return f"not ready: {worker['readiness']}"
    return "ready" if worker["ready"] else "?"


def status_max_age(cfg: WorkerConfig) -> float:
    """How old a worker's status record may be for an operator command to count it as running:
    a worker publishes every failover/3, so three failover times of silence means it is gone."""
    return max(3 * cfg.failover_time, 10.0)


def live_workers(store: LeaseStore, owners: set[str], cfg: WorkerConfig) -> dict[str, Any]:
    return live_of({owner: coordination.worker_status(store, owner) for owner in owners}, cfg)


def live_of(statuses: dict[str, dict[str, Any]], cfg: WorkerConfig) -> dict[str, Any]:
    """The workers of ``statuses`` (worker -> its status record, {} for none) that are live."""
    max_age = status_max_age(cfg)
    now = time.time()
    # A record that says its worker stopped is no live worker, however fresh (as ``status``).
    return {w: s for w, s in statuses.items() if is_live(s, now, max_age) and not s.get("stopped")}


def silent_after(cfg: WorkerConfig) -> float:
    """How long after a lease's last stamped renewal its owner of ours counts as stopped (the
    lease expired by its stamp): ``failover_time + max_clock_skew``."""
    return cfg.failover_time + cfg.max_clock_skew


def renewed_lately(lease: Lease, now_wall: float, cfg: WorkerConfig) -> bool:
    """Whether ``lease`` is unfinished and its holder may still be processing it: its counter
    was not stamped (a KCL worker's renewal, a lease never held) or was stamped within
    ``silent_after`` (a killed worker of ours leaves an older stamp; it has nothing left to
    release, though its status record counts it live for longer)."""
    stamp = lease.write_time
    fresh = stamp is None or now_wall - stamp <= silent_after(cfg)
    return fresh and not lease.checkpoint.is_shard_end


def of_streams(
    leases: Iterable[Lease], streams: Iterable[tuple[str | None, str]] | None
) -> list[Lease]:
    """The leases of ``streams``, each (its account, None when only a name is configured;
    its name); None: a single-stream application, whose lease keys are plain shard ids.
    Another application's stream in a shared table (another account's of the same name too,
    when the configured one names its account by an ARN), or a stream removed from
    ``[[streams]]`` that another worker may still read, is never reset."""
    if streams is None:
        return [x for x in leases if stream_name_of(x.lease_key) is None]
    wanted = set(streams)
    chosen = []
    for lease in leases:
        parts = stream_key_parts(split_lease_key(lease.lease_key)[0])
        if parts is not None and {(parts[0], parts[1]), (None, parts[1])} & wanted:
            chosen.append(lease)
    return chosen


def stream_names(cfg: WorkerConfig) -> list[tuple[str | None, str]] | None:
    """A multi-stream application's streams, (account if its ARN names it, name); None for a
    single stream."""
    if not cfg.streams:
        return None
    return [(spec.account, spec.name) for spec in cfg.streams]


def open_store(cfg: WorkerConfig, *, writes_records: bool = False) -> LeaseStore:
    """The lease store of an operator command, never creating the lease table (a typo must not
    make one). DynamoDB's coordination table: created when missing by a command that writes
    records and may create tables; else a missing one reads as no records."""
    return open_lease_store(
        cfg if not cfg.create_lease_table else cfg.with_overrides(create_lease_table=False),
        create_records=writes_records and cfg.create_lease_table,
        records_optional=not writes_records,
        reads_only=not writes_records,  # status: a SQLite file it may only read will do
        budget=OPERATOR_CALLS,
    )


# An operator command's lease-table calls: no lease of its own to protect (its writes are
# conditional on each lease's counter), so a slow table gets seconds and a few tries. With a
# daemon's budget (half a lease: 1.5 s at a 3 s failover time) a `reset` failed on one slow read.
OPERATOR_CALLS = CallBudget(attempt=5.0, total=15.0, attempts=30)


def serve_command(args: argparse.Namespace, cfg: WorkerConfig) -> int:
    import asyncio

    from kclpy_spark.board.model import Board
    from kclpy_spark.board.standalone import Look, parse_address, serve

    host, port = parse_address(args.serve)
    store = open_store(cfg)
    board = Board(
        cfg.application_name, cfg.stream, worker_ttl=status_max_age(cfg),
        silent_after=silent_after(cfg),
    )  # fmt: skip
    names = tuple(args.allow_host or ())
    asyncio.run(serve(board, Look(store), host, port, args.watch or 10.0, names))
    return 0


def status_command(args: argparse.Namespace, cfg: WorkerConfig) -> int:
    if args.serve:
        return serve_command(args, cfg)
    store = open_store(cfg)
    while True:
        try:
            # Leases and every worker's status record in one read: a worker holding no lease
            # (spare, or suspended) is shown too.
            table = store.scan_table(coordination.WORKER_PREFIX)
            suspended = coordination.is_suspended(store)
        except KclpySparkError as exc:
            if not args.watch or not exc.retriable:
                raise
            # --watch goes on through a passing failure (throttled, a timeout), as --serve does
            print(f"kclpy-spark: reading the lease table failed ({exc}); trying again",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(args.watch)
            continue
        now = time.time()
        leases = list(table.leases)
        statuses = coordination.worker_statuses(table.records)
        # Its owner silent past the lease's expiry (by the owner's stamp): EXPIRED, no lag.
        rows = lease_rows(leases, statuses, now, silent_after=silent_after(cfg))
        live = publishing_workers(statuses, now, cfg)
        extra = {
            "application": cfg.application_name,
            "stream": cfg.stream,
            "suspended": suspended,
            "live_workers": sorted(live),
            "workers": live,
        }
        if args.json:
            print(render_json(rows, extra), flush=True)
        else:
            state = "SUSPENDED" if extra["suspended"] else "running"
            workers = ", ".join(f"{w} ({_worker_state(v)})" for w, v in sorted(live.items()))
            workers = workers or "none"
            print(f"application {cfg.application_name} on {cfg.stream}: {state}; "
                  f"{len(rows)} lease(s), live workers: {workers}")  # fmt: skip
            print(render_table(rows, now), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)
        if not args.json:
            print("\033[2J\033[H", end="")


def suspend_command(
    cfg: WorkerConfig,
    suspended: bool,
    wait: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Set (or clear) the suspend flag. Suspending then waits, at most ``wait`` seconds (None:
    three failover times and the shutdown grace), until no live worker of ours holds a lease: a
    ``reset`` right after it was refused for leases the workers were still releasing."""
    store = open_store(cfg, writes_records=True)
    if not coordination.set_suspended(store, suspended, by="kclpy-spark CLI", now_wall=time.time()):
        raise ConfigError("could not write the suspend flag (too many concurrent writers)")
    print(f"{cfg.application_name}: {'suspended' if suspended else 'resumed'}", flush=True)
    note_if_unknown(store, cfg)
    if not suspended:
        return 0
    budget = 3 * cfg.failover_time + cfg.shutdown_grace if wait is None else wait
    deadline = time.monotonic() + budget
    while True:
        ours, others = _lease_holders(store, cfg)
        if not ours or time.monotonic() >= deadline:
            break
        sleep(min(max(0.5, cfg.failover_time / 3), max(0.0, deadline - time.monotonic())))
    if others:
        print(f"kclpy-spark: workers that publish no status record of ours (KCL workers?) hold "
              f"leases and do not follow the suspend flag: {', '.join(sorted(others))}",
              file=sys.stderr)  # fmt: skip
    if budget == 0:
        return 0
    if ours:
        print(f"kclpy-spark: live workers still hold leases after {budget:g} s: "
              f"{', '.join(sorted(ours))}", file=sys.stderr)  # fmt: skip
        return 1
    print("no live worker of ours holds a lease")
    return 0


def _lease_holders(store: LeaseStore, cfg: WorkerConfig) -> tuple[set[str], set[str]]:
    """The live workers of ours (fresh status records, not stopped) holding an unfinished lease
    their last renewal keeps (a killed one's lease, past its expiry by its stamp, is nobody's to
    release), and the owners of others with no status record of ours (KCL workers)."""
    table = store.scan_table(coordination.WORKER_PREFIX)
    now = time.time()
    statuses = coordination.worker_statuses(table.records)
    live = publishing_workers(statuses, now, cfg)
    ours: set[str] = set()
    others: set[str] = set()
    for lease in of_streams(table.leases, stream_names(cfg)):  # this application's, as reset
        if not renewed_lately(lease, now, cfg):
            continue
        for owner in filter(None, (lease.lease_owner, lease.checkpoint_owner)):
            if owner in live:
                ours.add(owner)
            elif owner not in statuses:
                others.add(owner)
    return ours, others


def note_if_unknown(store: LeaseStore, cfg: WorkerConfig) -> None:
    """A note on stderr when the application has no lease and no worker status record: with a
    SQLite or memory store any name opens, so a mistyped application_name did nothing, quietly
    (a DynamoDB table of a mistyped name does not open). Never an error of its own."""
    if cfg.lease_store == "dynamodb":
        return
    try:
        table = store.scan_table(coordination.WORKER_PREFIX)
    except KclpySparkError:
        return
    if not table.leases and not table.records:
        print(f"kclpy-spark: note: application {cfg.application_name!r} has no lease and no "
              f"worker has published in {cfg.lease_store}: is the application name right?",
              file=sys.stderr)  # fmt: skip
