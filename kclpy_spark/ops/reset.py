"""``kclpy-spark reset``: move checkpoints to TRIM_HORIZON, LATEST or a time, for all shards or the
ones named. ``plan_reset`` is pure (tested without a service); ``reset_command`` asks, refuses
under live workers unless forced, and writes each lease with a conditional write.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from checkpoint import coordination
from checkpoint.base.errors import ConfigError, KclpySparkError
from checkpoint.lease import Lease
from checkpoint.sequence import ExtendedSequenceNumber, InitialPosition
from kclpy_spark.config import WorkerConfig
from kclpy_spark.config_rules import check_not_in_future
from kclpy_spark.ops.commands import (
    live_of,
    note_if_unknown,
    of_streams,
    open_store,
    renewed_lately,
    stream_names,
)
from kclpy_spark.runtime.lease_store import LeaseStore


@dataclass(frozen=True)
class ResetPlan:
    changes: tuple[tuple[Lease, Lease], ...]  # (as read, as it will be written)
    live_owners: tuple[str, ...]
    unknown_shards: tuple[str, ...]
    # Shard ids that name leases of several streams (a multi-stream table): give the lease key.
    ambiguous_shards: tuple[str, ...] = ()


def chosen_leases(
    leases: Iterable[Lease], shards: Iterable[str] | None
) -> tuple[list[Lease], tuple[str, ...], tuple[str, ...]]:
    """(the leases ``shards`` names, names that match none, shard ids that match leases of more
    than one stream). A name is a lease key or a shard id; None names every lease. Leases are
    told apart by key: in a multi-stream table, two streams' ``shardId-000000000000`` are two."""
    by_key = {lease.lease_key: lease for lease in leases}
    if shards is None:
        return [by_key[key] for key in sorted(by_key)], (), ()
    chosen: dict[str, Lease] = {}
    unknown, ambiguous = [], []
    for name in dict.fromkeys(shards):
        keys = [name] if name in by_key else [k for k, x in by_key.items() if x.shard_id == name]
        if not keys:
            unknown.append(name)
        elif len(keys) > 1:
            ambiguous.append(name)
        else:
            chosen[keys[0]] = by_key[keys[0]]
    return [chosen[key] for key in sorted(chosen)], tuple(sorted(unknown)), tuple(ambiguous)


def plan_reset(
    leases: Iterable[Lease],
    target: InitialPosition,
    *,
    shards: Iterable[str] | None,
    live_workers: Iterable[str],
    held: Callable[[Lease], bool] = lambda lease: True,
) -> ResetPlan:
    """Which leases move to ``target`` (all, or those ``shards`` names: ``chosen_leases``), and
    who still holds them.

    Finished (SHARD_END) leases are left alone: their records are all delivered and their children
    depend on them being finished. A reset to AT_TIMESTAMP stores its time in each lease it moves
    (``start_timestamp``), so it applies to exactly those leases. ``held``: whether a lease's
    live owner may still be processing it (``renewed_lately``; else it holds it no more).
    """
    chosen, unknown, ambiguous = chosen_leases(leases, shards)
    live = set(live_workers)
    changes = []
    owners = set()
    for lease in chosen:
        if lease.checkpoint.is_shard_end:
            continue
        # Mid-handoff the lease's old owner processes it still (its checkpoint owner), whoever
        # the new one is.
        if held(lease):
            owners |= {o for o in (lease.lease_owner, lease.checkpoint_owner) if o and o in live}
        changes.append((lease, reset_lease(lease, target)))
    return ResetPlan(tuple(changes), tuple(sorted(owners)), unknown, ambiguous)


