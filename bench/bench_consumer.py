"""Consumer throughput and client CPU per record: ``python bench/bench_consumer.py``.

Three comparisons, each against a baseline measured in the same run, variants alternated (the
order rotates every repeat), each run in a fresh child process, median of ``--repeats`` runs:

1. kinesalite (in memory, 127.0.0.1), a 4-shard stream holding 200,000 records of 200 B, read
   from TRIM_HORIZON until every record arrived:
   * ``bare``: aiobotocore GetRecords (Limit 10,000) on all shards concurrently, no pause;
   * ``bare-fast``: the same with the fast decode installed (shows the emulator's ceiling);
   * ``ours-fast``: the real worker (``run_worker``, lease_store "memory", idle time 0.1 s, no
     pacing by the shard read limit: ``max_read_bytes_per_second = 0``, as the others read) with a
     no-op processor that checkpoints once per batch, fast GetRecords decode on;
   * ``ours-std``: the same with ``KCLPY_SPARK_FAST_DECODE=0`` (botocore parses);
   * ``async-kinesis``: async-kinesis (PyPI) tuned: 5 fetches/s/shard, a 100k-item queue, a
     raw-bytes processor (no JSON), MemoryCheckPointer (checkpoints once per fetched batch);
2. the stand-in server (``bench/standin_server.py``, its own process, its read limits off:
   ``--read-limit -1``) replaying a 10,000-record GetRecords body captured from kinesalite,
   with 4 and 16 shards: ``bare`` vs ``ours-fast``,
   ``ours-std``, ``ours-fast-gc`` (the GC tuned: a diagnosis) and ``async-kinesis``;
3. client CPU per record: botocore's own parse of the captured body, in process, vs the worker's
   process CPU per record (from 2, where the server costs ~nothing).

A run's time starts when the consumer is started (``run_worker`` called, the bare drain's first
ListShards) and ends when the last record reached the processor; its CPU is the child process's
CPU (all threads) over the same window. Each run is ``bench/consumer_runs.py`` in a child
process. Writes ``bench/results/consumer.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    CACHE,
    CpuMeter,
    child_env,
    machine,
    median,
    run_child,
    stamp,
    write_results,
)
from consumer_runs import GC_TUNING, IDLE_TIME

STREAM = "bench"
RUNS = str(Path(__file__).resolve().with_name("consumer_runs.py"))
BODY = CACHE / "getrecords-10000.json"
KINESALITE_VARIANTS = ("bare", "bare-fast", "ours-fast", "ours-std", "async-kinesis")
STANDIN_VARIANTS = ("bare", "ours-fast", "ours-std", "ours-fast-gc", "async-kinesis")


# --- the parent: set-up, alternation, report -----------------------------------------------------


def capture_body(endpoint: str, stream: str, path: Path) -> bytes:
    """One full 10,000-record GetRecords body, as the endpoint sent it (HTTP body bytes)."""
    from kinesalite import sync_client

    client = sync_client(endpoint)
    captured: list[bytes] = []

    def keep(response_dict: dict[str, Any], **_: Any) -> None:
        captured.append(bytes(response_dict["body"]))

    client.meta.events.register("before-parse.kinesis.GetRecords", keep)
    shard = client.list_shards(StreamName=stream)["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    resp = client.get_records(ShardIterator=iterator, Limit=10_000)
    if len(resp["Records"]) != 10_000:
        raise RuntimeError(f"captured {len(resp['Records'])} records, wanted 10,000")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(captured[-1])
    return captured[-1]


def parse_costs(body: bytes, repeats: int = 5) -> dict[str, float]:
    """CPU us per record, in this process, median of ``repeats``: botocore's parse of ``body``
    and the fast decode of it (lazy, then with every record's data decoded)."""
    import gc

    import botocore.session
    from botocore.parsers import create_parser

    from kclpy_spark.retrieval.fastdecode import decode_response

    model = botocore.session.get_session().get_service_model("kinesis")
    shape = model.operation_model("GetRecords").output_shape
    parser = create_parser("json")
    count = len(json.loads(body)["Records"])

    def response() -> dict[str, Any]:
        return {"status_code": 200, "headers": {}, "body": body, "context": {}}

    def botocore_parse() -> None:
        parser.parse(response(), shape)

    def fast_lazy() -> None:
        custom: dict[str, Any] = {}
        decode_response(response(), custom)

    def fast_eager() -> None:
        custom: dict[str, Any] = {}
        decode_response(response(), custom)
        for r in custom["Records"]:
            r.binary_data  # noqa: B018 - forces the base64 decode

    costs: dict[str, float] = {}
    for name, fn in (("botocore", botocore_parse), ("fast", fast_lazy), ("fast_eager", fast_eager)):
        samples = []
        for _ in range(repeats):
            gc.collect()
            cpu0 = time.process_time()
            fn()
            samples.append((time.process_time() - cpu0) / count * 1e6)
        costs[name] = median(samples)
    return costs


def rounds(
    variants: Sequence[str],
    repeats: int,
    endpoint: str,
    target: int,
    emulator_pid: int | None,
    env: dict[str, str],
) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(repeats):
        order = list(variants[rep % len(variants) :]) + list(variants[: rep % len(variants)])
        for variant in order:
            meter = CpuMeter(emulator_pid) if emulator_pid else None
            if meter:
                meter.start()
            out = run_child([RUNS, variant, endpoint, STREAM, str(target)], env=env, timeout=600)
            if meter:
                out["emulator_cpu"] = meter.stop()
            out["rate"] = out["records"] / out["seconds"]
            results[variant].append(out)
            print(
                f"  {variant:14s} rep {rep + 1}: {out['records']:,} records in "
                f"{out['seconds']:.2f}s = {out['rate']:,.0f}/s, client CPU "
                f"{out['cpu'] / out['records'] * 1e6:.1f} us/record"
                + (
                    f", emulator CPU {out['emulator_cpu'] / out['records'] * 1e6:.1f} us/record"
                    if meter
                    else ""
                ),
                flush=True,
            )
    return results


def summarize(
    results: dict[str, list[dict[str, Any]]], baseline: str, target: int
) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Markdown rows (variant, median records/s, ratio to ``baseline``, CPU us/record, ...)."""
    meds: dict[str, dict[str, float]] = {}
    for variant, runs in results.items():
        meds[variant] = {
            "rate": median([r["rate"] for r in runs]),
            "cpu_us": median([r["cpu"] / r["records"] * 1e6 for r in runs]),
            "emulator_us": median([r.get("emulator_cpu", 0.0) / r["records"] * 1e6 for r in runs]),
            "complete": float(all(r["records"] >= target for r in runs)),
        }
    base = meds[baseline]["rate"]
    rows = [
        "| consumer | records/s (median) | runs | vs " + baseline + " | client CPU us/record "
        "| emulator CPU us/record | all records |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for variant, m in meds.items():
        runs = ", ".join(f"{r['rate']:,.0f}" for r in results[variant])
        rows.append(
            f"| {variant} | {m['rate']:,.0f} | {runs} | {m['rate'] / base:.2f}x | "
            f"{m['cpu_us']:.1f} | {m['emulator_us']:.1f} | "
            f"{'yes' if m['complete'] else 'NO'} |"
        )
    return rows, meds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--standin-records", type=int, default=600_000, help="records per stand-in run"
    )
    parser.add_argument("--standin-shards", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    parser.add_argument("--no-standin", action="store_true")
    parser.add_argument(
        "--no-kinesalite",
        action="store_true",
        help=f"stand-in runs only, replaying the body captured by an earlier run ({BODY})",
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    env = child_env()
    lines = [
        "# Consumer throughput and client CPU per record",
        "",
        f"Run {stamp()} with `python bench/bench_consumer.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
    ]
    body = BODY.read_bytes() if args.no_kinesalite else _kinesalite_section(args, env, lines)

    costs = parse_costs(body)
    if not args.no_standin:
        for shards in args.standin_shards:
            std = _standin_rounds(shards, args, env)
            rows, std_meds = summarize(std, "bare", args.standin_records)
            lines += [
                f"## Stand-in server, {shards} shards, {args.standin_records:,} records",
                "",
                "Endpoint: `bench/standin_server.py` on 127.0.0.1 (its own process), replaying "
                f"the captured {len(body):,}-byte, 10,000-record body with a fresh "
                "NextShardIterator. `ours-fast-gc` is ours-fast with the garbage collector tuned "
                f"in the child ({GC_TUNING}): a diagnosis, not a default.",
                "",
                *rows,
                "",
            ]
            if "async-kinesis" in std_meds and "ours-fast" in std_meds:
                ratio = std_meds["ours-fast"]["rate"] / std_meds["async-kinesis"]["rate"]
                lines += [f"ours-fast / async-kinesis: {ratio:.2f}x.", ""]
            if shards == args.standin_shards[0]:
                cpu_rows = _cpu_rows(costs, std_meds, shards)
        lines += cpu_rows
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        print(f"written to {write_results('consumer.md', text)}")


def _kinesalite_section(args: argparse.Namespace, env: dict[str, str], lines: list[str]) -> bytes:
    """Load kinesalite, capture a body, run the kinesalite variants; append the section."""
    from kinesalite import Kinesalite, load_stream

    kin_variants = [v for v in KINESALITE_VARIANTS if v not in args.skip]
    with Kinesalite() as emulator:
        print(f"kinesalite at {emulator.endpoint}; loading {args.records:,} records", flush=True)
        put_seconds = load_stream(
            emulator.endpoint, STREAM, shards=args.shards, records=args.records
        )
        body = capture_body(emulator.endpoint, STREAM, BODY)
        print(f"loaded in {put_seconds:.1f}s; captured a {len(body):,}-byte body", flush=True)
        kin = rounds(kin_variants, args.repeats, emulator.endpoint, args.records, emulator.pid, env)
    rows, kin_meds = summarize(kin, "bare", args.records)
    lines += [
        f"## kinesalite {_kinesalite_version()}, {args.shards} shards, {args.records:,} records "
        f"of 200 B, TRIM_HORIZON",
        "",
        f"Endpoint: kinesalite in memory on 127.0.0.1 (started by the benchmark). Median of "
        f"{args.repeats}; order rotated each repeat. Worker idle time {IDLE_TIME} s.",
        "",
        *rows,
        "",
    ]
    if "async-kinesis" in kin_meds:
        ak = kin_meds["async-kinesis"]["rate"]
        lines.append(
            f"ours-fast / async-kinesis: {kin_meds['ours-fast']['rate'] / ak:.2f}x; "
            f"ours-std / async-kinesis: {kin_meds['ours-std']['rate'] / ak:.2f}x."
        )
        lines.append("")

    return body


def _standin_rounds(
    shards: int, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    standin = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("standin_server.py")), "--body", str(BODY),
         "--shards", str(shards), "--read-limit", "-1"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert standin.stdout is not None
        endpoint = standin.stdout.readline().strip()
        print(f"stand-in at {endpoint}, {shards} shards", flush=True)
        variants = [v for v in STANDIN_VARIANTS if v not in args.skip]
        return rounds(variants, args.repeats, endpoint, args.standin_records, standin.pid, env)
    finally:
        standin.terminate()
        standin.wait(timeout=10)


def _cpu_rows(costs: dict[str, float], meds: dict[str, dict[str, float]], shards: int) -> list[str]:
    base = costs["botocore"]
    rows = [
        "## Client CPU per record",
        "",
        f"Process CPU (all threads) / records, from the {shards}-shard stand-in runs above (the "
        "server's CPU is not in it); the parse rows are measured in this process on the "
        "captured body, median of 5.",
        "",
        "| what | CPU us/record | vs botocore's parse |",
        "|---|---:|---:|",
        f"| botocore's own parse of the captured body | {base:.2f} | 1.00x |",
        f"| fast decode of the same body, lazy | {costs['fast']:.2f} | "
        f"{costs['fast'] / base:.2f}x |",
        f"| fast decode, every record's data decoded | {costs['fast_eager']:.2f} | "
        f"{costs['fast_eager'] / base:.2f}x |",
    ]
    labels = {
        "ours-fast": "the worker, fast decode, no-op processor",
        "ours-fast-gc": f"the same, GC tuned ({GC_TUNING})",
        "ours-std": "the worker, botocore parse, no-op processor",
        "bare": "bare aiobotocore drain, botocore parse",
    }
    for variant, label in labels.items():
        if variant in meds:
            cpu = meds[variant]["cpu_us"]
            rows.append(f"| {label} | {cpu:.2f} | {cpu / base:.2f}x |")
    return [*rows, ""]


def _kinesalite_version() -> str:
    from kinesalite import VERSION

    return VERSION


if __name__ == "__main__":
    main(sys.argv[1:])
