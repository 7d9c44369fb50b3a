"""``read_on = "executors"`` end to end, as users run it: ``kclpy-spark run --until-caught-up``
with a ``[sink]`` table on LocalStack and a local Spark whose tasks read the leased ranges. Every
record reaches the Parquet sink once and the job commits and exits 0, on a plain stream and on a
resharded one (parents before children, the parent's shard end found by a read on the
executors)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from worker_procs import produce, wait_active, worker_env


def _job(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config),
         "--until-caught-up"],
        capture_output=True, text=True, timeout=240, env=worker_env(cwd / "out"), cwd=cwd,
        check=False,
    )  # fmt: skip


def _config(tmp_path: Path, name: str, endpoint: str) -> tuple[Path, Path]:
    config = tmp_path / "sink.toml"
    parquet = tmp_path / "parquet"
    config.write_text(f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{tmp_path / "sink.db"}"
idle_time_between_reads = 0.2
shard_sync_interval = 1.0
parent_shard_poll_interval = 0.5
[sink]
sink = "parquet:{parquet}"
spark_target = "local[2]"
max_wait = 1.0
max_records = 120
read_on = "executors"
[sink.spark_conf]
"spark.sql.shuffle.partitions" = "1"
""")
    return config, parquet


def _written(parquet: Path) -> list[int]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(parquet), format="parquet", partitioning="hive").to_table()
    return sorted(int(bytes(x).decode()) for x in table.column("data").to_pylist())


def _checkpoints(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("select name from sqlite_master where type='table'")]
        rows = {}
        for table in tables:
            cols = [r[1] for r in conn.execute(f"pragma table_info('{table}')")]
            if "lease_key" in cols and "checkpoint" in cols:
                rows.update(dict(conn.execute(f"select lease_key, checkpoint from '{table}'")))
        return rows


def test_a_job_reading_on_the_executors_writes_every_record_once(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(500))
    config, parquet = _config(tmp_path, unique_name, localstack_endpoint)
    result = _job(config, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _written(parquet) == list(range(500)), "every record once"
    assert "read 2 range(s)" in result.stderr or "executors" in result.stderr


def test_a_resharded_stream_read_on_the_executors_parents_first(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(200))
    shard = kinesis_client.describe_stream(StreamName=unique_name)["StreamDescription"]["Shards"][0]
    low = int(shard["HashKeyRange"]["StartingHashKey"])
    high = int(shard["HashKeyRange"]["EndingHashKey"])
    kinesis_client.split_shard(
        StreamName=unique_name,
        ShardToSplit=shard["ShardId"],
        NewStartingHashKey=str((low + high) // 2),
    )
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(200, 400))
    config, parquet = _config(tmp_path, unique_name, localstack_endpoint)
    result = _job(config, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _written(parquet) == list(range(400)), "every record once"
