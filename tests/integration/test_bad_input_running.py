"""Issue 15, the running half, on LocalStack with real worker processes: a worker that can no
longer make progress says so (/readyz 503 with the reason) and, when its lease table or stream has
been gone for missing_dependency_timeout, exits 3 with one line. A second process with the same
worker id is refused; a stream re-created under the same name is refused until a reset; SIGHUP
stops gracefully and SIGUSR1 reports without stopping."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from worker_procs import fleet, free_port, produce, read_output, wait_active, wait_for


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _config(name: str, endpoint: str, store: str, **extra: Any) -> str:
    values: dict[str, Any] = {
        "application_name": name, "stream_name": name, "endpoint_url": endpoint,
        "initial_position": "TRIM_HORIZON", "lease_store": store,
        "processor": "kclpy_spark.demo.samples:JsonLinesProcessor", "failover_time": 3.0,
        "idle_time_between_reads": 0.3, "missing_dependency_timeout": 6.0, **extra,
    }  # fmt: skip
    return "".join(
        f'{key} = "{value}"\n' if isinstance(value, str) else f"{key} = {value}\n"
        for key, value in values.items()
    )


def _last_error_line(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("kclpy-spark: error:")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_a_deleted_lease_table_makes_the_worker_unready_then_exit_3(
    kinesis_client: Any, dynamodb_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(10))
    port = free_port()
    config = _config(name, localstack_endpoint, "dynamodb", metrics_port=port)
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("10 records", lambda: len(read_output(tmp_path / "out")) >= 10, timeout=60)
        assert _readyz(port)[0] == 200
        dynamodb_client.delete_table(TableName=name)
        wait_for("not ready", lambda: _readyz(port)[0] == 503, timeout=30)
        assert "gone" in _readyz(port)[1] or "unreachable" in _readyz(port)[1]
        status = workers.wait("w1", timeout=60)
        assert status == 3, worker.log_text()[-3000:]
        assert "lease table" in _last_error_line(worker.log_text())


def test_a_deleted_stream_makes_the_worker_unready_then_exit_3(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(5))
    port = free_port()
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}", metrics_port=port)
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("5 records", lambda: len(read_output(tmp_path / "out")) >= 5, timeout=60)
        kinesis_client.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
        wait_for("not ready", lambda: "gone" in _readyz(port)[1], timeout=40)
        assert _readyz(port)[0] == 503
        status = workers.wait("w1", timeout=60)
        assert status == 3, worker.log_text()[-3000:]
        assert f"stream {name}" in _last_error_line(worker.log_text())


def test_a_missing_stream_as_the_only_streams_entry_is_not_ready_then_exit_3(
    localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """#49 item 5: two "will retry" lines, then silence, /readyz 200 and no exit."""
    name = unique_name
    port = free_port()
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}", metrics_port=port,
                     shard_sync_interval=1.0)  # fmt: skip
    config = config.replace(f'stream_name = "{name}"\n', "")
    config += f'[[streams]]\nstream_name = "{name}-missing"\n'
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("not ready", lambda: "gone" in _readyz(port)[1], timeout=40)
        assert _readyz(port)[0] == 503 and f"{name}-missing" in _readyz(port)[1]
        status = workers.wait("w1", timeout=60)
        assert status == 3, worker.log_text()[-3000:]
        assert f"stream {name}-missing" in _last_error_line(worker.log_text())


def test_a_lease_item_with_a_38_digit_counter_makes_the_worker_unready(
    kinesis_client: Any, dynamodb_client: Any, localstack_endpoint: str, unique_name: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """#49 item 6: every later write of such a counter is refused (DynamoDB keeps 38 digits);
    before, records were delivered three times, then "lease taking failed" every 1.7 s, ready."""
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(5))
    port = free_port()
    config = _config(name, localstack_endpoint, "dynamodb", metrics_port=port)
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("5 records", lambda: len(read_output(tmp_path / "out")) >= 5, timeout=60)
        assert _readyz(port)[0] == 200
        item = {"leaseKey": {"S": "shardId-000000000009"}, "leaseCounter": {"N": "9" * 38},
                "checkpoint": {"S": "TRIM_HORIZON"}}  # fmt: skip
        dynamodb_client.put_item(TableName=name, Item=item)
        wait_for("not ready", lambda: "corrupt" in _readyz(port)[1], timeout=30)
        assert _readyz(port)[0] == 503 and "shardId-000000000009" in _readyz(port)[1]
        dynamodb_client.delete_item(TableName=name, Key={"leaseKey": item["leaseKey"]})
        wait_for("ready again", lambda: _readyz(port)[0] == 200, timeout=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert any(
            line.startswith("kclpy_spark_corrupt_lease_reads_total")
            and float(line.rsplit(" ", 1)[1]) >= 1
            for line in metrics.splitlines()
        ), worker.log_text()[-2000:]


def test_every_lease_parked_is_not_ready(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(3))
    port = free_port()
    config = _config(
        name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}", metrics_port=port,
        processor="bad_processors:FailsToInitialize", max_processing_attempts=2,
        park_duration=600.0,
    )  # fmt: skip
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        workers.env["PYTHONPATH"] += f":{Path(__file__).parent}"
        worker = workers.start("w1")
        wait_for("parked", lambda: "parked" in _readyz(port)[1], timeout=60)
        assert _readyz(port)[0] == 503
        log = worker.log_text()
        assert "initialize failed (attempt 2 of 2)" in log and "parked (initialize failed" in log


