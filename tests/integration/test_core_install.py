"""#45: the wheel as users install it. Built from this checkout, it goes into a fresh virtualenv
without extras (no pyspark, pyarrow, pandas or deltalake), and README's processor, copied from
README.md as it stands, reads a LocalStack stream from it; a ``[sink]`` there is one line naming
the extra. A second fresh virtualenv gets ``kclpy-spark[spark]``, runs a Parquet sink, and
finds the ``kinesis-kcl`` readStream source registered by its module's name alone.

pip resolves ``[spark]`` for real in the second one, but the Spark packages themselves (pyspark,
pyarrow, pandas and what they need, ~700 MB) are linked from the test's own virtualenv rather
than unpacked again: that copy would cost CI a minute and tests nothing of ours. Each virtualenv
is made without pip of its own, this virtualenv's pip installing into it (``--python``), and
nothing is byte-compiled: ensurepip and compiling botocore were two thirds of the core install's
time, and neither is anything of ours."""

from __future__ import annotations

import os
import re
import shutil
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
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"  # a copy: a build in the checkout would leave build/ there
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "kclpy_spark", "checkpoint",
                 "shard_sync", "pyspark_kinesis_kcl.py"):  # fmt: skip
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        elif (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    _sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", work, source, cwd=work)
    return next(work.glob("kclpy_spark-*.whl"))


def _venv(work: Path) -> Path:
    """A fresh virtualenv without pip (this one's installs into it: ``_pip_install``)."""
    _sh(sys.executable, "-m", "venv", "--without-pip", work / "venv", cwd=work)
    return work / "venv"


def _pip_install(venv: Path, requirement: str | Path, cwd: Path) -> None:
    _sh(sys.executable, "-m", "pip", "--python", venv / "bin/python", "install", "-q",
        "--no-compile", requirement, cwd=cwd)  # fmt: skip


@pytest.fixture(scope="module")
def core_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("core-install")
    venv = _venv(work)
    _pip_install(venv, wheel, work)
    return venv


def _spark_closure() -> set[str]:
    """The distributions pyspark, pyarrow and pandas need, as installed here."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    todo, seen = ["pyspark", "pyarrow", "pandas"], set()
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for text in md.distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.fixture(scope="module")
def spark_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import importlib.metadata as md
    import sysconfig

    work = tmp_path_factory.mktemp("spark-install")
    venv = _venv(work)
    here = Path(sysconfig.get_paths()["purelib"])
    there = next((venv / "lib").glob("python3*/site-packages"))
    for name in _spark_closure():
        files = md.distribution(name).files or []
        for top in {str(f).split("/")[0] for f in files} - {"..", "__pycache__"}:
            (there / top).symlink_to(here / top)
    _pip_install(venv, f"{wheel}[spark]", work)
    return venv


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


def test_the_spark_extra_runs_a_parquet_sink(
    spark_venv: Path, kinesis_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    import pyarrow.parquet as pq

    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(30))
    (tmp_path / "app.toml").write_text(
        f'stream_name = "{unique_name}"\napplication_name = "{unique_name}"\n'
        f'endpoint_url = "{localstack_endpoint}"\ninitial_position = "TRIM_HORIZON"\n'
        f'lease_store = "sqlite:{tmp_path / "leases.db"}"\n'
        f'[sink]\nsink = "parquet:{tmp_path / "out"}"\nspark_target = "local[1]"\n'
        "max_wait = 1.0\n"
    )
    env = {**os.environ, "PYSPARK_PYTHON": str(spark_venv / "bin/python"),
           "PYSPARK_DRIVER_PYTHON": str(spark_venv / "bin/python")}  # fmt: skip
    run = subprocess.run(
        [str(spark_venv / "bin/kclpy-spark"), "run", "--config", "app.toml", "--until-caught-up"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = pq.read_table(tmp_path / "out").column("data").to_pylist()
    assert sorted(int(x) for x in rows) == list(range(30))
    # The wheel ships the no-chmod filesystem's jar (local_fs.py): Hadoop's default leaves .crc
    # files next to each file.
    assert not list((tmp_path / "out").rglob("*.crc"))

    # The readStream source is there without a registration line (pyspark_kinesis_kcl).
    probe = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".getOrCreate()\n"
        "df = s.readStream.format('kinesis-kcl').option('streamName', 'x')"
        ".option('region', 'us-east-1').load()\n"
        "print(df.schema.simpleString())\n"
    )
    found = subprocess.run([str(spark_venv / "bin/python"), "-c", probe], capture_output=True,
                           text=True, cwd=tmp_path, timeout=180, env=env, check=False)  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    assert "sequence_number:string" in found.stdout and "data:binary" in found.stdout
