"""``kclpy-spark run --until-caught-up`` on LocalStack (issue 18): a resharded stream read to its
tip as of start, parents before children, committed, exit 0; a second run reads only what came
since; a processor that does not checkpoint makes the job exit 1 with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from worker_procs import produce, read_output, spark_warnings, wait_active, worker_env


def _job(config: Path, output: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config),
         "--until-caught-up"],
        capture_output=True, text=True, timeout=180, env=worker_env(output), cwd=cwd, check=False,
    )  # fmt: skip


def _split(kinesis: Any, stream: str) -> None:
    shard = kinesis.describe_stream(StreamName=stream)["StreamDescription"]["Shards"][0]
    low = int(shard["HashKeyRange"]["StartingHashKey"])
    high = int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis.split_shard(StreamName=stream, ShardToSplit=shard["ShardId"],
                        NewStartingHashKey=str((low + high) // 2))  # fmt: skip
    wait_active(kinesis, stream)


def _config(tmp_path: Path, name: str, endpoint: str, processor: str) -> Path:
    config = tmp_path / f"{processor.split(':')[-1]}.toml"
    config.write_text(f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{tmp_path / (processor.split(":")[-1] + ".db")}"
processor = "{processor}"
failover_time = 3.0
idle_time_between_reads = 0.2
shard_sync_interval = 1.0
""")
    return config