def reset_lease(lease: Lease, target: InitialPosition) -> Lease:
    """``lease`` checkpointed at ``target`` (its time stored for AT_TIMESTAMP), and reopened if
    it was parked: a reset is the mending a parking waits for (an aged checkpoint, a record to
    skip), and the lease otherwise sat out the rest of its ``park_duration``."""
    checkpoint = ExtendedSequenceNumber.of(target.position.value)
    start = None if target.timestamp is None else target.timestamp.timestamp()
    return replace(
        lease.checkpointed(checkpoint), start_timestamp=start, closed_until=None, closed_count=0
    )


FORCED_TRIES = 3  # --force: a held lease's counter moves at every renewal; read again and write


def _write_reset(store: LeaseStore, before: Lease, after: Lease, target: InitialPosition,
                 *, force: bool) -> bool:  # fmt: skip
    """Write one lease's reset. Without --force, only if it did not change since the plan (a
    worker that took it meanwhile keeps it); with --force, read again first: the plan's counter
    is stale by the time a person answers the prompt (a held lease renews every few seconds)."""
    if not force:
        return store.update_lease(after) is not None
    for _ in range(FORCED_TRIES):
        fresh = store.get_lease(before.lease_key)
        if fresh is None or fresh.checkpoint.is_shard_end:
            return False
        if fresh.lease_owner is None:
            if store.update_lease(reset_lease(fresh, target)) is not None:
                return True
            continue
        # Held: taken from its holder first. A write that keeps the owner at the next counter
        # is what a KCL worker takes for its own renewal landed late: it processed on from
        # memory and its next checkpoint wrote over the reset. An owner change is the lease
        # lost to every worker; reset, the lease is then left free for anyone to take.
        taken = store.take_lease(fresh, RESET_OWNER)
        written = None if taken is None else store.update_lease(reset_lease(taken, target))
        if written is not None:
            store.evict_lease(written)  # else it expires, unrenewed, a failover time later
            return True
    return False


def _held_by_live_workers(store: LeaseStore, owners: Iterable[str], ours: set[str]) -> ConfigError:
    """Why a reset without --force is refused: live workers hold the leases (ours releasing
    them, if the application is suspended; others, KCL workers, never follow the flag)."""
    held = f"live workers hold leases to reset ({', '.join(owners)})"
    if coordination.is_suspended(store) and set(owners) <= ours:
        return ConfigError(
            f"{held}: the application is suspended and they are releasing them; try again in "
            "a few seconds (`kclpy-spark suspend` waits for it), or pass --force"
        )
    if set(owners) - ours:
        kcl = ", ".join(sorted(set(owners) - ours))
        return ConfigError(
            f"{held}: {kcl} publish(es) no status record of ours (a KCL worker?) and do(es) "
            "not follow the suspend flag: stop them, or pass --force"
        )
    return ConfigError(f"{held}: stop them, or `kclpy-spark suspend` first, or pass --force")


def _shown(target: InitialPosition) -> str:
    """``target`` as a reset plan shows it: with its time as read (epoch seconds, ISO)."""
    if target.timestamp is None:
        return target.position.value
    return f"{target.position.value} {target.timestamp.isoformat()}"


RESET_OWNER = "kclpy-spark-reset"  # the owner of a held lease while `reset --force` writes it


