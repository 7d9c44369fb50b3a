"""Issue 15, the start-up half: bad input that used to leave a healthy-looking worker doing
nothing (or a traceback) is now one line on stderr and exit status 2, before anything runs.

Each row runs the real CLI in a subprocess. The running half (a table or stream that goes away,
a duplicate worker id, signals) is in test_bad_input_running.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROCESSOR = 'processor = "kclpy_spark.demo.samples:CountingProcessor"\n'
# An endpoint nobody listens on: every row fails before any AWS call.
NOWHERE = 'endpoint_url = "http://127.0.0.1:9"\n'


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str], *needles: str, status: int = 2) -> str:
    assert result.returncode == status, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def run_config(tmp_path: Path, body: str, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "app.toml").write_text(body)
    return cli("run", "--config", "app.toml", *extra, cwd=tmp_path)


@pytest.mark.parametrize(
    ("body", "needles"),
    [
        (f'stream_name = "s"\n{PROCESSOR}initial_position = "AT_TIMESTAMP:2999-01-01T00:00:00"\n',
         ["initial_position", "in the future"]),
        (f'stream_name = "s"\n{PROCESSOR}idle_time_between_reads = inf\n',
         ["idle_time_between_reads", "299"]),
        (f'stream_name = "s"\n{PROCESSOR}worker_id = ""\n', ["worker_id"]),
        (f'stream_name = "s"\n{PROCESSOR}failover_time = 1e9\n', ["failover_time", "3600"]),
        (f'stream_name = "s"\n{PROCESSOR}max_read_bytes_per_second = 2\n',  # meant MiB
         ["max_read_bytes_per_second", "65536..2097152", "got 2"]),
        (f'stream_name = "s"\n{PROCESSOR}missing_dependency_timeout = nan\n',
         ["missing_dependency_timeout"]),
        (f'{PROCESSOR}[[streams]]\nstream_name = "a"\ninitial_position = "TRIM_HORIZON"\n'
         '[[streams]]\nstream_name = "a"\ninitial_position = "LATEST"\n', ["'a'", "twice"]),
        ('stream_name = "s"\nprocessor = "bad_processors:NeedsArguments"\n',
         ["NeedsArguments", "no arguments", "path"]),
        ('stream_name = "s"\nprocessor = "bad_processors:DuckTyped"\n',
         ["DuckTyped", "lease_lost", "RecordProcessor"]),
        (f'stream_name = "s"\n{PROCESSOR}[sink]\nsink = "parquet:out"\n',
         ["both 'processor' and a [sink]"]),
        (f'stream_name = "s"\n{PROCESSOR}lease_assignment = "leaders"\n',
         ["lease_assignment", "'auto', 'worker', 'leader'", "'leaders'"]),
        # #49's poor list: a boolean or a fraction for a port; [[streams]] entries are checked as
        # the top level is (item 5).
        (f'stream_name = "s"\n{PROCESSOR}metrics_port = true\n', ["metrics_port", "True"]),
        # fan-out names its consumer after the application: RegisterStreamConsumer refused a
        # 129-character name ten times over
        (f'stream_name = "s"\n{PROCESSOR}retrieval_mode = "fanout"\n'
         f'application_name = "{"a" * 129}"\n', ["application_name", "consumer_name", "128"]),
        (f'stream_name = "s"\n{PROCESSOR}initial_position = "AT_TIMESTAMP:1e20"\n',
         ["initial_position", "out of range"]),  # an OverflowError traceback before
        (f'stream_name = "s"\n{PROCESSOR}initial_position = "AT_TIMESTAMP:-inf"\n',
         ["initial_position", "out of range"]),
        ('stream_name = "s"\nprocessor = "bad_processors:Yields"\n',
         ["Yields", "process_records", "generator"]),
        ('stream_name = "s"\nprocessor = "bad_processors:YieldsAsync"\n',
         ["YieldsAsync", "process_records", "generator"]),
        ('stream_name = "s"\nprocessor = "bad_processors:ExitsInInit"\n',
         ["ExitsInInit", "no arguments", "SystemExit(0)"]),
        (f'stream_name = "s"\n{PROCESSOR}[sink]\nsink = "parquet:out"\n'
         '[sink.spark_conf]\n"spark.master" = "local[4]"\n', ["spark.master", "spark_target"]),
        (f'stream_name = "s"\n{PROCESSOR}metrics_port = 18080.7\n', ["metrics_port", "18080.7"]),
        (f'{PROCESSOR}[[streams]]\nstream_arn = "not-an-arn"\n', ["[[streams]]", "not-an-arn"]),
        (f'{PROCESSOR}[[streams]]\nstream_name = 42\n', ["[[streams]]", "stream_name", "42"]),
        (f'stream_name = "a"\nstream_arn = "arn:aws:kinesis:us-east-1:123456789012:stream/b"\n'
         f'{PROCESSOR}', ["'a'", "different streams"]),
        (f'{PROCESSOR}[[streams]]\nstream_name = "a"\n'
         'stream_arn = "arn:aws:kinesis:us-east-1:123456789012:stream/b"\n',
         ["[[streams]]", "different streams"]),
    ],
)  # fmt: skip
def test_start_up_checks(body: str, needles: list[str], tmp_path: Path) -> None:
    one_line(run_config(tmp_path, NOWHERE + body), *needles)


@pytest.mark.parametrize(
    ("url", "needle"),
    [("http://", "'http://'"), ("http://127.0.0.1:99999", "1..65535"), ("http://[::1", "[::1")],
)
def test_an_endpoint_url_without_a_host_or_with_a_bad_port_is_one_line(
    tmp_path: Path, url: str, needle: str
) -> None:
    """Both were retried as an endpoint that does not answer (15 attempts)."""
    body = f'endpoint_url = "{url}"\nstream_name = "s"\n{PROCESSOR}'
    one_line(run_config(tmp_path, body), "endpoint_url", needle)


def test_an_sqlite_store_under_a_file_is_one_line(tmp_path: Path) -> None:
    """A file where the store's folder should be was a NotADirectoryError traceback."""
    (tmp_path / "blocker").write_text("a file, not a folder")
    body = f'stream_name = "s"\n{PROCESSOR}lease_store = "sqlite:blocker/leases.db"\n'
    one_line(run_config(tmp_path, NOWHERE + body), "lease_store", "blocker")


