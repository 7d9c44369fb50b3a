"""Worker memory with a large backlog and a slow processor: ``python bench/bench_rss.py``.

kinesalite (in memory) holds a backlog of ``--records`` (default 1,000,000) records of 200 B in a
``--shards``-shard stream. A worker process (``python -m kclpy_spark.cli run --config ...``,
TRIM_HORIZON, memory lease store, default retrieval settings: max_records 10,000,
prefetch_batches 3) runs ``SlowProcessor`` below, which sleeps ``--sleep`` seconds per batch and
checkpoints. This process samples the worker's RSS (psutil) every 0.5 s for ``--seconds`` and
reports the maximum; the target is < 500 MB. What bounds it: each shard's fetcher blocks on a
queue of ``prefetch_batches`` batches, so at most (prefetch_batches + 2) x max_records records per
shard are in memory (queued, being processed, being fetched). Writes ``bench/results/rss.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BENCH, child_env, machine, stamp, write_results

from kclpy_spark.processor import ProcessRecordsInput, RecordProcessor

MB = 1024 * 1024


class SlowProcessor(RecordProcessor):
    """Sleeps ``BENCH_RSS_SLEEP`` seconds per batch (touching every record's data), then
    checkpoints."""

    def __init__(self) -> None:
        self.sleep = float(os.environ.get("BENCH_RSS_SLEEP", "4.0"))

    def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        size = sum(len(r.binary_data) for r in process_records_input.records)
        assert size > 0
        time.sleep(self.sleep)
        process_records_input.checkpointer.checkpoint()


def sample(pid: int, seconds: float) -> list[tuple[float, float]]:
    import psutil

    proc = psutil.Process(pid)
    samples = []
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        try:
            samples.append((time.monotonic() - began, proc.memory_info().rss / MB))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.5)
    return samples


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=4.0, help="processor sleep per batch, s")
    parser.add_argument("--seconds", type=float, default=90.0, help="how long to sample")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from kinesalite import VERSION, Kinesalite, load_stream

    stream = f"bench-rss-{uuid.uuid4().hex[:6]}"
    with Kinesalite(max_old_space_mb=8192) as emulator, tempfile.TemporaryDirectory() as tmp:
        print(f"loading {args.records:,} records into {emulator.endpoint}", flush=True)
        put_seconds = load_stream(
            emulator.endpoint, stream, shards=args.shards, records=args.records
        )
        print(f"loaded in {put_seconds:.0f}s", flush=True)
        config = Path(tmp) / "worker.toml"
        config.write_text(
            f'application_name = "{stream}"\nstream_name = "{stream}"\n'
            f'endpoint_url = "{emulator.endpoint}"\nregion = "us-east-1"\n'
            f'initial_position = "TRIM_HORIZON"\nlease_store = "memory"\n'
            f'processor = "bench_rss:SlowProcessor"\n'
        )
        env = child_env(BENCH_RSS_SLEEP=str(args.sleep))
        env["PYTHONPATH"] = os.pathsep.join([str(BENCH), env["PYTHONPATH"]])
        log = (Path(tmp) / "worker.log").open("wb")
        worker = subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp,
        )  # fmt: skip
        try:
            samples = sample(worker.pid, args.seconds)
        finally:
            worker.terminate()
            worker.wait(timeout=60)
            log.close()
        failed = worker.returncode not in (0, -15)
        tail = (Path(tmp) / "worker.log").read_text(errors="replace")[-2000:]
    if failed or not samples:
        raise SystemExit(f"the worker failed ({worker.returncode}):\n{tail}")
    peak = max(rss for _, rss in samples)
    started = samples[0][1]
    # Each shard's processor takes at most one batch per sleep; each shard holds this many.
    batches_taken = int(args.seconds / args.sleep) + 1
    batches_held = args.records // args.shards // 10_000
    lines = [
        "# Worker RSS with a large backlog and a slow processor",
        "",
        f"Run {stamp()} with `python bench/bench_rss.py"
        f"{' ' + ' '.join(argv) if argv else ''}` on {machine()}.",
        "",
        f"Endpoint: kinesalite {VERSION} in memory on 127.0.0.1 (started by the benchmark), "
        f"{args.shards} shards, a backlog of {args.records:,} records of 200 B (put in "
        f"{put_seconds:.0f} s); one worker process (`kclpy-spark run`), TRIM_HORIZON, memory "
        "lease store, default retrieval settings (max_records 10,000, prefetch_batches 3), "
        f"a processor that sleeps {args.sleep:g} s per batch; RSS sampled every 0.5 s for "
        f"{args.seconds:g} s. Each shard's processor takes at most {batches_taken} batches of "
        f"10,000 in that time, of the {batches_held} each shard holds: the backlog "
        f"{'never runs out' if batches_taken < batches_held else 'RUNS OUT (use a longer sleep)'}.",
        "",
        "| first sample MB | max RSS MB | last sample MB | target | met |",
        "|---:|---:|---:|---:|---|",
        f"| {started:.0f} | **{peak:.0f}** | {samples[-1][1]:.0f} | < 500 MB | "
        f"{'yes' if peak < 500 else 'NO'} |",
        "",
        "RSS over time (s: MB): "
        + ", ".join(f"{t:.0f}: {rss:.0f}" for t, rss in samples[:: max(1, len(samples) // 24)]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        print(f"written to {write_results('rss.md', text)}")


if __name__ == "__main__":
    main(sys.argv[1:])
