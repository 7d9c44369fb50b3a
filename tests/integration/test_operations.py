"""Operating a running application (LocalStack, a real worker process): status, reset, suspend and
resume, the metrics and health endpoints, and credentials kept out of the logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from worker_procs import fleet, free_port, produce, read_output, wait_active, wait_for

ACCESS_KEY = "AKIAZZZZ7EXAMPLEKEY9"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRETzz"


def _cli(*args: str, config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", *args, "--config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _listening_on(port: int) -> set[str]:
    """The local addresses listening on TCP ``port``, as /proc/net/tcp{,6} write them (hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_status_reset_suspend_metrics_and_no_secrets_in_logs(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    output = tmp_path / "out"
    kinesis_client.create_stream(StreamName=name, ShardCount=2)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(40))
    port = free_port()
    config = f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "bad_processors:LogsItsCredentials"
failover_time = 3.0
idle_time_between_reads = 0.3
metrics_port = {port}
"""
    with fleet(tmp_path, config, output) as workers:
        workers.env["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        workers.env["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        here = str(Path(__file__).resolve().parent)  # bad_processors
        workers.env["PYTHONPATH"] = os.pathsep.join([here, workers.env.get("PYTHONPATH", "")])
        worker = workers.start("ops-worker")
        env = workers.env
        wait_for("40 records", lambda: len(read_output(output)) >= 40, timeout=60)
        # The metrics and health port listens on this machine only, as nothing configured it.
        assert _listening_on(port) == {"0100007F"}  # 127.0.0.1, as /proc/net/tcp writes it

        # status --json: both leases, owned by the worker, with published figures.
        def status() -> dict[str, Any]:
            result = _cli("status", "--json", config=workers.config, env=env)
            assert result.returncode == 0, result.stderr
            parsed: dict[str, Any] = json.loads(result.stdout)
            return parsed

        wait_for(
            "status to show published records",
            lambda: sum(r["records"] or 0 for r in status()["leases"]) >= 40,
            timeout=30,
        )
        report = status()
        assert report["live_workers"] == ["ops-worker"] and report["suspended"] is False
        assert {r["shard_id"] for r in report["leases"]} == {
            "shardId-000000000000",
            "shardId-000000000001",
        }
        assert all(
            r["owner"] == "ops-worker" and r["state"] == "ASSIGNED" for r in report["leases"]
        )
        assert all(r["millis_behind_latest"] is not None for r in report["leases"])
        table = _cli("status", config=workers.config, env=env)
        assert "shardId-000000000000" in table.stdout and "ops-worker" in table.stdout

        # Metrics and health.
        code, text = _get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        assert _metric(text, "kclpy_spark_records_processed_total") >= 40
        assert _metric(text, "kclpy_spark_lease_renewals_total") > 0
        assert _metric(text, "kclpy_spark_coordination_partitions_acquired_total") >= 2
        assert _metric(text, "kclpy_spark_leases_held") == 2
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/readyz") == (200, "ready\n")

        # reset is refused while a live worker holds the leases.
        refused = _cli("reset", "--to", "TRIM_HORIZON", "--yes", config=workers.config, env=env)
        assert refused.returncode == 2 and "live workers hold leases" in refused.stderr

        # suspend: the worker stays up but releases everything.
        assert _cli("suspend", config=workers.config, env=env).returncode == 0
        wait_for(
            "the suspended worker to release its leases",
            lambda: all(r["owner"] is None for r in status()["leases"]),
            timeout=30,
        )
        assert status()["suspended"] is True and worker.alive()
        assert _get(f"http://127.0.0.1:{port}/readyz") == (200, "suspended\n")

        # reset to TRIM_HORIZON, resume: everything is processed a second time.
        done = _cli("reset", "--to", "TRIM_HORIZON", "--yes", config=workers.config, env=env)
        assert done.returncode == 0, done.stderr
        assert all(r["checkpoint"] == "TRIM_HORIZON" for r in status()["leases"])
        assert _cli("resume", config=workers.config, env=env).returncode == 0
        wait_for("the replay after reset", lambda: len(read_output(output)) >= 80, timeout=60)
        assert status()["suspended"] is False

    log = worker.log_text()
    assert "suspended; releasing leases" in log and "application resumed" in log
    assert "[application=" in log and "shard=shardId-" in log
    # The processor logged both at each lease's start, in a message and in a traceback.
    assert "running as [redacted] with secret [redacted]" in log
    assert "login failed for [redacted]" in log
    assert ACCESS_KEY not in log and SECRET_KEY not in log
