"""README command 1, shortened: `kclpy-spark demo` runs the whole path (two Spark-sink worker
daemons on LocalStack, a reshard, a kill -9 and restart) and every check it reports passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from worker_procs import worker_env


def test_the_demo_passes_every_check(localstack_endpoint: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "demo", "--endpoint", localstack_endpoint,
         "--seconds", "40", "--rate", "20", "--timeout", "150"],
        capture_output=True, text=True, timeout=420, env=worker_env(), cwd=tmp_path, check=False,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert "demo finished: every check passed" in out
    assert "missing                0" in out and "(duplicates: 0)" in out
    assert "kill -9 worker-b" in out and "splitting shardId-" in out
    assert "parents first" in out and "CHILD BEFORE PARENT" not in out
    assert "lag per shard over the run" in out
