"""The CPU quota of this process's own cgroup, wherever it sits in the hierarchy.

A container usually sees its own cgroup at the mount's root (``/sys/fs/cgroup/cpu.max``), but a
daemon run as a systemd service with ``CPUQuota=`` has its quota in its unit's folder
(``/sys/fs/cgroup/system.slice/app.service/cpu.max``), a container without a cgroup namespace
sees its cgroup below the mount's root, and a quota set on any ancestor caps everything beneath
it. So, as the JVM and Go's automaxprocs do: the process's cgroup path per hierarchy from
``/proc/self/cgroup``; each cgroup mount (v2 ``cgroup2``; v1 ``cgroup`` with the ``cpu``
controller) and the part of the hierarchy it shows from ``/proc/self/mountinfo``; then every
folder from the process's cgroup up to the mount point, and the smallest quota found there.
Without ``/proc/self/cgroup`` only the mount points are read; without ``/proc/self/mountinfo``,
only the usual ones (``/sys/fs/cgroup/cpu.max``, then ``/sys/fs/cgroup/cpu/cpu.cfs_quota_us``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator

Read = Callable[[str], str | None]

V2_ROOT = "/sys/fs/cgroup"
V1_ROOT = "/sys/fs/cgroup/cpu"


def cpu_quota(read: Read) -> float | None:
    """The smallest CPU quota (in CPUs) set on this process's cgroup or an ancestor; None if
    none is set or nothing can be read."""
    mountinfo = read("/proc/self/mountinfo")
    if mountinfo is None:
        return _v2_quota(read, V2_ROOT) or _v1_quota(read, V1_ROOT)
    own_cgroups = read("/proc/self/cgroup")
    paths = _own_paths(own_cgroups) if own_cgroups is not None else {"v1": "/", "v2": "/"}
    quotas = []
    for version, root, mount_point in cgroup_mounts(mountinfo):
        own = paths.get(version)
        if own is None:
            continue
        for folder in _folders(own, root, mount_point):
            quota = (_v2_quota if version == "v2" else _v1_quota)(read, folder)
            if quota is not None:
                quotas.append(quota)
    return min(quotas) if quotas else None


def _own_paths(text: str) -> dict[str, str]:
    """This process's cgroup path in the v2 hierarchy (``0::/path``) and in the v1 hierarchy that
    holds the cpu controller (``3:cpu,cpuacct:/path``)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    return paths


def cgroup_mounts(mountinfo: str) -> Iterator[tuple[str, str, str]]:
    """(version, root within the hierarchy, mount point) of each cgroup mount that can hold a CPU
    quota. A mountinfo line: ``id parent dev root mount-point options [tags] - type source
    super-options``."""
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or not after:
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if after[0] == "cgroup2":
            yield "v2", root, mount_point
        elif after[0] == "cgroup" and len(after) > 2 and "cpu" in after[2].split(","):
            yield "v1", root, mount_point


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _folders(own: str, root: str, mount_point: str) -> list[str]:
    """The folders from the process's cgroup up to the mount point; none when the mount does not
    show the process's cgroup (a path through ``..``, outside its cgroup namespace, or outside
    the part of the hierarchy the mount shows): a quota read there would be another cgroup's."""
    if ".." in own.split("/"):
        return []
    own, root = posixpath.normpath(own), posixpath.normpath(root)
    if root == "/":
        relative = own
    elif own == root or own.startswith(root + "/"):
        relative = own[len(root) :]
    else:
        return []
    parts = [p for p in relative.split("/") if p]
    return [posixpath.join(mount_point, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quota(read: Read, folder: str) -> float | None:
    text = read(f"{folder}/cpu.max")
    parts = text.split() if text else []
    if len(parts) == 2 and parts[0] != "max":
        return _ratio(parts[0], parts[1])
    return None


def _v1_quota(read: Read, folder: str) -> float | None:
    quota = read(f"{folder}/cpu.cfs_quota_us")
    period = read(f"{folder}/cpu.cfs_period_us")
    if quota and period and quota.strip() != "-1":
        return _ratio(quota, period)
    return None


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = float(quota), float(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None
