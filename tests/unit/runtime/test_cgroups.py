"""The CPU quota of the process's own cgroup: table-driven over the layouts a daemon meets (a
container with its own cgroup namespace, a systemd service with CPUQuota=, a parent's smaller
quota, a container without a cgroup namespace, a v1/v2 hybrid), and once for real: a process
started in a cgroup with a quota of half a CPU reports 0.5 (needs a writable cgroup v1 cpu
hierarchy, as root on this sandbox's kernel; skipped elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kclpy_spark.runtime.cgroups import cgroup_mounts
from kclpy_spark.runtime.cpu import cpu_limit

V2_MOUNT = "31 23 0:28 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
HYBRID_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
HYBRID_CGROUP = "4:memory:/other\n2:cpuacct:/\n1:cpu:{path}\n0::/\n"


def files(mountinfo: str, cgroup: str | None, quotas: dict[str, str]) -> dict[str, str]:
    """A fake /proc and /sys: ``quotas`` maps a folder to cpu.max's text (v2), or to
    ``quota/period`` (v1)."""
    out = {"/proc/self/mountinfo": mountinfo}
    if cgroup is not None:
        out["/proc/self/cgroup"] = cgroup
    for folder, text in quotas.items():
        if "/" in text:
            quota, period = text.split("/")
            out[f"{folder}/cpu.cfs_quota_us"] = quota + "\n"
            out[f"{folder}/cpu.cfs_period_us"] = period + "\n"
        else:
            out[f"{folder}/cpu.max"] = text + "\n"
    return out


CG = "/sys/fs/cgroup"
CASES = {
    "container with a cgroup namespace, quota at the root": (
        files(V2_MOUNT, "0::/\n", {CG: "150000 100000"}), 4, 1.5),
    "systemd service with CPUQuota=50%": (
        files(V2_MOUNT, "0::/system.slice/app.service\n",
              {f"{CG}/system.slice/app.service": "50000 100000"}), 4, 0.5),
    "a parent's smaller quota caps its child": (
        files(V2_MOUNT, "0::/system.slice/app.service\n",
              {f"{CG}/system.slice": "25000 100000",
               f"{CG}/system.slice/app.service": "50000 100000"}), 4, 0.25),
    "no quota anywhere: the CPUs": (
        files(V2_MOUNT, "0::/user.slice/x.scope\n",
              {CG: "max 100000", f"{CG}/user.slice/x.scope": "max 100000"}), 4, 4.0),
    "a quota above the CPUs": (
        files(V2_MOUNT, "0::/a\n", {f"{CG}/a": "800000 100000"}), 2, 2.0),
    "v1 container without a cgroup namespace (its cgroup is the mount's root)": (
        files("50 40 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup "
              "rw,cpu,cpuacct\n",
              "3:cpu,cpuacct:/docker/abc\n0::/\n",
              {f"{CG}/cpu,cpuacct": "200000/100000"}), 8, 2.0),
    "v1/v2 hybrid, quota in the process's v1 cpu cgroup": (
        files(HYBRID_MOUNTS, HYBRID_CGROUP.format(path="/kclpy/w1"),
              {f"{CG}/cpu/kclpy/w1": "50000/100000", f"{CG}/cpu": "-1/100000"}), 2, 0.5),
    "v1/v2 hybrid, no quota": (
        files(HYBRID_MOUNTS, HYBRID_CGROUP.format(path="/"), {f"{CG}/cpu": "-1/100000"}), 2, 2.0),
    "a path outside the namespace's view: nothing read (another cgroup's quota is not ours)": (
        files(V2_MOUNT, "0::/../sibling\n", {CG: "100000 100000", f"{CG}/sibling": "10000 100000"}),
        4, 4.0),
    "a mount showing another part of the hierarchy: nothing read there": (
        files("50 40 0:29 /docker/other /sys/fs/cgroup/cpu ro - cgroup cgroup rw,cpu\n",
              "3:cpu:/docker/abc\n", {f"{CG}/cpu": "10000/100000"}), 4, 4.0),
    "an escaped space in the mount point": (
        files("31 23 0:28 / /cg\\040root rw - cgroup2 cgroup2 rw\n", "0::/a\n",
              {"/cg root/a": "50000 100000"}), 4, 0.5),
    "unreadable /proc/self/cgroup: the mount points alone": (
        files(V2_MOUNT, None, {CG: "50000 100000", f"{CG}/a": "10000 100000"}), 4, 0.5),
    "no /proc/self/mountinfo: the usual mount points alone": (
        {f"{CG}/cpu/cpu.cfs_quota_us": "50000\n", f"{CG}/cpu/cpu.cfs_period_us": "100000\n"},
        4, 0.5),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_the_limit_is_the_smallest_quota_on_the_way_up_from_the_process_cgroup(name: str) -> None:
    case, cpus, limit = CASES[name]
    assert cpu_limit(case.get, cpus) == limit


def _writable_v1_cpu_hierarchy() -> Path | None:
    for version, _, mount_point in cgroup_mounts(Path("/proc/self/mountinfo").read_text()):
        mount = Path(mount_point)
        if version == "v1" and os.access(mount, os.W_OK) and (mount / "cpu.cfs_quota_us").exists():
            return mount
    return None


def test_a_process_in_a_cgroup_with_half_a_cpu_reports_half_a_cpu() -> None:
    mount = _writable_v1_cpu_hierarchy()
    if mount is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy here (needs root and cgroup v1)")
    group = mount / f"kclpy-spark-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup: {exc}")
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")
        code = "from kclpy_spark.runtime.cpu import cpu_limit; print(cpu_limit())"
        # The shell moves itself into the cgroup, then becomes Python (exec keeps the cgroup).
        join = 'echo $$ > "$1" && shift && exec "$@"'
        inside = subprocess.run(
            ["sh", "-c", join, "sh", str(group / "cgroup.procs"), sys.executable, "-c", code],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True, timeout=60)  # fmt: skip
    finally:
        group.rmdir()
    assert float(inside.stdout) == 0.5
    assert float(outside.stdout) == cpu_limit(cpus=None) > 0.5
