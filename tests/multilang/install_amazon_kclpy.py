"""Install amazon-kclpy's Python package into the running venv, without its jar download.

``pip install amazon-kclpy`` runs the package's setup.py, whose install and bdist_wheel commands
download about 80 jars from Maven Central (for the Java MultiLangDaemon we replace) and fail
without it; setup.py offers no switch to skip them. The Python package itself needs only boto3.
So this script:

1. downloads the source package with pip (``pip download --no-deps --no-binary :all:
   amazon-kclpy==3.2.0``; cached in ``.cache/amazon-kclpy/``),
2. builds a wheel by hand from the sdist's ``amazon_kclpy/`` folder (the .py files; no setup.py
   is run, no jar is fetched): METADATA, WHEEL and RECORD written with the standard library,
3. installs that wheel with ``pip install --no-deps --no-index`` into ``sys.executable``'s
   environment.

Idempotent: does nothing when amazon_kclpy 3.2.0 is already importable. Run it directly
(``.venv/bin/python tests/multilang/install_amazon_kclpy.py``) or through the test session
fixture. Exits non-zero with the reason when something fails (e.g. no network for the download).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib
import importlib.metadata
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

VERSION = "3.2.0"
NAME = "amazon-kclpy"
PACKAGE = "amazon_kclpy"
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "amazon-kclpy"


class InstallError(RuntimeError):
    pass


def installed_version() -> str | None:
    importlib.invalidate_caches()
    try:
        return importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise InstallError(
            f"command failed ({proc.returncode}): {' '.join(args)}\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def download_sdist() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"{PACKAGE}-{VERSION}.tar.gz"
    if not sdist.exists():
        _run(
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", f"{NAME}=={VERSION}", "-d", str(CACHE),
        )  # fmt: skip
    if not sdist.exists():
        raise InstallError(f"pip download did not produce {sdist}")
    return sdist


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(sdist: Path) -> Path:
    """A py3-none-any wheel of the sdist's ``amazon_kclpy`` package (Python files only)."""
    wheel = CACHE / f"{PACKAGE}-{VERSION}-py3-none-any.whl"
    prefix = f"{PACKAGE}-{VERSION}/"
    files: dict[str, bytes] = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = member.name
            inside = name[len(prefix) :] if name.startswith(prefix) else ""
            if member.isfile() and inside.startswith(f"{PACKAGE}/") and inside.endswith(".py"):
                handle = tar.extractfile(member)
                assert handle is not None
                files[inside] = handle.read()
            elif member.isfile() and inside in ("LICENSE.txt", "NOTICE.txt"):
                handle = tar.extractfile(member)
                assert handle is not None
                files[f"{PACKAGE}-{VERSION}.dist-info/{inside}"] = handle.read()
    if f"{PACKAGE}/kcl.py" not in files:
        raise InstallError(f"{sdist} has no {PACKAGE}/kcl.py")
    info = f"{PACKAGE}-{VERSION}.dist-info"
    files[f"{info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {NAME}\n"
        f"Version: {VERSION}\n"
        "Summary: A python interface for the Amazon Kinesis Client Library MultiLangDaemon "
        "(Python package only, built without its jars for kclpy-spark's tests)\n"
        "License: Apache-2.0\n"
        "Requires-Dist: boto3\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: kclpy-spark install_amazon_kclpy\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    record = [_record_line(path, data) for path, data in sorted(files.items())]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    tmp.replace(wheel)
    return wheel


def install() -> str:
    """Make amazon_kclpy VERSION importable in this environment; returns what was done. Several
    processes may call it at once (the test suite runs two): one installs, the others wait for it
    and then find it installed."""
    if installed_version() == VERSION:
        return f"{NAME} {VERSION} already installed"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if installed_version() == VERSION:
            return f"{NAME} {VERSION} installed meanwhile by another process"
        return _install()


def _install() -> str:
    wheel = build_wheel(download_sdist())
    _run(
        sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
        "--disable-pip-version-check", str(wheel),
    )  # fmt: skip
    importlib.invalidate_caches()
    _run(
        sys.executable, "-c", "from amazon_kclpy import kcl; from amazon_kclpy.v3 import processor"
    )
    if installed_version() != VERSION:
        raise InstallError(f"{NAME} {VERSION} is still not visible after installing {wheel}")
    return f"installed {NAME} {VERSION} from {wheel}"


if __name__ == "__main__":
    try:
        print(install())
    except InstallError as exc:
        print(f"install_amazon_kclpy: {exc}", file=sys.stderr)
        sys.exit(1)
