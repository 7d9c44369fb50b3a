"""Scale benchmark of the pure shard-sync rule: ``python bench/bench_shard_sync.py``.

Builds synthetic streams of 1k, 10k and 100k shards with a long split/merge history, times
``leases_to_create`` on each (best of several runs, time.perf_counter), fits a straight line
through the three sizes, and prints a markdown table that is also written to
``bench/results/shard_sync.md``. Timing lives only here, never in the tests.

The history: ``WIDTH`` starting shards partition the hash key space; then, one reshard per tick,
a random open shard splits or two adjacent open shards merge, keeping about ``WIDTH`` shards open.
So nearly every shard is closed, and the number of generations grows with the size of the stream
(deep chains: far past Python's recursion limit at 100k).

The lease table is the hard case for the rule, a recovery after most rows were lost: leases only for
the oldest 5% of shards in the lower half of the key space, and one open shard in ten. Every
un-leased open shard then walks back through almost the whole history, and the upper half needs new
leases (its oldest shards with TRIM_HORIZON, the uncovered ones with LATEST).
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

try:
    from checkpoint.lease import MAX_HASH_KEY
    from checkpoint.sequence import InitialPosition
    from shard_sync.hierarchy import leases_to_create
    from shard_sync.shards import Shard
except ModuleNotFoundError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from checkpoint.lease import MAX_HASH_KEY
    from checkpoint.sequence import InitialPosition
    from shard_sync.hierarchy import leases_to_create
    from shard_sync.shards import Shard

SIZES = (1_000, 10_000, 100_000)
# About as many open shards as a busy production stream; kept fixed so that a bigger stream means a
# longer history (deeper chains), which is what stresses the walk.
WIDTH = 64
# A realistic 56-digit Kinesis sequence number: the rule must handle numbers past 64 bits.
SEQ_BASE = 49590338271490256608559692538361571095921575989136588898
RESULTS = Path(__file__).resolve().parent / "results" / "shard_sync.md"


@dataclass(frozen=True)
class Workload:
    shards: list[Shard]
    leased: frozenset[str]
    generations: int
    open_count: int


def build_history(total: int, seed: int = 7) -> list[dict[str, Any]]:
    """ListShards entries (boto3 shape) of a stream with ``total`` shards of reshard history."""
    rng = random.Random(seed)
    entries: list[dict[str, Any]] = []
    opened: list[int] = []  # indexes into entries of the open shards, in hash key order

    def add(start_tick: int, lo: int, hi: int, parents: Sequence[int]) -> int:
        entry: dict[str, Any] = {
            "ShardId": f"shardId-{len(entries):012d}",
            "HashKeyRange": {"StartingHashKey": str(lo), "EndingHashKey": str(hi)},
            "SequenceNumberRange": {"StartingSequenceNumber": str(SEQ_BASE + start_tick * 1000)},
        }
        if parents:
            entry["ParentShardId"] = entries[parents[0]]["ShardId"]
        if len(parents) > 1:
            entry["AdjacentParentShardId"] = entries[parents[1]]["ShardId"]
        entries.append(entry)
        return len(entries) - 1

    def close(index: int, tick: int) -> None:
        entries[index]["SequenceNumberRange"]["EndingSequenceNumber"] = str(
            SEQ_BASE + tick * 1000 - 1
        )

    def keys(index: int) -> tuple[int, int]:
        hk = entries[index]["HashKeyRange"]
        return int(hk["StartingHashKey"]), int(hk["EndingHashKey"])

    step = (MAX_HASH_KEY + 1) // WIDTH
    for i in range(WIDTH):
        hi = MAX_HASH_KEY if i == WIDTH - 1 else (i + 1) * step - 1
        opened.append(add(0, i * step, hi, ()))
    tick = 0
    while len(entries) < total:
        tick += 1
        i = rng.randrange(len(opened))
        lo, hi = keys(opened[i])
        split = len(opened) < WIDTH or (len(opened) == WIDTH and rng.random() < 0.5)
        if (split or len(opened) == 1) and lo < hi:
            mid = rng.randint(lo, hi - 1)
            parent = opened[i]
            close(parent, tick)
            opened[i : i + 1] = [add(tick, lo, mid, (parent,)), add(tick, mid + 1, hi, (parent,))]
        else:
            i = min(i, len(opened) - 2)
            left, right = opened[i], opened[i + 1]
            close(left, tick)
            close(right, tick)
            opened[i : i + 2] = [add(tick, keys(left)[0], keys(right)[1], (left, right))]
    return entries


def make_workload(total: int) -> Workload:
    shards = [Shard.from_api(e) for e in build_history(total)]
    rng = random.Random(total)
    # Old leases survive for the lower half of the key space only, so the walk from the upper
    # half reaches the starting shards and must create leases there.
    oldest = {
        s.shard_id for s in shards[: len(shards) // 20] if s.hash_key_range.end <= MAX_HASH_KEY // 2
    }
    open_ids = [s.shard_id for s in shards if s.is_open]
    some_open = {sid for sid in open_ids if rng.random() < 0.1}
    depth: dict[str, int] = {}
    for shard in shards:  # parents always come before their children in this history
        depth[shard.shard_id] = 1 + max((depth[p] for p in shard.parent_ids), default=0)
    return Workload(shards, frozenset(oldest | some_open), max(depth.values()), len(open_ids))


def time_sync(work: Workload, position: InitialPosition, runs: int) -> tuple[float, float]:
    """Best of ``runs`` timings of one sync, each on fresh Shard objects (as a new listing gives:
    no property cached by an earlier run), and best of the same number of timings of a control:
    building a dict of those shards, code that is linear by construction."""
    best = control = math.inf
    for _ in range(runs):
        fresh = [replace(s) for s in work.shards]
        gc.collect()
        began = time.perf_counter()
        leases_to_create(fresh, work.leased, position)
        best = min(best, time.perf_counter() - began)
        began = time.perf_counter()
        _ = {s.shard_id: s for s in fresh}
        control = min(control, time.perf_counter() - began)
    return best, control


def fit_line(
    xs: Sequence[float], ys: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[float, float]:
    """Weighted least-squares ``y = a + b * x``; returns (a, b)."""
    ws = list(weights) if weights is not None else [1.0] * len(xs)
    total = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / total
    my = sum(w * y for w, y in zip(ws, ys, strict=True)) / total
    b = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=True)) / sum(
        w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True)
    )
    return my - b * mx, b


def log_log_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The exponent k of ``y ~ x**k`` (1.0 means linear)."""
    return fit_line([math.log(x) for x in xs], [math.log(y) for y in ys])[1]


