"""The ``multilang`` subcommand: the MultiLangDaemon's argument spellings and one-line errors."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError, DependencyError
from kclpy_spark.multilang.command import add_subcommand


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kclpy-spark")
    add_subcommand(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["multilang", *argv])


@pytest.mark.parametrize(
    ("argv", "path", "in_process"),
    [
        (["--properties", "app.properties"], "app.properties", None),
        (["--properties-file", "app.properties"], "app.properties", None),
        (["-p", "app.properties"], "app.properties", None),
        (["app.properties"], None, None),
        (["app.properties", "--in-process"], None, ""),
        (["-p", "a.properties", "--in-process", "app:RecordProcessor"], "a.properties",
         "app:RecordProcessor"),
    ],
)  # fmt: skip
def test_argument_spellings(argv: list[str], path: str | None, in_process: str | None) -> None:
    args = parse(*argv)
    assert args.command == "multilang"
    assert args.properties == path
    assert args.in_process == in_process
    assert (args.properties or args.file).endswith(".properties")


@pytest.mark.parametrize(
    ("argv", "path", "processor"),
    [
        (["--in-process", "app.properties"], "app.properties", None),  # the flag took the file
        (["app.properties", "--in-process", "app:Processor"], "app.properties", "app:Processor"),
    ],
)
def test_in_process_before_the_file_runs_that_file(
    argv: list[str], path: str, processor: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--in-process app.properties``: argparse gave the file to the flag (its value is
    optional), and the command said "a .properties file is required"."""
    from kclpy_spark.multilang import command, runner

    ran: list[tuple[str, bool, str | None]] = []

    def run_properties(p: str, *, in_process: bool, processor: str | None, **_: Any) -> None:
        ran.append((p, in_process, processor))

    monkeypatch.setattr(runner, "run_properties", run_properties)
    assert command.run(parse(*argv)) == 0
    assert ran == [(path, True, processor)]


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.multilang.command", *argv],
        capture_output=True, text=True, cwd=cwd, timeout=60, check=False,
    )  # fmt: skip


def test_bad_input_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    missing = _cli("--properties", "nope.properties", cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1] == (
        f"kclpy-spark: error: properties file '{tmp_path / 'nope.properties'}' does not exist"
    )
    bad = tmp_path / "bad.properties"
    bad.write_text("executableName = python3 app.py\nstreamName = s\napplicationName = app\n"
                   "failoverTimeMillis = soon\n")  # fmt: skip
    result = _cli("-p", str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert "property 'failoverTimeMillis' must be a whole number" in result.stderr
    assert "Traceback" not in result.stderr
    no_file = _cli(cwd=tmp_path)
    assert no_file.returncode == 2 and "a .properties file is required" in no_file.stderr


def test_an_executable_that_is_not_there_fails_before_starting(tmp_path: Path) -> None:
    props = tmp_path / "app.properties"
    props.write_text("executableName = ./missing_app.py\nstreamName = s\napplicationName = app\n"
                     "retrievalMode = POLLING\n")  # fmt: skip
    result = _cli("-p", str(props), cwd=tmp_path)
    assert result.returncode == 2
    assert "executableName" in result.stderr and "missing_app.py' does not exist" in result.stderr


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (DependencyError("DynamoDB unreachable through start-up's retries"), 3),
        (ConfigError("bad input"), 2),
    ],
)
def test_the_module_alone_exits_as_the_subcommand_does(
    monkeypatch: pytest.MonkeyPatch, error: Exception, code: int
) -> None:
    """`python -m kclpy_spark.multilang.command` exited 2 for every error, where `kclpy-spark
    multilang` exits 3 for one a restart may mend (a review's finding): a supervisor that
    restarts on 3 only left it down."""
    from kclpy_spark.multilang import command

    def fails(args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(command, "run", fails)
    monkeypatch.setattr("kclpy_spark.logs.configure", lambda *args: None)  # the tests' logging
    assert command.main(["app.properties"]) == code
