"""The command's surface as a user meets it: ``--version`` from the one version, ``python -m
kclpy_spark``, a bad flag or a closed pipe never a traceback, each subcommand only its own
flags, and start-up errors in the chosen log format. Real processes, no AWS needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kclpy_spark


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, check=False,
    )  # fmt: skip


def test_version_is_the_packages_one(tmp_path: Path) -> None:
    result = _cli("--version", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kclpy-spark {kclpy_spark.__version__}"
    major, minor, patch = kclpy_spark.__version__.split(".")  # semver
    assert all(part.isdigit() for part in (major, minor, patch))
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and "kclpy_spark._version.__version__" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--log-level", "foo", "status", "--stream-name", "s"], "--log-level"),
        (["status", "--stream-name", "s", "--log-level", "loud"], "--log-level"),
        (["multilang", "--log-level", "foo", "app.properties"], "--log-level"),
        (["status", "--stream-name", "s", "--processor", "m:C"], "unrecognized arguments"),
        (["reset", "--stream-name", "s", "--to", "LATEST", "--max-records", "5"],
         "unrecognized arguments"),
        (["suspend", "--stream-name", "s", "--metrics-port", "9000"], "unrecognized arguments"),
        (["run", "--stream-name", "s", "--watch", "5"], "unrecognized arguments"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_a_usage_line(args: list[str], needle: str, tmp_path: Path) -> None:
    result = _cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and needle in errors[0], result.stderr


def test_a_lower_case_log_level_is_accepted(tmp_path: Path) -> None:
    result = _cli("--log-level", "debug", "status", "--stream-name", "s", "--lease-store",
                  "memory", "--json", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stream"] == "s"


def test_start_up_errors_follow_the_json_log_format(tmp_path: Path) -> None:
    result = _cli("--log-format", "json", "run", "--config", "missing.toml", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = json.loads(lines[0])
    assert line["level"] == "ERROR" and "missing.toml" in line["message"]


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kclpy_spark", "status", "--stream-name", "s",
         "--lease-store", "memory", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes (`| head` that ended)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_a_missing_aws_profile_is_one_line_for_every_command(tmp_path: Path) -> None:
    """boto3's session read the profile before our check: a traceback and exit 1 (which means
    "not caught up")."""
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AWS_PROFILE": "nosuch"}
    for args in (["status", "--stream-name", "s1", "--lease-store", "dynamodb",
                  "--region", "us-east-1"],
                 ["suspend", "--stream-name", "s1", "--lease-store", "dynamodb",
                  "--region", "us-east-1"]):  # fmt: skip
        result = subprocess.run([sys.executable, "-m", "kclpy_spark", *args], env=env,
                                capture_output=True, text=True, timeout=60, cwd=tmp_path,
                                check=False)  # fmt: skip
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("kclpy-spark: error: AWS profile not found: 'nosuch'")


def test_an_error_line_never_shows_a_urls_password(tmp_path: Path) -> None:
    result = _cli("status", "--stream-name", "s", "--lease-store", "dynamodb", "--region",
                  "us-east-1", "--endpoint-url", "http://AKIAIOSFODNN7EXAMPLE:hunter2@h:99999",
                  cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "AKIA" not in result.stderr and "hunter2" not in result.stderr, result.stderr


@pytest.mark.parametrize("extra", [["--processor"], []])
def test_the_demo_against_an_endpoint_that_is_down_is_one_line(
    tmp_path: Path, extra: list[str]
) -> None:
    """It was botocore's 87-line traceback, exit 1, and a work folder left behind."""
    result = _cli("demo", "--endpoint", "http://127.0.0.1:9", *extra, cwd=tmp_path)
    assert result.returncode == 3, result.stderr  # a service that cannot be reached
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "creating the demo stream" in errors[0], result.stderr
    assert not (tmp_path / ".cache" / "demo").exists()


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ("ConfigError", 2),
        ("AccessError", 2),
        ("DependencyError", 3),
        ("ThrottledError", 3),
    ],
)
def test_a_service_failing_through_start_up_is_not_called_bad_input(
    error: str, status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease table that kept failing through start-up's retries exited 2, the bad-input code a
    supervisor is told not to restart on (an outage then stopped the fleet for good)."""
    from checkpoint.base import errors
    from kclpy_spark import cli

    def fail(_args: object) -> int:
        raise getattr(errors, error)("the lease table: a failure")

    monkeypatch.setattr(cli, "_run", fail)
    # In this process: the daemon's log set-up would replace the root handlers pytest captures by.
    monkeypatch.setattr("kclpy_spark.logs.configure", lambda *args: None)
    assert cli.main(["run", "--stream-name", "s"]) == status
