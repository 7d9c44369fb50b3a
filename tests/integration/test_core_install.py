"""#45: the core install. The wheel built from this checkout goes into a fresh virtualenv
without extras (no pyspark, pyarrow, pandas or deltalake), and README's processor, copied from
README.md as it stands, reads a LocalStack stream from it; a ``[sink]`` there is one line naming
the extra. Slow-ish (a wheel build and an install from pip's cache): one test, shared steps."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, wait_active

REPO = Path(__file__).resolve().parents[2]


def _readme_processor() -> str:
    """The first Python block under README's "Writing a processor"."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Writing a processor", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README's processor example is gone"
    return match.group(1)


def _sh(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                            timeout=timeout, check=False)  # fmt: skip
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-2000:])
    return result


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("core-install")
    _sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work / "dist", REPO,
        cwd=work)  # fmt: skip
    wheel = next((work / "dist").glob("kclpy_spark-*.whl"))
    _sh(sys.executable, "-m", "venv", work / "venv", cwd=work)
    _sh(work / "venv/bin/python", "-m", "pip", "install", "-q", wheel, cwd=work)
    return work / "venv"


def test_the_core_install_runs_readmes_processor_without_spark(
    core_venv: Path, kinesis_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    python = core_venv / "bin/python"
    absent = _sh(python, "-c", "import importlib.util as u; print([m for m in "
                 "('pyspark', 'pyarrow', 'pandas', 'deltalake') if u.find_spec(m)])",
                 cwd=tmp_path)  # fmt: skip
    assert absent.stdout.strip() == "[]", "the core install pulled in a Spark dependency"
    import kclpy_spark

    version = _sh(core_venv / "bin/kclpy-spark", "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"kclpy-spark {kclpy_spark.__version__}"

    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(25))
    (tmp_path / "printer.py").write_text(_readme_processor())
    run = _sh(core_venv / "bin/kclpy-spark", "run", "--stream-name", unique_name,
              "--application-name", unique_name, "--endpoint-url", localstack_endpoint,
              "--processor", "printer:Printer", "--initial-position", "TRIM_HORIZON",
              "--lease-store", f"sqlite:{tmp_path / 'leases.db'}", "--until-caught-up",
              cwd=tmp_path, timeout=180)  # fmt: skip
    printed = [line.split() for line in run.stdout.splitlines() if line.startswith("shardId-")]
    assert sorted(int(words[2].strip("b'\"")) for words in printed) == list(range(25))

    (tmp_path / "sink.toml").write_text(
        f'stream_name = "{unique_name}"\nendpoint_url = "{localstack_endpoint}"\n'
        '[sink]\nsink = "parquet:out"\n'
    )
    refused = subprocess.run(
        [str(core_venv / "bin/kclpy-spark"), "run", "--config", "sink.toml"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    assert "pip install 'kclpy-spark[spark]'" in refused.stderr, refused.stderr