def test_top_level_keys_beside_a_kclpy_spark_table_are_one_line(tmp_path: Path) -> None:
    """They were ignored, silently."""
    body = f'failover_time = 3.0\n[kclpy_spark]\nstream_name = "s"\n{PROCESSOR}'
    one_line(run_config(tmp_path, body), "failover_time", "[kclpy_spark]")


def test_https_to_a_plain_http_port_is_one_line(tmp_path: Path) -> None:
    """It was retried as an endpoint that does not answer (still retrying after 60 s)."""
    import http.server
    import threading

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        body = (f'endpoint_url = "https://127.0.0.1:{port}"\nstream_name = "s"\n{PROCESSOR}'
                f'lease_store = "sqlite:{tmp_path / "l.db"}"\n')  # fmt: skip
        one_line(run_config(tmp_path, body), "plain HTTP", "http://")
    finally:
        server.shutdown()


def test_an_empty_config_path_is_one_line(tmp_path: Path) -> None:
    """``--config ""`` was read as no config file at all, silently."""
    one_line(cli("run", "--config", "", "--stream-name", "s", cwd=tmp_path), "--config", "empty")


def test_a_metrics_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        body = f'stream_name = "s"\n{PROCESSOR}lease_store = "memory"\nmetrics_port = {port}\n'
        one_line(run_config(tmp_path, NOWHERE + body), "metrics_port", str(port))


def test_an_unresolvable_metrics_host_is_one_line(tmp_path: Path) -> None:
    body = (
        f'stream_name = "s"\n{PROCESSOR}lease_store = "memory"\nmetrics_port = 0\n'
        'metrics_host = "no-such-host.invalid"\n'
    )
    one_line(run_config(tmp_path, NOWHERE + body), "metrics_host", "no-such-host.invalid")


@pytest.mark.parametrize(
    ("watch", "needle"), [("-1", "positive"), ("1e300", "between"), ("1e-9", "between")]
)
def test_status_watch_must_be_positive_and_bounded(tmp_path: Path, watch: str, needle: str) -> None:
    """1e300 ended in an OverflowError traceback; 1e-9 read the whole table 60 times a second."""
    result = cli("status", "--stream-name", "s", "--watch", watch, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--watch" in result.stderr and needle in result.stderr


def test_reset_to_a_future_time_is_refused(tmp_path: Path) -> None:
    result = cli(
        "reset", "--stream-name", "s", "--to", "AT_TIMESTAMP:2999-01-01T00:00:00", "--yes",
        "--lease-store", f"sqlite:{tmp_path / 'l.db'}", cwd=tmp_path,
    )  # fmt: skip
    one_line(result, "--to", "in the future")


@pytest.mark.parametrize(
    ("sink", "prepare", "needles"),
    [
        ('spark_target = "local[0]"\nsink = "parquet:out"', None, ["spark_target", "local[0]"]),
        ('sink = "parquet:blocker/out"', "blocker", ["cannot write", "blocker"]),
        ('sink = "delta:plain"', "plain/part-0.parquet", ["no _delta_log", "VACUUM"]),
    ],
)
def test_bad_sink_folders_and_targets_are_one_line(
    sink: str, prepare: str | None, needles: list[str], tmp_path: Path
) -> None:
    if prepare is not None:  # a file where a folder must go, or a folder of plain files
        (tmp_path / prepare).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / prepare).write_bytes(b"x")
    body = f'stream_name = "s"\nlease_store = "memory"\n[sink]\n{sink}\n'
    one_line(run_config(tmp_path, NOWHERE + body), *needles)


def test_a_multilang_script_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "app.properties").write_text(
        "executableName = python3 no_such_script.py\nstreamName = s\napplicationName = app\n"
        "regionName = us-east-1\n"
    )
    result = cli("multilang", "--properties", "app.properties", cwd=tmp_path)
    one_line(result, "no_such_script.py", "does not exist")


def test_sigterm_during_start_up_exits_at_once(tmp_path: Path) -> None:
    """It used to retry DescribeStreamSummary (15 attempts) and exit 57 s after the signal."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts, never answers: start-up keeps retrying
    try:
        body = (
            f'stream_name = "s"\n{PROCESSOR}lease_store = "sqlite:l.db"\n'
            f'endpoint_url = "http://127.0.0.1:{silent.getsockname()[1]}"\n'
        )
        (tmp_path / "app.toml").write_text(body)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", "app.toml"],
            cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3.0)  # well into start-up: the stream is being described
        proc.terminate()
        try:
            _, stderr = proc.communicate(timeout=20)  # not a timing assertion: only a hang fails
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the worker kept retrying start-up after SIGTERM") from None
        assert proc.returncode == 128 + 15, stderr[-2000:]
        assert "during start-up: exiting now" in stderr
    finally:
        silent.close()
