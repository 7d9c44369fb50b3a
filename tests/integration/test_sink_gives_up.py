"""#49 item 8 with a real worker process and local Spark: a sink that gives up on a batch parks
its lease even on a quiet stream (``/readyz`` 503 naming it), and once the sink works again the
batch is written when the lease reopens. Before, the park landed only with the next record: on a
quiet stream never, ``/readyz`` stayed 200, and nothing was written again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_bad_input_running import _readyz
from test_spark_sink_kill9 import wait_for, worker_toml
from worker_procs import free_port, produce, wait_active

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _written(out: Path) -> set[str]:
    return set(out.read_text().split()) if out.exists() else set()


def test_a_sink_that_gives_up_parks_its_lease_on_a_quiet_stream_and_writes_it_later(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    stream = unique_name
    kinesis_client.create_stream(StreamName=stream, ShardCount=1)
    wait_active(kinesis_client, stream)
    port = free_port()
    out, flag, log = tmp_path / "rows.txt", tmp_path / "read-only", tmp_path / "worker.log"
    config = tmp_path / "worker.toml"
    config.write_text(
        worker_toml(stream, localstack_endpoint, tmp_path / "leases.db").replace(
            "\n\n", f"\nmetrics_port = {port}\nmax_processing_attempts = 2\npark_duration = 8.0\n\n"
        )
        + '[sink]\nsink = "flag_sink:fails_while_flagged"\nspark_target = "local[1]"\n'
        "max_wait = 0.3\nmax_attempts = 2\nretry_base_delay = 0.1\nretry_max_delay = 0.2\n"
    )
    env = dict(os.environ, KCLPY_TEST_FLAG=str(flag), KCLPY_TEST_OUT=str(out))
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config)],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        first = set(produce(kinesis_client, stream, range(3)))
        wait_for(lambda: first <= _written(out), 120, "the first records", proc, log)
        flag.touch()  # the output stops taking writes
        later = set(produce(kinesis_client, stream, range(3, 6)))
        # Nothing more is put: the stream is quiet while the sink gives up.
        wait_for(lambda: _readyz(port)[0] == 503, 60, "/readyz 503 after the sink gave up",
                 proc, log)  # fmt: skip
        assert "parked" in _readyz(port)[1]
        assert not later & _written(out)
        flag.unlink()  # writable again: the lease reopens after park_duration and is rewritten
        wait_for(lambda: later <= _written(out), 60, "the batch written again", proc, log)
        wait_for(lambda: _readyz(port)[0] == 200, 30, "/readyz 200 again", proc, log)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text(errors="replace")
    assert "giving up after 2 attempt(s)" in text and "no_records failed" in text
