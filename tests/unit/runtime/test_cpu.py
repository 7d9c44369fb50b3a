"""The worker's CPU figure: the cgroup-aware limit, children's seconds, the meter (pure, with
injected readers and clocks), and one real sample of this process."""

from __future__ import annotations

import time

import pytest

from kclpy_spark.runtime.cpu import CpuMeter, children_cpu_seconds, cpu_limit


@pytest.mark.parametrize(
    ("files", "cpus", "limit"),
    [
        ({}, 4, 4.0),  # no cgroup files: the CPUs it may run on
        ({"/sys/fs/cgroup/cpu.max": "max 100000\n"}, 4, 4.0),  # v2, no quota
        ({"/sys/fs/cgroup/cpu.max": "150000 100000\n"}, 4, 1.5),  # v2, 1.5 CPUs
        ({"/sys/fs/cgroup/cpu.max": "800000 100000\n"}, 2, 2.0),  # quota above the CPUs
        ({"/sys/fs/cgroup/cpu.max": "garbage\n"}, 2, 2.0),
        (
            {
                "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000\n",
                "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            },
            8,
            0.5,
        ),  # v1
        (
            {
                "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
                "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            },
            8,
            8.0,
        ),  # v1, no quota
    ],
)
def test_the_limit_is_the_cgroup_quota_capped_by_the_cpus(
    files: dict[str, str], cpus: int, limit: float
) -> None:
    assert cpu_limit(files.get, cpus) == limit


def test_the_meter_gives_percent_of_the_limit_since_the_last_sample() -> None:
    clock, used = [100.0], [5.0]
    meter = CpuMeter(lambda: used[0], lambda: clock[0], limit=2.0)
    assert meter.sample() is None and meter.last_percent is None  # nothing to compare yet
    clock[0], used[0] = 110.0, 15.0  # 10 CPU seconds in 10 s on 2 CPUs
    assert meter.sample() == 50.0 == meter.last_percent
    clock[0], used[0] = 120.0, 12.0  # a child ended: its seconds went with it
    assert meter.sample() == 0.0
    clock[0], used[0] = 121.0, 20.0  # more than the limit (rounding, a burst): capped
    assert meter.sample() == 100.0
    assert meter.sample() is None  # no time passed


def test_children_are_read_from_proc() -> None:
    files = {
        "/proc/7/task/7/children": "8 9",
        "/proc/8/stat": "8 (java (jvm)) S 7 " + " ".join(["0"] * 9) + " 250 150 0 0",
        "/proc/9/stat": "broken",
    }
    import os

    real_listdir = os.listdir
    try:
        os.listdir = lambda path: ["7"] if path == "/proc/7/task" else real_listdir(path)  # type: ignore[assignment]
        seconds = children_cpu_seconds(files.get, pid=7)
    finally:
        os.listdir = real_listdir  # type: ignore[assignment]
    ticks = os.sysconf("SC_CLK_TCK")
    assert seconds == pytest.approx(400 / ticks)


def test_a_real_sample_of_this_process() -> None:
    meter = CpuMeter()
    assert meter.sample() is None
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    time.sleep(0.01)
    figure = meter.sample()
    assert figure is not None and 0.0 < figure <= 100.0


def test_a_figure_is_settled_only_when_the_marker_held_over_its_window() -> None:
    """The worker passes its consumer set's change count: a window in which a consumer started
    or ended gives an unsettled figure (the load rule does not judge on it)."""
    clock, used = [0.0], [0.0]
    meter = CpuMeter(lambda: used[0], lambda: clock[0], limit=1.0, wall=lambda: 500 + clock[0])
    assert meter.sample(0) is None and not meter.settled  # no window yet
    clock[0], used[0] = 10.0, 5.0
    assert meter.sample(0) == 50.0 and meter.settled and meter.since == 500.0
    clock[0], used[0] = 20.0, 6.0
    assert meter.sample(1) == 10.0 and not meter.settled  # a consumer started in the window
    clock[0], used[0] = 30.0, 7.0
    assert meter.sample(1) == 10.0 and meter.settled and meter.since == 520.0
