"""`kclpy-spark run` with bad input: one clear line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "run", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
    )  # fmt: skip


def _assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--initial-position", "EARLIEST"], ["initial position", "EARLIEST"]),
        (["--stream-name", "s", "--processor", "no_such_module:Proc"],
         ["cannot import processor module", "no_such_module"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:NoSuchClass"],
         ["NoSuchClass"]),
        (["--stream-name", "s", "--processor", "not a path"], ["processor"]),
        (["--stream-name", "s"], ["processor", "required"]),
        (["--processor", "kclpy_spark.demo.samples:CountingProcessor"], ["stream_name"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--lease-store", "postgres"], ["lease_store"]),
        (["--config", "missing.toml"], ["missing.toml", "does not exist"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--region", "mars-1"], ["region", "mars-1"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--failover-time", "-3"], ["failover_time"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--max-records", "20000"], ["max_records", "10000"]),
        (["--stream-name", "bad name!",
          "--processor", "kclpy_spark.demo.samples:CountingProcessor"], ["stream name"]),
        (["--stream-name", "s", "--processor", "kclpy_spark.demo.samples:CountingProcessor",
          "--endpoint-url", "localhost:4566"], ["endpoint_url"]),
        (["--stream-arn", "orders", "--processor", "kclpy_spark.demo.samples:CountingProcessor"],
         ["stream_arn", "not a Kinesis stream ARN"]),
    ],
)  # fmt: skip
def test_bad_config_is_one_clear_line(args: list[str], needles: list[str], tmp_path: Path) -> None:
    _assert_one_line_error(_run(*args, cwd=tmp_path), *needles)


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('stream_name = "s"\nstreamName = "oops"\n')
    _assert_one_line_error(_run("--config", "bad.toml", cwd=tmp_path), "streamName", "unknown")


def test_missing_stream_is_one_clear_line(localstack_endpoint: str, tmp_path: Path) -> None:
    result = _run(
        "--stream-name", "no-such-stream-anywhere", "--endpoint-url", localstack_endpoint,
        "--processor", "kclpy_spark.demo.samples:CountingProcessor", cwd=tmp_path,
    )  # fmt: skip
    _assert_one_line_error(result, "no-such-stream-anywhere", "does not exist")


def test_a_missing_stream_leaves_no_lease_table_behind(
    localstack_endpoint: str, tmp_path: Path, dynamodb_client: Any, unique_name: str
) -> None:
    """With a DynamoDB lease store the table was created before the stream was found missing,
    and stayed (an empty table per typo)."""
    (tmp_path / "w.toml").write_text(
        f'stream_name = "{unique_name}"\nendpoint_url = "{localstack_endpoint}"\n'
        f'lease_store = "dynamodb"\napplication_name = "{unique_name}"\n'
        'processor = "kclpy_spark.demo.samples:CountingProcessor"\n'
    )
    result = _run("--config", "w.toml", cwd=tmp_path)
    _assert_one_line_error(result, unique_name, "does not exist")
    assert unique_name not in dynamodb_client.list_tables()["TableNames"]


def test_missing_lease_table_with_creation_disabled(
    localstack_endpoint: str, tmp_path: Path, kinesis_client: Any, unique_name: str
) -> None:
    """The stream exists (a missing one is reported first, before any table is made)."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    kinesis_client.get_waiter("stream_exists").wait(StreamName=unique_name)
    (tmp_path / "w.toml").write_text(
        f'stream_name = "{unique_name}"\nendpoint_url = "{localstack_endpoint}"\n'
        'lease_store = "dynamodb"\n'
        'application_name = "no-such-table-here"\ncreate_lease_table = false\n'
        'processor = "kclpy_spark.demo.samples:CountingProcessor"\n'
    )
    _assert_one_line_error(_run("--config", "w.toml", cwd=tmp_path), "no-such-table-here")


def test_toml_syntax_error_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.toml").write_text('stream_name = "s\nprocessor = 3\n')
    _assert_one_line_error(_run("--config", "broken.toml", cwd=tmp_path), "not valid TOML")


def test_contradictory_streams_config(tmp_path: Path) -> None:
    (tmp_path / "both.toml").write_text(
        'stream_name = "s"\nprocessor = "kclpy_spark.demo.samples:CountingProcessor"\n'
        '[[streams]]\nstream_name = "t"\n'
    )
    _assert_one_line_error(_run("--config", "both.toml", cwd=tmp_path), "not both")


def test_wrong_type_in_config_file(tmp_path: Path) -> None:
    (tmp_path / "types.toml").write_text(
        'stream_name = "s"\nprocessor = "kclpy_spark.demo.samples:CountingProcessor"\n'
        'failover_time = "ten seconds"\n'
    )
    _assert_one_line_error(_run("--config", "types.toml", cwd=tmp_path), "failover_time", "float")


def _console_script() -> str:
    script = Path(sys.executable).with_name("kclpy-spark")
    if not script.exists():
        pytest.skip("the kclpy-spark console script is not installed next to this Python")
    return str(script)


def test_a_processor_module_in_the_working_directory_is_found(tmp_path: Path) -> None:
    """Issue 18: `processor = "myproc:Counter"` beside the config needed PYTHONPATH=. before.
    Through the console script (whose sys.path[0] is its own folder, not the working
    directory), the module is imported: its processor is then created once at start-up, and
    this one refuses, which proves it was found."""
    (tmp_path / "myproc.py").write_text(
        "from kclpy_spark import RecordProcessor\n\n"
        "class Counter(RecordProcessor):\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('myproc was imported from the working directory')\n\n"
        "    def process_records(self, process_records_input):\n"
        "        pass\n"
    )
    result = subprocess.run(
        [_console_script(), "run", "--stream-name", "s", "--processor", "myproc:Counter"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    _assert_one_line_error(result, "myproc was imported from the working directory")


def test_a_processor_module_found_nowhere_says_where_it_looked(tmp_path: Path) -> None:
    result = subprocess.run(
        [_console_script(), "run", "--stream-name", "s", "--processor", "myproc:Counter"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    _assert_one_line_error(result, "cannot import processor module 'myproc'", str(tmp_path),
                           "PYTHONPATH")  # fmt: skip
