"""Reading on separate executor processes (``local-cluster[2,1,1024]``: two executor JVMs, each
with its own Python workers), in a process of its own: the probe sees distinct executor
processes and names a wrong endpoint in one line; every record of every shard comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from cluster_read_job import PY_FILES_ENV
from worker_procs import free_port

JOB = Path(__file__).with_name("cluster_read_job.py")
REPO = Path(__file__).resolve().parents[2]


def run_job(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(JOB), *args],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture
def stream(kinesis_client: Any, unique_name: str) -> str:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    kinesis_client.get_waiter("stream_exists").wait(
        StreamName=unique_name, WaiterConfig={"Delay": 0.5, "MaxAttempts": 120}
    )
    return unique_name


def test_executors_in_their_own_processes_read_every_shard(
    kinesis_client: Any, localstack_endpoint: str, stream: str
) -> None:
    unique_name = stream
    for i in range(60):
        kinesis_client.put_record(
            StreamName=unique_name, Data=f"r{i}".encode(), PartitionKey=f"k{i}"
        )
    bad = f"http://127.0.0.1:{free_port()}"
    out = run_job(localstack_endpoint, unique_name, "2", bad)
    assert sorted(out["rows"]) == sorted(f"r{i}" for i in range(60))
    assert sum(out["ends"].values()) == 60
    pids = out["probe_pids"]
    assert out["driver_pid"] not in pids and len(pids) >= 2  # two executors' Python workers
    error = out["bad_endpoint_error"]
    assert "\n" not in error and bad in error and "cannot reach Kinesis stream" in error


def test_executors_that_cannot_import_the_project_are_one_line_at_the_probe(
    localstack_endpoint: str, stream: str, tmp_path: Path
) -> None:
    """The executors' Python is this one with kclpy_spark hidden (a sitecustomize that refuses
    the import), as on a cluster where only pyspark is installed."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'kclpy_spark' or name.startswith('kclpy_spark.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'kclpy_spark'\")\n"
        "sys.meta_path.insert(0, Refuse())\n"
    )
    python = tmp_path / "executor-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{blocker}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    out = run_job(localstack_endpoint, stream, "2", localstack_endpoint, str(python))
    error = out["probe_error"]
    assert "\n" not in error and "cannot import kclpy_spark" in error and "--py-files" in error


def test_executors_without_the_project_installed_read_it_shipped_with_py_files(
    kinesis_client: Any, localstack_endpoint: str, stream: str, tmp_path: Path
) -> None:
    """README's --py-files way: the executors' Python has no kclpy_spark (the editable install's
    finder and this checkout taken off its path); the packages, zipped, reach them through
    ``spark.submit.pyFiles``, and they import and read from the zip."""
    for i in range(20):
        kinesis_client.put_record(StreamName=stream, Data=f"r{i}".encode(), PartitionKey=f"k{i}")
    shipped = tmp_path / "kclpy_spark_packages.zip"
    with zipfile.ZipFile(shipped, "w") as zf:
        for package in ("kclpy_spark", "checkpoint", "shard_sync"):
            for path in (REPO / package).rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    zf.write(path, path.relative_to(REPO))
    hider = tmp_path / "hider"
    hider.mkdir()
    (hider / "sitecustomize.py").write_text(
        "import sys\n"
        f"REPO = {str(REPO)!r}\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "sys.path[:] = [p for p in sys.path if p.rstrip('/') != REPO]\n"
    )
    python = tmp_path / "executor-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{hider}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    bare = subprocess.run(
        [str(python), "-c", "import kclpy_spark; print(kclpy_spark.__file__)"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert bare.returncode != 0, f"the executors' Python still finds kclpy_spark: {bare.stdout}"
    env = dict(os.environ, **{PY_FILES_ENV: str(shipped)})
    out = run_job(localstack_endpoint, stream, "2", localstack_endpoint, str(python), env=env)
    assert "probe_error" not in out, out
    assert out["imported_from"] and all(str(shipped.name) in p for p in out["imported_from"])
    assert sorted(out["rows"]) == sorted(f"r{i}" for i in range(20))