def test_a_job_reads_a_resharded_stream_to_its_tip_commits_and_exits(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(0, 40))
    _split(kinesis_client, name)
    produce(kinesis_client, name, range(40, 80))  # into the two children
    config = _config(
        tmp_path, name, localstack_endpoint, "kclpy_spark.demo.samples:JsonLinesProcessor"
    )
    output = tmp_path / "out"

    first = _job(config, output, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "caught up" in first.stderr
    lines = read_output(output)
    numbers = [int(x["data"]) for x in lines]
    assert sorted(numbers) == list(range(80)), "each record once"
    parent = "shardId-000000000000"
    last_parent = max(x["t"] for x in lines if x["shard"] == parent)
    assert all(x["t"] >= last_parent for x in lines if x["shard"] != parent), "parents first"

    status = subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "status", "--json", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
    )  # fmt: skip
    leases = {x["shard_id"]: x for x in json.loads(status.stdout)["leases"]}
    # The finished parent: at SHARD_END, or already deleted by the leader's cleanup.
    assert parent not in leases or leases[parent]["checkpoint"] == "SHARD_END"
    children = [x for x in leases.values() if x["shard_id"] != parent]
    assert len(children) == 2 and all(x["checkpoint"].isdigit() for x in children)
    assert all(x["owner"] is None for x in leases.values())  # released when the job ended

    # The next run reads only what came since.
    produce(kinesis_client, name, range(80, 100))
    second = _job(config, output, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    numbers = [int(x["data"]) for x in read_output(output)]
    assert sorted(numbers) == list(range(100)), "nothing read twice, nothing skipped"


def test_a_job_whose_processor_does_not_checkpoint_exits_1_with_one_line(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=1)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(10))
    (tmp_path / "forgetful.py").write_text(
        "from kclpy_spark import RecordProcessor\n\n"
        "class Forgetful(RecordProcessor):\n"
        "    def process_records(self, process_records_input):\n"
        "        pass  # never checkpoints\n"
    )
    config = _config(tmp_path, name, localstack_endpoint, "forgetful:Forgetful")
    result = _job(config, tmp_path / "out", tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [x for x in result.stderr.splitlines() if x.startswith("kclpy-spark: error:")]
    assert len(errors) == 1 and "not caught up" in errors[0], result.stderr[-3000:]
    assert "were delivered but the checkpoint is TRIM_HORIZON" in errors[0]
    assert "Traceback" not in result.stderr


def test_a_spark_sink_job_writes_every_record_once_and_exits(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """The same job with a [sink] table: the built-in Parquet sink, local Spark."""
    import pyarrow.dataset as ds

    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=2)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(300))
    config = tmp_path / "sink.toml"
    parquet = tmp_path / "parquet"
    config.write_text(f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{tmp_path / "sink.db"}"
idle_time_between_reads = 0.2
[sink]
sink = "parquet:{parquet}"
spark_target = "local[1]"
max_wait = 1.0
[sink.spark_conf]
"spark.sql.shuffle.partitions" = "1"
""")
    result = _job(config, tmp_path / "out", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    table = ds.dataset(str(parquet), format="parquet", partitioning="hive").to_table()
    data = sorted(int(bytes(x).decode()) for x in table.column("data").to_pylist())
    assert data == list(range(300)), "every record once"
    # The sink wrote through the no-chmod filesystem its local[N] session loads (local_fs.py):
    # Hadoop's default one leaves a .crc file next to every file.
    assert not list(parquet.rglob("*.crc"))
    # Spark's own log lines come in the daemon's format, without its start-up noise (issue 18).
    assert "Using Spark's default log4j profile" not in result.stderr
    assert "NativeCodeLoader" not in result.stderr
    assert "Spark session on local[1]" in result.stderr
    assert spark_warnings(result.stderr) == [], "a clean run logs no Spark WARN or ERROR line"
    for line in result.stderr.splitlines():
        if " spark." in line:
            assert line[:4].isdigit() and line[19] == ",", line  # "2026-11-24 06:16:37,145 ..."


_FLAKY_SINK = '''
"""A foreachBatch function that fails its first attempt at every batch, then appends the
batch's rows to its own Parquet folder (a second sink next to the built-in one)."""
import os

SEEN = {}


def write(df, batch_id):
    SEEN[batch_id] = SEEN.get(batch_id, 0) + 1
    if SEEN[batch_id] == 1:
        raise RuntimeError("first attempt fails")
    df.write.mode("append").parquet(os.environ["FLAKY_OUT"])
'''


def test_a_job_with_two_sinks_writes_every_record_to_each_and_exits(
    kinesis_client: Any,
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[[sinks]] as a user writes it: the built-in Parquet sink and a function of their own (in
    the working directory) that fails each batch once; the job ends with every record in both
    outputs, the Parquet one exactly once, and every checkpoint at the shard's last record."""
    import pyarrow.dataset as ds

    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=2)
    wait_active(kinesis_client, name)
    produce(kinesis_client, name, range(200))
    (tmp_path / "flaky_sink.py").write_text(_FLAKY_SINK)
    parquet, flaky = tmp_path / "parquet", tmp_path / "flaky"
    config = tmp_path / "sinks.toml"
    config.write_text(f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{tmp_path / "sinks.db"}"
idle_time_between_reads = 0.2
[sink]
spark_target = "local[1]"
max_wait = 1.0
retry_base_delay = 0.1
[sink.spark_conf]
"spark.sql.shuffle.partitions" = "1"
[[sinks]]
sink = "parquet:{parquet}"
[[sinks]]
sink = "flaky_sink:write"
max_attempts = 3
""")
    monkeypatch.setenv("FLAKY_OUT", str(flaky))  # worker_env passes it on
    result = _job(config, tmp_path / "out", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Spark sinks ParquetSink" in result.stderr and "first attempt fails" in result.stderr
    for folder, once in ((parquet, True), (flaky, False)):
        table = ds.dataset(str(folder), format="parquet", partitioning="hive").to_table()
        data = sorted(int(bytes(x).decode()) for x in table.column("data").to_pylist())
        if once:
            assert data == list(range(200)), "every record once in the built-in sink"
        else:
            assert sorted(set(data)) == list(range(200)), "every record in the function's output"
    from checkpoint.stores.sqlite import SQLiteLeaseTable

    store = SQLiteLeaseTable(tmp_path / "sinks.db", namespace=name, create_if_missing=False)
    try:
        leases = store.list_leases()
    finally:
        store.close()
    assert len(leases) == 2 and all(x.pending_checkpoint is None for x in leases)
    assert all(not x.checkpoint.is_sentinel for x in leases)
