"""Lease-table cost at scale, simulated: ``python bench/sim_lease_cost.py``.

Thousands of leases and dozens of workers do not fit this machine as real worker processes with
a real stream. So this runs the lease management a worker runs in steady state (every worker
alive, every lease held, no checkpoints) on one in-memory lease store, in virtual time: each
worker's real ``LeaseHolder.renew_all`` every renewal interval, a ``list_leases`` Scan every take
interval (the taker's, which reads nothing else while every lease is renewed in time, and hands
the leader record and the suspend flag it returns to the next looks), the real
``LeaderElection.tick`` every leader interval (an eventually consistent read unless a scan
returned the record since the last tick), and once per failover time the suspend flag (the
same) and the real ``StatusWriter`` publishing a status record shaped like the worker's (its ten
events more than ten minutes old, so none published; a lease's figures ride on its renewals)
when the worker's ``StatusCadence`` says it is due: in this steady state, with nothing changing,
a worker holding leases every quiet interval (three failover times), one holding none every
failover time.
Each call is costed by DynamoDB's rules (checkpoint.stores.capacity) on the item the DynamoDB
store would read or write (checkpoint.stores.dynamo_codec): a Scan pays for the whole table,
coordination records included, per 1 MB page. Not simulated: the leader's shard-sync maintenance
(a Scan every few minutes; about 0.25 a minute measured by bench_lease_requests) and anything a
moving lease costs.

With ``lease_assignment = "leader"`` (``--assignment``: worker, leader and auto by default) only
the leader scans; every other worker Queries the owner index for its own keys every renewal
interval, and the leader record (one failover time long) is renewed every third of it (else
every 1.5 failover times, at half its life of three). With ``"auto"`` (the
default) the leader decides after each of its scans by the product's rule
(``leader_assigns`` on the status records' running workers and the open leases), with the
product's election (``leader_election``, its record's life switching), so each size settles
in one mode or the other during the warm-up; the table says which.
Writes ``bench/results/sim_lease_cost.md``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, stamp, write_results
from kcl_model import Cost, kcl3

from checkpoint import coordination
from checkpoint.base.clock import ManualClock
from checkpoint.lease import HashKeyRange, Lease, OwnerFigures, owner_tag
from checkpoint.leasing.holder import LeaseHolder
from checkpoint.port import CoordinationRecord, TableScan
from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores import dynamo_codec as codec
from checkpoint.stores.capacity import item_size, read_units, write_units
from checkpoint.stores.memory import MemoryLeaseTable
from kclpy_spark.config import WorkerConfig
from kclpy_spark.moves.assigning import leader_election, lease_timing
from kclpy_spark.moves.rules.assign_rule import leader_assigns
from kclpy_spark.moves.rules.observer import LeaseObserver
from kclpy_spark.moves.taking import LOOK_MARGIN, MAX_LOOKS
from kclpy_spark.runtime.publish import StatusCadence, published_events, status_fields

SEQ = "49590338271490256608559692538361571095921575989136588898"
PAGE_BYTES = 1 << 20
READS = ("scan_table", "scan_records", "get_lease", "get_record", "list_lease_keys_by_owner")


def _scan_units(sizes: list[int]) -> float:
    """Read units of one eventually consistent Scan over items of ``sizes`` bytes (1 MB pages)."""
    units, page = 0.0, 0
    for size in sizes:
        if page + size > PAGE_BYTES:
            units += read_units([page], consistent=False)
            page = 0
        page += size
    return units + read_units([page], consistent=False)


class CostingStore:
    """A memory store whose every call is costed as the DynamoDB store's request would be."""

    def __init__(self, inner: MemoryLeaseTable) -> None:
        self.inner = inner
        self.sizes: dict[str, int] = {}  # item bytes by leaseKey (leases and records)
        self.record_keys: set[str] = set()  # those of coordination records (their own table)
        self.usage: dict[str, list[float]] = {}  # by call: [requests, units]
        self._lock = threading.Lock()

    def _add(self, call: str, units: float) -> None:  # one request of ``units``
        with self._lock:
            entry = self.usage.setdefault(call, [0, 0.0])
            entry[0] += 1
            entry[1] += units

    def _lease_written(self, call: str, key: str, result: Lease | None) -> None:
        before = self.sizes.get(key, 0)
        after = item_size(codec.lease_to_item(result)) if result is not None else before
        self._add(call, write_units(before, after))
        self.sizes[key] = after

    def create_lease_if_absent(self, lease: Lease) -> bool:
        won = self.inner.create_lease_if_absent(lease)
        self.sizes[lease.lease_key] = item_size(codec.lease_to_item(lease))
        return won

    def renew_lease(self, lease: Lease) -> Lease | None:
        result = self.inner.renew_lease(lease)
        self._lease_written("renew_lease", lease.lease_key, result)
        return result

    def get_lease(self, lease_key: str) -> Lease | None:
        """The taker's strongly consistent read of one lease at its would-be expiry."""
        lease = self.inner.get_lease(lease_key)
        self._add("get_lease", read_units([self.sizes.get(lease_key, 0)], consistent=True))
        return lease

    def scan_table(self, record_prefix: str) -> TableScan:
        """Two Scans (the DynamoDB store's): the lease table, and the coordination table beside
        it (``<application>-KclpySparkState``), each paying for its whole table in 1 MB pages."""
        scan = self.inner.scan_table(record_prefix)
        sizes = list(self.sizes.items())
        leases = [size for key, size in sizes if key not in self.record_keys]
        records = [size for key, size in sizes if key in self.record_keys]
        self._add("scan_table", _scan_units(leases))
        self._add("scan_records", _scan_units(records))
        return scan

    def list_lease_keys_by_owner(self, owner: str) -> list[str]:
        """A Query of the KEYS_ONLY owner index: it reads each entry's two keys (and the
        index's 100 bytes of overhead per item), eventually consistent, 1 MB pages."""
        keys = self.inner.list_lease_keys_by_owner(owner)
        entry = [len(k) + len(owner) + len("leaseKey") + len("leaseOwner") + 100 for k in keys]
        units = sum(read_units(entry[i : i + 8000], consistent=False)
                    for i in range(0, max(len(entry), 1), 8000))  # fmt: skip
        self._add("list_lease_keys_by_owner", units)
        return keys

    def update_checkpoint(self, lease: Lease, checkpoint: ExtendedSequenceNumber) -> Lease | None:
        result = self.inner.update_checkpoint(lease, checkpoint)
        self._lease_written("update_checkpoint", lease.lease_key, result)
        return result

    def get_record(self, key: str, *, consistent: bool = True) -> CoordinationRecord | None:
        record = self.inner.get_record(key)
        size = self.sizes.get(codec.record_item_key(key), 0)
        self._add("get_record", read_units([size], consistent=consistent))
        return record

    def put_record(self, record: CoordinationRecord, expected_version: int | None) -> bool:
        won = self.inner.put_record(record, expected_version)
        key = codec.record_item_key(record.key)
        self.record_keys.add(key)
        before = self.sizes.get(key, 0)
        after = item_size(codec.record_to_item(record, None, 0.0)) if won else before
        self._add("put_record", write_units(before, after))
        self.sizes[key] = after
        return won

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{name}: not a call of the steady state simulated here")

    def total(self) -> Cost:
        reads = sum(u for call, (_, u) in self.usage.items() if call in READS)
        writes = sum(u for call, (_, u) in self.usage.items() if call not in READS)
        return Cost(sum(r for r, _ in self.usage.values()), reads, writes)


