"""Start real Spark servers on loopback for tests: a standalone master + worker, and a Spark
Connect server. Both come from the pip pyspark package (SPARK_HOME = its folder), on free ports,
each in its own process group so that stopping kills exactly what was started.

Not a test module: imported by the tests and usable by hand (``python spark_servers.py connect``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_WORKER_DIR=str(work / "worker"),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_NO_DAEMONIZE="1",
    )
    return env


@dataclass
class Server:
    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def tail(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.logs if p.exists())


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait(check: object, server: Server, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in server.procs):
            server.stop()
            raise RuntimeError(f"{what} exited early:\n{server.tail()}")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"{what} not ready after {timeout}s:\n{server.tail()}")


def start_standalone(work: Path, *, cores: int = 1, memory: str = "1g") -> Server:
    """A master and one worker on 127.0.0.1; ready when the master lists the worker ALIVE."""
    env = spark_env(work)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    server = Server(url)
    server.logs = [work / "master.log", work / "worker.log"]
    server.procs.append(
        _spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            ],
            env,
            server.logs[0],
        )
    )
    server.procs.append(
        _spawn(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(work / "worker"),
            ],
            env,
            server.logs[1],
        )
    )

    def alive() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                return int(json.load(resp).get("aliveworkers", 0)) >= 1
        except (OSError, ValueError):
            return False

    _wait(alive, server, 90, "the standalone cluster")
    return server


def start_connect(work: Path, *, master: str = "local[2]", memory: str = "1g") -> Server:
    """A Spark Connect server on 127.0.0.1 (sc://127.0.0.1:<port>)."""
    env = spark_env(work)
    port = free_port()
    server = Server(f"sc://127.0.0.1:{port}")
    server.logs = [work / "connect.log"]
    server.procs.append(
        _spawn(
            [
                str(SPARK_HOME / "bin" / "spark-submit"),
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--master",
                master,
                "--driver-memory",
                memory,
                "--conf",
                "spark.driver.extraJavaOptions=-XX:+ExitOnOutOfMemoryError",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.driver.bindAddress=127.0.0.1",
                "--name",
                "kclpy-spark-test-connect",
            ],
            env,
            server.logs[0],
        )
    )

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    _wait(listening, server, 120, "the Spark Connect server")
    return server


if __name__ == "__main__":  # by hand: start one and wait for Ctrl-C
    kind = sys.argv[1] if len(sys.argv) > 1 else "connect"
    work = Path(sys.argv[2] if len(sys.argv) > 2 else f"/tmp/kclpy-spark-{kind}")
    srv = start_connect(work) if kind == "connect" else start_standalone(work)
    print(srv.url, flush=True)
    try:
        signal.pause()
    finally:
        srv.stop()
