"""What keeping every record that does not fill ``value_schema`` costs (issue 49, item 4).

Side by side in one local SparkSession, alternated, on the same Arrow table of JSON records:

* ``from_json``: Spark's PERMISSIVE parse with the corrupt-record column alone (what the sink did
  before: a record whose keys differ, a missing field or text after the object lost its payload);
* ``parse_values``: the sink's parse now (``kclpy_spark/spark/values.py``: the same parse plus a
  second one of the text wrapped in an array, and a key check).

Each round writes the DataFrame to Spark's ``noop`` sink (every row parsed, nothing stored) and
times it; the report is the median seconds and the ratio, and the rows a second. It also reports
what building each DataFrame costs the driver's Python (process CPU, median of ``--builds``
builds, no action): the sink pays it once a batch. The session is configured as the sessions
the sink starts (``session.classic_conf``). Run it with ``PYTHONPATH`` at another checkout to
measure that checkout's ``values.py``.

    .venv/bin/python bench/bench_value_schema.py [--rows 500000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

SCHEMA = "id BIGINT, name STRING, price DOUBLE, tags ARRAY<STRING>"


def table(rows: int) -> Any:
    import pyarrow as pa

    data = [
        json.dumps({"id": i, "name": f"n{i}", "price": i / 7, "tags": ["a", "b"]}).encode()
        for i in range(rows)
    ]
    return pa.table({"shard_id": ["shardId-000000000000"] * rows, "data": data})


def baseline(df: Any) -> Any:
    """Spark's own parse with the corrupt-record column: the sink's parse before this change."""
    from pyspark.sql import functions as F

    corrupt = "_corrupt"
    parsed = F.from_json(
        F.col("data").cast("string"),
        f"{SCHEMA}, {corrupt} STRING",
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt},
    )
    return (
        df.select("shard_id", parsed.alias("v"), F.col("data").alias("raw"))
        .select("shard_id", "v.*", "raw")
        .withColumn("unparsed_data", F.when(F.col(corrupt).isNotNull(), F.col("raw")))
        .drop(corrupt, "raw")
    )


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--rows", type=int, default=500_000)
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--builds", type=int, default=200)
    args.add_argument("--no-write", action="store_true")
    opts = args.parse_args()

    from pyspark.sql import SparkSession

    from kclpy_spark.spark.session import SparkTarget, classic_conf
    from kclpy_spark.spark.values import parse_values, value_fields

    builder = SparkSession.builder.master("local[2]")
    conf = classic_conf(SparkTarget.parse("local[2]"), {"spark.sql.shuffle.partitions": "2"})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    df = spark.createDataFrame(table(opts.rows)).cache()
    df.count()
    fields = value_fields(df, SCHEMA)
    variants = {
        "from_json": lambda: baseline(df),
        "parse_values": lambda: parse_values(df, SCHEMA, fields, ["shard_id"]),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    builds: dict[str, list[float]] = {name: [] for name in variants}
    for make in variants.values():  # warm-up: code generation, caches
        make().write.format("noop").mode("overwrite").save()
    for _ in range(opts.builds):
        for name, make in variants.items():
            started = time.process_time()
            make()
            builds[name].append(time.process_time() - started)
    for _ in range(opts.rounds):
        for name, make in variants.items():
            started = time.perf_counter()
            make().write.format("noop").mode("overwrite").save()
            times[name].append(time.perf_counter() - started)
    spark.stop()

    base = statistics.median(times["from_json"])
    lines = [
        f"{opts.rows:,} JSON records of 4 fields, local[2], {opts.rounds} rounds alternated, "
        "medians (Spark's `noop` sink: every row parsed):",
        "",
        "| parse | seconds | rows/s | vs from_json | driver CPU to build it, ms |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        median = statistics.median(values)
        build = 1e3 * statistics.median(builds[name])
        lines.append(
            f"| `{name}` | {median:.2f} | {opts.rows / median:,.0f} | {median / base:.2f}x "
            f"| {build:.2f} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if not opts.no_write:
        out = Path(__file__).parent / "results" / "value_schema.md"
        out.write_text(report)


if __name__ == "__main__":
    main()