class SimWorker:
    """One worker's lease-management calls, with the real classes the worker uses."""

    def __init__(self, worker_id: str, store: CostingStore, clock: ManualClock, cfg: WorkerConfig):
        t = lease_timing(cfg)
        self.cfg = cfg
        self.id = worker_id
        self.store = store
        self.clock = clock
        self.holder = LeaseHolder(
            store, worker_id, clock, t.lease_duration, renewal_threads=4,  # type: ignore[arg-type]
            skip_checkpointed=True,
        )  # fmt: skip
        self.position = int(SEQ)
        self.observer = LeaseObserver(t)
        self.timing = t
        self.next_round = 0.0  # monotonic: the taker's next scheduled round
        self.was_led = False
        self.leader = leader_election(cfg, store, t, clock)  # type: ignore[arg-type]
        self.suspend = coordination.SuspendFlag(store, clock, t.lease_duration)  # type: ignore[arg-type]
        self.status = coordination.StatusWriter(store, worker_id, worker_id, 3 * t.lease_duration)  # type: ignore[arg-type]
        self.cadence = StatusCadence.of(t)  # quiet: a holder writes every quiet interval
        # The leases were taken when the fleet started, more than ten minutes ago (steady state).
        events = [{"at": clock.wall() - 700, "lease_key": f"shardId-{i:012d}", "kind": "taken",
                   "detail": f"lease taken (expired, owner w{i})"} for i in range(10)]  # fmt: skip
        self.events = events

    def scan(self) -> None:
        """The taker's Scan; the leader record and the suspend flag in it serve the next looks,
        its leases the observer (which dates each counter by its stamp)."""
        table = self.store.scan_table("")
        now = self.clock.monotonic()
        self.leader.observe(table.records, now)
        self.suspend.observe(table.records, now)
        self.observer.observe(table.leases, now, self.clock.wall())
        if self.cfg.lease_assignment == "auto" and self.leader.is_leader:  # Led.after_scan
            max_age = self.timing.status_max_age
            running = coordination.live_workers(table.records, self.clock.wall(), max_age)
            self.leader.set_assigns(leader_assigns(
                self.leader.assigning, len(table.leases), len(set(running) | {self.id}),
                from_leases=self.cfg.auto_assignment_leases,
                from_workers=self.cfg.auto_assignment_workers,
            ))  # fmt: skip

    def led(self) -> bool:
        """Led by a leader that assigns (Led.role): no scans, a Query every renewal interval."""
        if self.cfg.lease_assignment == "worker" or self.leader.is_leader:
            return False
        return self.leader.led_by() is not None and self.leader.other_assigns

    def tick(self) -> float:
        """The leader loop: a tick, then as long as the election says."""
        self.leader.tick()
        return self.leader.tick_interval()

    def take_loop(self) -> float:
        """The taker's loop (``Taker.wait``): a round every take interval, and between rounds a
        read of each lease of another worker at the moment it would expire unless its counter
        moved (more than MAX_LOOKS due at once: a round now). Returns the seconds until it
        wants to run again."""
        now = self.clock.monotonic()
        led = self.led()
        if led and not self.was_led:
            self.observer.forget()  # a led worker watches no lease (Led.round)
        self.was_led = led
        if now >= self.next_round - 1e-9:
            if not led:
                self.scan()
            self.next_round = now + self.timing.take_interval
        else:
            due = self.observer.due(now, self.id)
            if len(due) > MAX_LOOKS:
                self.observer.unwatch(due)
                self.next_round = now
                return 0.0
            for key in due:
                self.observer.look_again(key, self.store.get_lease(key), now, self.clock.wall())
        check = self.observer.next_check(self.id)
        wake = self.next_round if check is None else min(self.next_round, check + LOOK_MARGIN)
        return max(wake - now, 0.0)

    def discover(self) -> None:
        """A led worker's look at its own keys, every renewal interval (none while it leads)."""
        if self.led():
            self.store.list_lease_keys_by_owner(self.id)

    def control(self) -> None:
        self.suspend.read()
        # Per-lease figures ride on the renewals (Lease.renewal_figures): the status record holds
        # none for a RecordProcessor application (only a Spark sink's, within 32 KB).
        status = status_fields(
            ready=True, readiness="ready", cpu_percent=12.5, suspended=False,
            leader=self.leader.is_leader, assigns=self.leader.assigning, leases={},
            leases_omitted=0, events=published_events(self.events, self.clock.wall()),
            live_for=self.timing.status_quiet_max_age if self.holder.held() else None,
        )  # fmt: skip
        status |= {"cpu_settled": True, "cpu_since": self.clock.wall() - 10.0, "cpu_limit": 2.0}
        if self.cadence.due(status, self.clock.monotonic()):  # publish.publish_if_due
            self.status.publish(status, self.clock.wall())
            self.cadence.wrote(status, self.clock.monotonic())

    def checkpoint(self) -> None:
        """Every held lease's processor checkpoints (records flowing: after every batch)."""
        for held in self.holder.held():
            self.position += 1
            at = ExtendedSequenceNumber(str(self.position))
            self.holder.update(
                held.lease_key, held.token, lambda x, at=at: self.store.update_checkpoint(x, at)
            )

    def measure(self) -> None:
        """What the consumers hand the holder before each renewal round (written with it)."""
        for held in self.holder.held():
            figures = OwnerFigures(owner_tag(self.id), self.clock.wall(), 1_234_567, 0)
            self.holder.set_figures(
                held.lease_key, held.token, throughput_kbps=12.345, figures=figures
            )


