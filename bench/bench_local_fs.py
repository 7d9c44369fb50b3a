"""The Parquet sink's write with and without the no-chmod local filesystem (issue 43's whole path
spends on it; kclpy_spark/spark/local_fs.py).

One ``local[2]`` session built as the sink builds it (its jar on ``spark.jars``) writes the same
cached DataFrame of ``--rows`` 200-byte records in ``--pieces`` pieces as the Parquet sink does
(partitioned by piece, its write options), alternating the two filesystems: Hadoop's default
(``LocalFileSystem``: a ``chmod`` process for every file and folder, ``.crc`` files) and
``NoForkLocalFileSystem``. Measured per write: wall time, the CPU of the JVM with its children
that ended (the ``chmod`` processes, which the JVM waits for), and the ``.crc`` files written.

    python bench/bench_local_fs.py                      # 100,000 rows, 16 pieces, 30 rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import machine, median, stamp, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _session() -> Any:
    from kclpy_spark.spark.session import SparkSessionHolder

    return SparkSessionHolder("local[2]", conf={"spark.driver.memory": "2g"}).session()


def _cpu(jvm: Any) -> float:
    times = jvm.cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--pieces", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--results", default="local-fs.md")
    args = parser.parse_args()

    import psutil

    from kclpy_spark.spark import local_fs
    from kclpy_spark.spark.sinks import WRITE_OPTIONS

    spark = _session()
    jvm = next(c for c in psutil.Process().children(recursive=True) if c.name() == "java")
    df = (
        spark.range(args.rows)
        .selectExpr(
            "cast(id + 100000000000000000000 as string) as sequence_number",
            f"cast(id % {args.pieces} as int) as kcl_piece_index",
            "cast(repeat(lpad(cast(id as string), 10, '0'), 20) as binary) as data",
        )
        .repartition(2)
        .cache()
    )
    df.count()
    variants = {"hadoop default": dict(WRITE_OPTIONS),
                "no chmod": {**WRITE_OPTIONS, **local_fs.write_options(df)}}  # fmt: skip
    if variants["no chmod"] == variants["hadoop default"]:
        raise SystemExit("the no-chmod filesystem is not loadable in this session")
    work = Path(tempfile.mkdtemp(prefix="bench-local-fs-"))
    runs: dict[str, list[tuple[float, float, int]]] = {v: [] for v in variants}
    try:
        for i in range(args.rounds + 3):
            for name, options in variants.items():
                out = work / f"{i}-{name.replace(' ', '-')}"
                cpu, began = _cpu(jvm), time.perf_counter()
                df.write.options(**options).partitionBy("kcl_piece_index").parquet(str(out))
                took, used = time.perf_counter() - began, _cpu(jvm) - cpu
                crc = sum(1 for _ in out.rglob("*.crc"))
                shutil.rmtree(out)
                if i >= 3:  # the first rounds warm the JIT up
                    runs[name].append((took, used, crc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()

    def med(name: str, k: int) -> float:
        return median([r[k] for r in runs[name]])

    lines = [
        f"# The Parquet sink's write: Hadoop's local filesystem vs the no-chmod one ({stamp()})",
        "",
        f"Machine: {machine()}.",
        "",
        f"`bench/bench_local_fs.py --rows {args.rows} --pieces {args.pieces} --rounds "
        f"{args.rounds}`: one local[2] session as the sink builds it; the same cached rows "
        "(200-byte payloads) written partitioned by piece with the sink's options, the two "
        "filesystems alternating; medians of the rounds after three warm-up rounds. CPU: the "
        "JVM's, with its children that ended (the chmod processes).",
        "",
        "| filesystem | wall ms a write | JVM CPU ms a write | .crc files a write |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {med(name, 0) * 1e3:.0f} | {med(name, 1) * 1e3:.0f} | {med(name, 2):.0f} |"
            for name in variants
        ),
        "",
        f"No chmod / Hadoop's default: wall {med('no chmod', 0) / med('hadoop default', 0):.2f}x, "
        f"CPU {med('no chmod', 1) / med('hadoop default', 1):.2f}x.",
    ]
    text = "\n".join(lines)
    print(text)
    write_results(args.results, text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise SystemExit(main())
