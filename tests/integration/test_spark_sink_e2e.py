"""One end-to-end sink test, three Spark targets, each with ``read_on`` "driver" and
"executors": a real worker reads LocalStack (with a shard split in the middle) and writes through
the Spark sink, whose function fails first attempts (some after writing). Every record lands
exactly once, the checkpoints end at the last record (SHARD_END for the parent), and at every
write no checkpoint was ahead of the output.

* local[2]: in this process, on the session fixture;
* a standalone master + worker started on loopback by a fixture, the worker as the driver;
* a Spark Connect server started by a fixture (the client runs in a subprocess: a Connect session
  in a process breaks classic ones).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from spark_e2e import check_scenario, run_scenario
from spark_servers import Server, start_connect, start_standalone

from kclpy_spark.spark.session import SparkSessionHolder

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Server]]]:
    """Start the servers this module's selected tests need, at once and side by side (each
    takes 10-25 s to start), so they start while the local test runs."""
    wanted = {
        name
        for item in request.session.items
        if item.module is request.module
        for name in ("standalone_cluster", "connect_server")
        if name in getattr(item, "fixturenames", ())
    }
    starters = {"standalone_cluster": start_standalone, "connect_server": start_connect}
    pool = ThreadPoolExecutor(2)
    futures = {
        name: pool.submit(starters[name], tmp_path_factory.mktemp(name)) for name in sorted(wanted)
    }
    try:
        yield futures
    finally:
        for future in futures.values():
            with contextlib.suppress(Exception):
                future.result().stop()
        pool.shutdown()


@pytest.fixture(autouse=True)
def _start_servers_early(servers: dict[str, Future[Server]]) -> None:
    return None


@pytest.fixture
def standalone_cluster(servers: dict[str, Future[Server]]) -> Server:
    return servers["standalone_cluster"].result(timeout=180)


@pytest.fixture
def connect_server(servers: dict[str, Future[Server]]) -> Server:
    return servers["connect_server"].result(timeout=180)


def run_in_subprocess(endpoint: str, target: str, work: Path, read_on: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "spark_e2e.py"),
            "scenario",
            "--endpoint",
            endpoint,
            "--target",
            target,
            "--work",
            str(work),
            "--read-on",
            read_on,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    (work / "scenario.log").write_text(proc.stderr)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"scenario failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_end_to_end_on_local_spark(
    spark: Any, localstack_endpoint: str, tmp_path: Path, read_on: str
) -> None:
    result = run_scenario(
        localstack_endpoint,
        "local[2]",
        tmp_path,
        session=SparkSessionHolder.adopt(spark),
        read_on=read_on,
    )
    check_scenario(result)


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_end_to_end_on_a_standalone_cluster(
    standalone_cluster: Server, localstack_endpoint: str, tmp_path: Path, read_on: str
) -> None:
    result = run_in_subprocess(localstack_endpoint, standalone_cluster.url, tmp_path, read_on)
    check_scenario(result)


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_end_to_end_over_spark_connect(
    connect_server: Server, localstack_endpoint: str, tmp_path: Path, read_on: str
) -> None:
    result = run_in_subprocess(localstack_endpoint, connect_server.url, tmp_path, read_on)
    check_scenario(result)
    assert result["local_jvm"] is False