def _populate(store: CostingStore, leases: int, workers: list[SimWorker]) -> None:
    step = (1 << 128) // leases
    for i in range(leases):
        owner = workers[i % len(workers)].id
        lease = Lease(
            f"shardId-{i:012d}", ExtendedSequenceNumber(SEQ), lease_owner=owner,
            parent_shard_ids=frozenset({f"shardId-{i + 100_000:012d}"}),
            hash_key_range=HashKeyRange(i * step, (i + 1) * step - 1),
        )  # fmt: skip
        store.create_lease_if_absent(lease)
    for lease in store.inner.list_leases():
        next(w for w in workers if w.id == lease.lease_owner).holder.add_taken(lease)


def simulate(
    leases: int,
    workers: int,
    failover: float,
    warmup: float,
    minutes: float,
    mode: str = "worker",
    checkpoint_every: float = 0.0,
) -> tuple[Cost, bool]:
    """Per lease per minute, after ``warmup`` virtual seconds, and whether a leader assigned at
    the end; ``mode``: lease_assignment."""
    cfgs = [WorkerConfig(stream_name="s", worker_id=f"worker-{i:03d}", failover_time=failover,
                         lease_assignment=mode) for i in range(workers)]  # fmt: skip
    timing = lease_timing(cfgs[0])
    clock = ManualClock()
    store = CostingStore(MemoryLeaseTable(clock))
    fleet = [SimWorker(cfg.worker_id, store, clock, cfg) for cfg in cfgs]
    _populate(store, leases, fleet)
    rng = random.Random(7)
    steps: list[tuple[float, Callable[[], Any]]] = []
    for w in fleet:
        steps += [
            (w.holder.round_interval, lambda w=w: (w.measure(), w.holder.renew_all())),
            (timing.take_interval, w.take_loop),
            (timing.leader_renew_interval, w.tick),
            (timing.lease_duration, w.control),
        ]
    if mode != "worker":  # after the others, so that all modes run the common steps in phase
        steps += [(timing.renew_interval, w.discover) for w in fleet]
    if checkpoint_every > 0:
        steps += [(checkpoint_every, w.checkpoint) for w in fleet]
    order = itertools.count()
    queue = [(rng.uniform(0, every), next(order), every, step) for every, step in steps]
    heapq.heapify(queue)
    start = clock.monotonic()
    before: Cost | None = None
    while True:
        at, _, every, step = heapq.heappop(queue)
        if at >= warmup and before is None:
            before = store.total()
        if at >= warmup + minutes * 60:
            break
        clock.advance(max(0.0, start + at - clock.monotonic()))
        wait = step()  # the take loop says when it runs next; the others are periodic
        heapq.heappush(queue, (at + (wait if isinstance(wait, float) else every), next(order),
                               every, step))  # fmt: skip
    for w in fleet:
        w.holder.close()
    after = store.total()
    assert before is not None
    spent = Cost(after.requests - before.requests, after.read_units - before.read_units,
                 after.write_units - before.write_units)  # fmt: skip
    return spent.per(minutes * leases), any(w.leader.assigning for w in fleet)


