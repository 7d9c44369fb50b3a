"""The soak benchmark's judgement of threads: each pool within the limit it exports, the processor
pool within the leases held in the time its idle threads live; and of counts that rise and fall
with Python's collector, by their peaks over quarters of the run (``bench/bench_soak.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_soak

LIMITS = {"limit:kclpy-spark": 128.0, "limit:kclpy-spark-lease": 4.0}


def _row(
    t: float, held: float, processor: float, lease: float = 1.0, pid: int = 7
) -> dict[str, Any]:
    return {"t": t, "worker": "b1", "pid": pid, "leases_held": held,
            "threads": 1 + processor + lease, "pool:MainThread": 1.0,
            "pool:kclpy-spark": processor, "pool:kclpy-spark-lease": lease, **LIMITS}  # fmt: skip


def test_threads_within_the_leases_held_lately_plus_two_pass() -> None:
    # 8 leases until 20 s, then 4: the 10 threads of 8 leases may live on for IDLE_SECONDS
    rows = [_row(t, 8 if t <= 20 else 4, 10 if t <= 40 else 6) for t in range(0, 100, 5)]
    checked, lines, misses = bench_soak.pool_bounds(rows, "b1", 5.0)
    assert checked == 20 and misses == []
    assert "| b1 | kclpy-spark | 10 | 0 |" in lines


def test_leases_taken_before_the_gauge_counts_them_are_allowed_one_sample() -> None:
    rows = [_row(0, 0, 2), _row(5, 0, 5), _row(10, 4, 6)]  # 4 leases' calls before the gauge
    assert bench_soak.pool_bounds(rows, "b1", 5.0)[2] == []


def test_threads_kept_past_the_idle_time_of_leases_gone_are_a_miss() -> None:
    rows = [_row(t, 8 if t <= 20 else 4, 9) for t in range(0, 100, 5)]
    _, _, misses = bench_soak.pool_bounds(rows, "b1", 5.0)
    # 4 leases + 2 from 65 s on (20 s + IDLE_SECONDS + two samples): 9 threads are over
    assert misses and misses[0].startswith("b1 kclpy-spark 9 > 6 at 65 s")


def test_a_restarted_process_is_not_allowed_the_leases_of_the_one_before() -> None:
    rows = [_row(0, 8, 10, pid=1), _row(5, 8, 10, pid=1), _row(10, 0, 10, pid=2)]
    _, _, misses = bench_soak.pool_bounds(rows, "b1", 5.0)
    assert misses == ["b1 kclpy-spark 10 > 2 at 10 s"]


def test_a_fixed_pool_over_its_limit_is_a_miss_and_unpooled_threads_are_counted() -> None:
    rows = [_row(0, 2, 1, lease=5)]
    _, _, misses = bench_soak.pool_bounds(rows, "b1", 5.0)
    assert misses == ["b1 kclpy-spark-lease 5 > 4 at 0 s"]
    bench_soak.outside_pools(rows)
    assert rows[0]["threads_unpooled"] == 1  # the main thread: no pool with a limit


def test_samples_without_limits_are_not_counted_and_a_missing_gauge_is_a_miss() -> None:
    """Every sample counted as checked, one with no limit to judge among them, and a sample
    without thread counts passed at none: "646 samples, none over a bound" could compare
    nothing."""
    bare = {"t": 0.0, "worker": "b1", "pid": 1}
    idle = _row(5, 2, 3)
    del idle["pool:kclpy-spark-lease"]  # no thread in that pool now: left out of the gauge
    blind = {k: v for k, v in _row(10, 2, 3).items() if not k.startswith("pool:")}
    checked, _, misses = bench_soak.pool_bounds([bare, idle, blind], "b1", 5.0)
    assert checked == 2 and misses == ["b1: no thread counts at 10 s"]


def test_without_leases_held_the_processor_pool_has_its_size_for_bound() -> None:
    row = _row(0, 0, 100)
    del row["leases_held"]
    assert bench_soak.pool_bounds([row], "b1", 5.0)[2] == []


def _stored(t: float, value: float) -> dict[str, Any]:
    return {"t": t, "worker": "a", "pid": 7, "leases_held": 2.0,
            "sink_executor_reads_stored": value}  # fmt: skip


def test_stored_reads_that_cycle_with_the_collector_are_judged_by_their_peaks_over_quarters() -> (
    None
):
    # A sawtooth of 20 samples (0 to 19) with a higher peak every 100 (at 95, 195, 295, 395):
    # the tenth after warm-up (samples 60-93) misses the one the last tenth holds (395), each
    # quarter holds one.
    rows = [_stored(5.0 * i, 25.0 if i % 100 == 95 else float(i % 20)) for i in range(400)]
    g = bench_soak.growth(rows, "a", "sink_executor_reads_stored", 0.15)
    assert g is not None and g[2] == 0.0
    equal = bench_soak.growth_at_equal_leases(rows, "a", "sink_executor_reads_stored", 0.15)
    assert equal is not None and equal[2] == 0.0


def test_stored_reads_whose_peaks_grow_are_a_growth() -> None:
    rows = [_stored(5.0 * i, float(i % 20) * (1 + i / 400)) for i in range(400)]
    g = bench_soak.growth(rows, "a", "sink_executor_reads_stored", 0.15)
    assert g is not None and g[2] > 0.3


def test_log_lines_at_warning_or_worse_are_found_ours_and_sparks(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(
        "2026-12-04 23:52:03,101 INFO    kclpy_spark.runtime.worker: worker a: started\n"
        "2026-12-04 23:52:04,200 WARNING kclpy_spark.spark.writer: lease shardId-000000000001: "
        "checkpoint after the write failed: 'x'\n"
        "2026-12-04 23:52:05,300 WARN    spark.MemoryManager: Total allocation exceeds 95.00%\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "2026-12-04 23:52:06,400 ERROR   kclpy_spark.runtime.consumer: shard shardId-000000000002: "
        "reading the shard failed (attempt 1 of 10): boom\n"
        "2026-12-04 23:52:07,500 WARNING kclpy_spark.spark.writer: lease shardId-000000000003: "
        "checkpoint after the write failed: 'x'\n"
    )
    lines = bench_soak.loud_lines(log, tmp_path / "absent.log")
    assert len(lines) == 4
    kinds = bench_soak.loud_kinds(lines)
    assert kinds[0] == ("2 x `WARNING kclpy_spark.spark.writer: lease shardId-N: checkpoint "
                        "after the write failed: 'x'`")  # fmt: skip
    assert len(kinds) == 3
