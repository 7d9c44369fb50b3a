"""#47: kclpy-spark workers share an application's DynamoDB lease table with a KCL v3 worker
that no one here wrote (kcl-rs, in a child process), on LocalStack.

- One kcl-rs worker and one kclpy-spark worker split a 2-shard stream's leases; every record
  produced while both run is processed, each by the worker that holds its shard; kcl-rs logs no
  warning about items it cannot read as leases (kclpy-spark's coordination records live in a
  table of their own, which no KCL reads).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_procs import fleet, produce, read_output, wait_active, wait_for, worker_env

from checkpoint.stores.dynamodb import DynamoDBLeaseTable

pytest.importorskip("kcl_rs")
KCL_RS = Path(__file__).with_name("kcl_rs_worker.py")


@pytest.fixture
def kcl_rs(localstack_endpoint: str, unique_name: str, tmp_path: Path) -> Iterator[Any]:
    """Start a kcl-rs worker on ``unique_name`` (stream and application); stopped at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(worker_id: str) -> subprocess.Popen[str]:
        log = (tmp_path / f"{worker_id}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, str(KCL_RS), localstack_endpoint, unique_name, unique_name,
             worker_id, str(tmp_path / "out-kcl-rs")],
            stdout=log, stderr=subprocess.STDOUT, env=worker_env(), text=True,
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _config(name: str, endpoint: str) -> str:
    return f"""
stream_name = "{name}"
application_name = "{name}"
endpoint_url = "{endpoint}"
region = "us-east-1"
lease_store = "dynamodb"
initial_position = "TRIM_HORIZON"
processor = "kclpy_spark.demo.samples:JsonLinesProcessor"
failover_time = 6
"""


def test_a_kcl_rs_worker_and_a_kclpy_spark_worker_share_the_leases(
    kcl_rs: Any, kinesis_client: Any, dynamodb_client: Any, localstack_endpoint: str,
    unique_name: str, tmp_path: Path,
) -> None:  # fmt: skip
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    table = DynamoDBLeaseTable(dynamodb_client, unique_name, create_if_missing=False)
    with fleet(tmp_path, _config(unique_name, localstack_endpoint), tmp_path / "out-ours") as f:
        ours = f.start("kclpy-a")
        wait_for("kclpy-spark's leases", lambda: _owners(table) == {"kclpy-a"}, 60)
        rust = kcl_rs("kcl-rs-1")
        wait_for("the leases split one each", lambda: _owners(table) == {"kclpy-a", "kcl-rs-1"},
                 120)  # fmt: skip
        produce(kinesis_client, unique_name, range(200))

        def processed() -> list[dict[str, Any]]:
            return read_output(tmp_path / "out-ours") + read_output(tmp_path / "out-kcl-rs")

        wait_for("every record processed", lambda: len({r["data"] for r in processed()}) == 200,
                 60)  # fmt: skip
        by_shard = {r["shard"]: r["pid"] for r in processed()}
        assert set(by_shard.values()) == {ours.proc.pid, rust.pid}, "each worker read a shard"
        log = (tmp_path / "kcl-rs-1.log").read_text()
        assert "failed to deserialize" not in log, log[-3000:]
        assert "kcl-rs: processing" in log


def _owners(table: DynamoDBLeaseTable) -> set[str | None]:
    try:
        return {lease.lease_owner for lease in table.list_leases()}
    except Exception:  # the table is not there yet
        return set()
