"""The Delta sink's driver memory and CPU over many commits: its table objects loaded afresh every
``DELTA_TABLE_UPDATES`` updates (the sink as shipped) against kept for the process's life (the
sink before, ``DELTA_TABLE_UPDATES`` set past the run's length).

Each variant runs in a child process of its own: one ``DeltaSink`` on a fresh local table, then
``--writes`` times what the batcher does for a lease's batch (``prepare``, then ``write`` of a
small piece, one app transaction each, over ``--leases`` leases in turn). Measured: resident
memory (after ``malloc_trim``) at the start and every ``--every`` writes, and the process CPU
per write. The variants alternate for ``--rounds`` rounds. No Spark, no JVM (the sink writes
Arrow tables with deltalake).

    python bench/bench_delta_refresh.py          # 2,000 writes, 50 leases, 2 rounds
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

from common import child_env, machine, median, run_child, stamp, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEPT = 10**9  # never loaded afresh within a run


def _rss_mb() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * 4096 / 2**20


def child(updates: int, writes: int, leases: int, every: int) -> None:
    import pyarrow as pa

    from checkpoint.sequence import ExtendedSequenceNumber
    from kclpy_spark.spark import sinks
    from kclpy_spark.spark.pieces import SCHEMA, Piece, PieceKey
    from kclpy_spark.spark.sink_batch import SinkBatch

    sinks.DELTA_TABLE_UPDATES = updates
    folder = tempfile.mkdtemp(prefix="bench-delta-")
    sink = sinks.DeltaSink(str(Path(folder) / "table"))
    samples = [(0, _rss_mb())]
    began = time.process_time()
    for n in range(1, writes + 1):
        lease = f"shardId-{n % leases:012d}"
        seq = n * 10
        key = PieceKey(
            lease, ExtendedSequenceNumber(str(seq)), ExtendedSequenceNumber(str(seq + 2))
        )
        piece = Piece(key, lease, 3)
        rows = [
            {"stream": "s", "shard_id": lease, "sequence_number": str(seq + i),
             "sub_sequence_number": 0, "partition_key": "k",
             "approximate_arrival_timestamp": 0, "data": b"x" * 200}
            for i in range(3)
        ]  # fmt: skip
        tokens = sink.prepare([piece])
        sink.write(SinkBatch(n, (piece,), pa.Table.from_pylist(rows, schema=SCHEMA), tokens=tokens))
        if n % every == 0:
            samples.append((n, _rss_mb()))
    cpu = time.process_time() - began
    print(json.dumps({"samples": samples, "cpu_per_write_ms": 1000 * cpu / writes}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--leases", type=int, default=50)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", default="delta-table-refresh.md")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.writes, args.leases, args.every)
        return 0

    from kclpy_spark.spark.sinks import DELTA_TABLE_UPDATES

    variants = {"loaded afresh": DELTA_TABLE_UPDATES, "kept": KEPT}
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, updates in variants.items():
            argv = [__file__, "--child", str(updates), "--writes", str(args.writes),
                    "--leases", str(args.leases), "--every", str(args.every)]  # fmt: skip
            result = run_child(argv, env=child_env(), timeout=3600)
            runs[name].append(result)
            print(name, result, flush=True)

    def growth(result: dict[str, object]) -> float:
        samples = result["samples"]
        assert isinstance(samples, list)
        return float(samples[-1][1] - samples[1][1])  # after the first writes' warm-up

    lines = [
        f"# The Delta sink's table objects loaded afresh every {DELTA_TABLE_UPDATES} updates, "
        f"against kept ({stamp()})",
        "",
        f"`python bench/bench_delta_refresh.py --writes {args.writes} --leases {args.leases} "
        f"--rounds {args.rounds}`; {machine()}. Each variant in its own process, alternated; "
        "one `DeltaSink` on a fresh local table, a `prepare` and a `write` of a 3-record piece "
        "(one app transaction) per write, leases in turn. Resident memory after `malloc_trim`.",
        "",
        "| round | variant | RSS MB by writes | growth after the first "
        f"{args.every} (MB) | CPU per write (ms) |",
        "|---|---|---|---:|---:|",
    ]
    for i in range(args.rounds):
        for name in variants:
            r = runs[name][i]
            samples = r["samples"]
            assert isinstance(samples, list)
            series = ", ".join(f"{n}: {mb:.0f}" for n, mb in samples)
            lines.append(f"| {i + 1} | {name} | {series} | {growth(r):.0f} | "
                         f"{float(r['cpu_per_write_ms']):.2f} |")  # fmt: skip
    cpu = {n: median([float(r["cpu_per_write_ms"]) for r in runs[n]]) for n in variants}
    grew = {n: median([growth(r) for r in runs[n]]) for n in variants}
    lines += [
        "",
        f"Medians: CPU per write {cpu['loaded afresh']:.2f} against {cpu['kept']:.2f} ms "
        f"({cpu['loaded afresh'] / cpu['kept']:.2f}x); memory growth {grew['loaded afresh']:.0f} "
        f"against {grew['kept']:.0f} MB over writes {args.every}..{args.writes}.",
    ]
    path = write_results(args.results, "\n".join(lines))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