def reset_command(args: argparse.Namespace, cfg: WorkerConfig) -> int:
    try:
        target = InitialPosition.parse(args.to)
    except ValueError as exc:
        raise ConfigError(f"--to: {exc}") from None
    check_not_in_future(target, "--to", time.time())
    store = open_store(cfg, writes_records=True)
    whole = not cfg.streams and args.shard is None
    # Built before any write: a region or profile problem is one line with nothing changed.
    lister = _stream_lister(cfg) if whole else None
    leases = of_streams(store.list_leases(), stream_names(cfg))
    owners = {o for x in leases for o in (x.lease_owner, x.checkpoint_owner) if o}
    records = {owner: coordination.worker_status(store, owner) for owner in owners}
    live = set(live_of(records, cfg))
    ours = {owner for owner, record in records.items() if record}  # they follow the flag
    unknown = {
        o
        for x in leases
        if not x.checkpoint.is_shard_end
        for o in (x.lease_owner, x.checkpoint_owner)
        if o and o not in live
    }
    if unknown and not args.force:  # a KCL worker publishes no status record: watch its renewals
        live |= renewing_owners(store, leases, unknown, cfg.failover_time / 3 + 0.5, time.sleep)
    now = time.time()
    plan = plan_reset(leases, target, shards=args.shard, live_workers=live,
                      held=lambda lease: renewed_lately(lease, now, cfg))  # fmt: skip
    if plan.unknown_shards:
        raise ConfigError(f"no lease for shard(s): {', '.join(plan.unknown_shards)}")
    if plan.ambiguous_shards:
        raise ConfigError(
            f"shard(s) {', '.join(plan.ambiguous_shards)} name leases of several streams: give "
            "the lease key instead (account:stream:creationEpoch:shardId, as `status --json` "
            "shows it)"
        )
    if plan.live_owners and not args.force:
        raise _held_by_live_workers(store, plan.live_owners, ours)
    if not plan.changes:
        print("nothing to reset")
        if not leases:
            note_if_unknown(store, cfg)
        return 0
    print(f"reset {len(plan.changes)} lease(s) of {cfg.application_name} to {args.to}:")
    for before, _ in plan.changes:
        print(f"  {before.lease_key}: {before.checkpoint} -> {_shown(target)}")
    if not args.yes and not _confirmed():
        print("cancelled")
        return 1
    failed = [
        before.lease_key
        for before, after in plan.changes
        if not _write_reset(store, before, after, target, force=args.force)
    ]
    if lister is not None and not failed:  # a lease left as it was may be the old stream's
        _record_stream(store, cfg, lister)
    if failed:
        print(f"these leases changed meanwhile and were not reset: {', '.join(failed)}")
        return 1
    print("done")
    return 0


def _confirmed() -> bool:
    """The person at the terminal said yes (Ctrl-D: no); ConfigError without a terminal."""
    if not sys.stdin.isatty():
        raise ConfigError("reset needs confirmation: run it in a terminal or pass --yes")
    try:
        answer = input("proceed? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def renewing_owners(
    store: LeaseStore,
    leases: Iterable[Lease],
    owners: set[str],
    wait: float,
    sleep: Callable[[float], None],
) -> set[str]:
    """Those of ``owners`` that renew a lease of ``leases`` within ``wait`` seconds (its counter
    moves): alive, though they publish no status record (a KCL or kcl-rs worker)."""
    watched = {x.lease_key: x.lease_counter for x in leases if x.actual_owner in owners}
    if not watched:
        return set()
    sleep(wait)
    return {
        str(x.actual_owner) for x in store.list_leases()  # mid-handoff: the old owner renews
        if x.actual_owner in owners and x.lease_key in watched
        and x.lease_counter != watched[x.lease_key]
    }  # fmt: skip


def _stream_lister(cfg: WorkerConfig) -> Any:
    from kclpy_spark.aws import boto3_client
    from shard_sync.discovery import KinesisShardLister

    return KinesisShardLister(
        boto3_client("kinesis", cfg), stream_name=cfg.stream_name, stream_arn=cfg.stream_arn
    )


def _record_stream(store: LeaseStore, cfg: WorkerConfig, lister: Any) -> None:
    """A reset of every lease starts the application over on the stream as it is now: remember
    its creation time, so a stream re-created under the same name is accepted from here on."""
    try:
        _, created = lister.describe()
    except KclpySparkError as exc:
        print(f"note: the stream's creation time was not recorded ({exc})")
        return
    if created is not None:  # under the label the config gives, and under the stream's name:
        spec = cfg.stream_specs[0]  # workers naming it by ARN accept the record of its name
        for label in dict.fromkeys((spec.label, spec.name)):
            coordination.set_stream_created(store, label, created, now_wall=time.time())