def table_for(
    name: str, position: InitialPosition, workloads: dict[int, Workload], runs: int
) -> list[str]:
    seconds: dict[int, float] = {}
    control: dict[int, float] = {}
    created: dict[int, int] = {}
    for size, work in workloads.items():
        created[size] = len(leases_to_create(work.shards, work.leased, position))
        seconds[size], control[size] = time_sync(work, position, runs)
    sizes = [len(work.shards) for work in workloads.values()]  # a split may pass the target
    times = list(seconds.values())
    # Weighted by 1/t^2 so each size counts by its relative error; unweighted, the 100k point
    # alone would set the line.
    a, b = fit_line(sizes, times, [1 / t**2 for t in times])
    lines = [
        f"### {name}",
        "",
        "| shards | generations | open | leased | created | seconds | us/shard "
        "| vs linear fit | control us/shard |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size, work in workloads.items():
        count = len(work.shards)
        predicted = a + b * count
        ratio = f"{seconds[size] / predicted:.2f}" if predicted > 0 else "n/a"
        lines.append(
            f"| {count:,} | {work.generations:,} | {work.open_count} | "
            f"{len(work.leased):,} | {created[size]:,} | {seconds[size]:.4f} | "
            f"{seconds[size] / count * 1e6:.2f} | {ratio} | {control[size] / count * 1e6:.3f} |"
        )
    lines += [
        "",
        f"Linear fit: seconds = {a:.2e} + {b * 1e6:.3f} us x shards; log-log slope "
        f"{log_log_slope(sizes, times):.2f} (1.00 = linear).",
        "",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="timed runs per size (best is kept)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write results")
    parser.add_argument(
        "--sizes", type=int, nargs=3, default=SIZES, metavar="N", help="the three stream sizes"
    )
    args = parser.parse_args(argv)

    workloads = {size: make_workload(size) for size in args.sizes}
    lines = [
        "# Shard sync benchmark: `leases_to_create`",
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `python bench/bench_shard_sync.py` on"
        f" Python {platform.python_version()} ({platform.machine()}, {platform.system()}).",
        f"Synthetic split/merge history, about {WIDTH} shards open. Lease table: the oldest 5% of "
        "shards in the lower half of the key space plus 1 in 10 open shards (a recovery after "
        f"most rows were lost). Best of {args.runs} runs, each on fresh Shard objects. "
        "'vs linear fit' is the measured time over the least-squares line through the three "
        "sizes. 'control' times building a plain dict of the same shards: its per-shard cost "
        "rises with size too, which is the memory hierarchy (objects no longer fit in the CPU "
        "caches), not the algorithm.",
        "",
    ]
    lines += table_for(
        "TRIM_HORIZON (walks to the oldest listed shards)",
        InitialPosition.trim_horizon(),
        workloads,
        args.runs,
    )
    lines += table_for("LATEST", InitialPosition.latest(), workloads, args.runs)
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
