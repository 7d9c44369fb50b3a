"""This checkout against another commit, side by side in one run: did a change cost speed?

    .venv/bin/python bench/bench_versions.py --against COMMIT [--records 200000] [--repeats 3]

The other commit is checked out with ``git worktree`` under .cache/bench/versions/ and each
measurement runs that tree's own benchmark code on its own package (PYTHONPATH), alternating the
two trees so both see the same machine:

* consumer: ``bench/consumer_runs.py ours-fast`` (the real worker, memory lease store) draining
  one kinesalite stream of ``--records`` records: records/s and client CPU per record;
* Spark sink: ``bench/bench_spark_sink.py`` (the sink against a bare Spark write of the same rows,
  its own baseline in each run): the median sink/bare ratio.

Prints a markdown section (also written to bench/results/versions.md).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import CACHE, REPO, child_env, machine, run_child, stamp, write_results
from kinesalite import Kinesalite, load_stream

STREAM = "versions"


def worktree(commit: str) -> Path:
    sha = subprocess.run(
        ["git", "rev-parse", commit], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    path = CACHE / "versions" / sha[:12]
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), sha], cwd=REPO, check=True,
            capture_output=True,
        )  # fmt: skip
    return path


def consumer_run(tree: Path, endpoint: str, records: int) -> dict[str, Any]:
    env = child_env(PYTHONPATH=str(tree))
    out = run_child(
        [str(tree / "bench" / "consumer_runs.py"), "ours-fast", endpoint, STREAM, str(records)],
        env=env,
        timeout=900,
    )
    out["rate"] = out["records"] / out["seconds"]
    return out


def sink_run(tree: Path, rounds: int) -> float:
    out = CACHE / "versions" / f"sink-{tree.name}.md"
    proc = subprocess.run(
        [sys.executable, str(tree / "bench" / "bench_spark_sink.py"), "--rounds", str(rounds),
         "--out", str(out)],
        env=child_env(PYTHONPATH=str(tree)), cwd=tree, capture_output=True, text=True,
        timeout=1800, check=False,
    )  # fmt: skip
    found = re.search(r"Median ratio: \*\*([0-9.]+)\*\*", proc.stdout)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"bench_spark_sink failed in {tree}:\n{proc.stderr[-3000:]}")
    return float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sink-rounds", type=int, default=3)
    parser.add_argument("--no-sink", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    trees = {"this checkout": REPO, f"{args.against}": worktree(args.against)}
    consumer: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    with Kinesalite() as kinesalite:
        load_stream(kinesalite.endpoint, STREAM, shards=4, records=args.records)
        for rep in range(args.repeats):
            order = list(trees.items()) if rep % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                out = consumer_run(tree, kinesalite.endpoint, args.records)
                consumer[name].append(out)
                print(f"  consumer {name}: {out['rate']:,.0f} records/s", flush=True)
    sink: dict[str, list[float]] = {name: [] for name in trees}
    if not args.no_sink:
        for rep in range(2):
            order = list(trees.items()) if rep % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                sink[name].append(sink_run(tree, args.sink_rounds))
                print(f"  sink {name}: ratio {sink[name][-1]:.2f}", flush=True)
    lines = [
        f"# This checkout against {args.against} ({stamp()})", "", f"Machine: {machine()}.", "",
        f"`bench/bench_versions.py --against {args.against} --records {args.records} "
        f"--repeats {args.repeats}`", "",
        "| tree | consumer records/s (median) | runs | client CPU us/record | sink / bare "
        "Spark write (median of runs) |",
        "|---|---:|---|---:|---:|",
    ]  # fmt: skip
    base = statistics.median(r["rate"] for r in consumer[args.against])
    for name in trees:
        runs = consumer[name]
        rate = statistics.median(r["rate"] for r in runs)
        cpu = statistics.median(r["cpu"] / r["records"] * 1e6 for r in runs)
        ratio = f"{statistics.median(sink[name]):.2f}" if sink[name] else "-"
        each = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        lines.append(
            f"| {name} | {rate:,.0f} ({rate / base:.2f}x) | {each} | {cpu:.1f} | {ratio} |"
        )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_results("versions.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