def _lease_bytes(leases: int) -> int:
    """The size of one of the simulated leases as the KCL 3.x writes it (what its model prices):
    the same lease with throughputKBps, without kclpy-spark's stamps and figures."""
    lease = Lease("shardId-000000000000", ExtendedSequenceNumber(SEQ), lease_owner="worker-000",
                  parent_shard_ids=frozenset({"shardId-000000100000"}),
                  hash_key_range=HashKeyRange(0, (1 << 128) // max(leases, 1) - 1),
                  lease_counter=123_456, throughput_kbps=12.345)  # fmt: skip
    return item_size(codec.lease_to_item(lease))


def report(
    rows: list[tuple[int, int, str, Cost]],
    failover: float,
    argv: Sequence[str],
    checkpoint_every: float = 0.0,
) -> str:
    flowing = (
        f" Every lease is checkpointed every {checkpoint_every:g} s (records flowing); the KCL 3.x "
        "model gets the same checkpoints, each a write of its item, on top of its renewals."
        if checkpoint_every > 0 else " No records, no checkpoints."
    )  # fmt: skip
    lines = [
        "# Lease-table cost at scale, simulated (per lease per minute, steady state)",
        "",
        f"Run {stamp()} with `python bench/sim_lease_cost.py {' '.join(argv)}` on {machine()}.",
        "",
        f"failover_time {failover:g} s. Ours: the worker's lease-management calls in virtual time "
        "on the in-memory store, costed by DynamoDB's rules (see the script's docstring). KCL 3.x: "
        "bench/kcl_model.py, pricing the KCL's own item for the same leases. Units: read + write "
        "capacity units." + flowing,
        "",
        "| leases | workers | lease_assignment | our requests | KCL 3.x | ours / KCL 3.x | "
        "our read / write units | KCL 3.x read / write units | ours / KCL 3.x (units) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for leases, workers, mode, ours in rows:
        size = _lease_bytes(leases)
        per_minute = leases * 60 / checkpoint_every if checkpoint_every > 0 else 0.0
        theirs = Cost(per_minute, 0.0, per_minute * write_units(size, size))
        k3 = (kcl3(leases, workers, failover, size) + theirs).per(leases)
        units, k3_units = ours.read_units + ours.write_units, k3.read_units + k3.write_units
        lines.append(
            f"| {leases} | {workers} | {mode} | {ours.requests:.2f} | {k3.requests:.2f} | "
            f"**{ours.requests / k3.requests:.2f}x** | {ours.read_units:.2f} / "
            f"{ours.write_units:.2f} | {k3.read_units:.2f} / {k3.write_units:.2f} | "
            f"**{units / k3_units:.2f}x** |"
        )
    return "\n".join([*lines, ""])


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", nargs="+", default=["4x1", "16x1", "4x4", "16x4", "1000x4",
                        "1000x50", "10000x4", "10000x50"], help="LEASESxWORKERS")  # fmt: skip
    parser.add_argument("--failover", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=60.0, help="virtual seconds")
    parser.add_argument("--minutes", type=float, default=2.0, help="virtual minutes counted")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--checkpoint-every",
        type=float,
        default=0.0,
        help="seconds between a lease's checkpoints (0: none, an idle stream)",
    )
    parser.add_argument("--results", default="sim_lease_cost.md", help="file in bench/results/")
    modes = ["worker", "leader", "auto"]
    parser.add_argument("--assignment", nargs="+", choices=modes, default=modes,
                        help="lease_assignment values")  # fmt: skip
    args = parser.parse_args(argv)
    rows = []
    for size in args.sizes:
        leases, workers = (int(x) for x in size.split("x"))
        for mode in args.assignment:
            ours, assigned = simulate(leases, workers, args.failover, args.warmup, args.minutes,
                                      mode, args.checkpoint_every)  # fmt: skip
            if mode == "auto":
                mode += " (leader assigns)" if assigned else " (every worker takes)"
            print(f"{leases} leases, {workers} workers, {mode}: {ours}", flush=True)
            rows.append((leases, workers, mode, ours))
    text = report(rows, args.failover, argv, args.checkpoint_every)
    print(text)
    if not args.no_write:
        print(f"written to {write_results(args.results, text)}")


if __name__ == "__main__":
    main()