def test_a_second_process_with_the_same_worker_id_is_refused(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}")
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        first = workers.start("same-id")
        wait_for("the first to run", lambda: "took lease" in first.log_text(), timeout=60)
        second = workers.start("same-id")
        status = second.proc.wait(timeout=60)
        assert status == 2, second.log_text()[-3000:]
        assert "another process runs with worker_id 'same-id'" in _last_error_line(
            second.log_text()
        )
        assert first.alive()


def test_a_recreated_stream_is_refused_until_a_reset(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    summary = kinesis_client.describe_stream_summary(StreamName=name)["StreamDescriptionSummary"]
    first_created = summary["StreamCreationTimestamp"].timestamp()
    produce(kinesis_client, name, range(3))
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}")
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        workers.start("w1")
        wait_for("3 records", lambda: len(read_output(tmp_path / "out")) >= 3, timeout=60)
        workers.kill("w1", signal.SIGTERM)
        assert workers.wait("w1", timeout=60) == 0
        kinesis_client.delete_stream(StreamName=name)
        wait_for(
            "the stream to go",
            lambda: name not in kinesis_client.list_streams()["StreamNames"],
            timeout=60,
        )
        # Creation times within a second are one stream to the worker (the service's clock and
        # the record's rounding): the new one must come later than that (LocalStack deletes at
        # once, and all of the above can take less than a second).
        time.sleep(max(0.0, first_created + 2.0 - time.time()))
        kinesis_client.create_stream(StreamName=name, ShardCount=1)
        wait_active(kinesis_client, name)
        again = workers.start("w2")
        assert again.proc.wait(timeout=60) == 2
        assert "re-created" in _last_error_line(again.log_text())
        reset = subprocess.run(
            [sys.executable, "-m", "kclpy_spark.cli", "reset", "--config", str(workers.config),
             "--to", "TRIM_HORIZON", "--yes"],
            capture_output=True, text=True, timeout=60, env=workers.env, check=False,
        )  # fmt: skip
        assert reset.returncode == 0, reset.stderr
        produce(kinesis_client, name, range(100, 103))
        after = workers.start("w3")
        wait_for(
            "the new stream's records",
            lambda: (
                {"100", "101", "102"} <= {str(e.get("data")) for e in read_output(tmp_path / "out")}
            ),
            timeout=60,
        )
        assert after.alive()


def test_sighup_stops_gracefully_and_sigusr1_reports(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}")
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("a lease", lambda: "took lease" in worker.log_text(), timeout=60)
        workers.kill("w1", signal.SIGUSR1)
        wait_for("the report", lambda: "SIGUSR1: worker w1" in worker.log_text(), timeout=20)
        assert worker.alive()
        workers.kill("w1", signal.SIGHUP)
        assert workers.wait("w1", timeout=60) == 0
        log = worker.log_text()
        assert "received SIGHUP: shutting down gracefully" in log
        assert "released lease" in log


def test_a_signal_storm_during_a_graceful_stop_still_exits_0(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """SIGTERM, then SIGTERM, SIGHUP and SIGUSR1 every few milliseconds until the process is
    gone: the graceful stop runs to its end and the exit status is 0, not death by a signal
    that came after the handlers were removed."""
    import time

    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    config = _config(name, localstack_endpoint, f"sqlite:{tmp_path / 'l.db'}")
    with fleet(tmp_path, config, tmp_path / "out") as workers:
        worker = workers.start("w1")
        wait_for("a lease", lambda: "took lease" in worker.log_text(), timeout=60)
        storm = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
        sent = 0
        while worker.alive():
            try:
                worker.proc.send_signal(storm[sent % len(storm)])
            except ProcessLookupError:
                break
            sent += 1
            time.sleep(0.002)
        assert workers.wait("w1", timeout=60) == 0, worker.log_text()[-3000:]
        assert sent > 10 and "released lease" in worker.log_text()
