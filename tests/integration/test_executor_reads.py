"""``read_on = "executors"`` end to end, as users run it: ``kclpy-spark run --until-caught-up``
with a ``[sink]`` table on LocalStack and a local Spark whose tasks read the leased ranges. Every
record reaches the Parquet sink once and the job commits and exits 0, on a plain stream and on a
resharded one (parents before children, the parent's shard end found by a read on the
executors)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from test_readstream import _split
from worker_procs import produce, spark_warnings, wait_active, worker_env


def _job(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config),
         "--until-caught-up"],
        capture_output=True, text=True, timeout=240, env=worker_env(cwd / "out"), cwd=cwd,
        check=False,
    )  # fmt: skip


def _config(
    tmp_path: Path, name: str, endpoint: str, max_records: int = 120, target: str = "local[2]"
) -> tuple[Path, Path]:
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
spark_target = "{target}"
max_wait = 1.0
max_records = {max_records}
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


def _read_all(
    kinesis: Any,
    name: str,
    endpoint: str,
    tmp_path: Path,
    shards: int,
    records: int,
    **settings: Any,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A new stream of ``shards`` with ``records`` records read by one job to its end, which
    exits 0 having written every record once; its result and the Parquet folder."""
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    wait_active(kinesis, name)
    produce(kinesis, name, range(records))
    config, parquet = _config(tmp_path, name, endpoint, **settings)
    result = _job(config, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _written(parquet) == list(range(records)), "every record once"
    return result, parquet


def test_a_job_reading_on_the_executors_writes_every_record_once(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    result, parquet = _read_all(  # 2,000 records: a few dozen read rounds
        kinesis_client, unique_name, localstack_endpoint, tmp_path, 2, 2000
    )
    assert not list(parquet.rglob("*.crc")), "written without the no-chmod filesystem"
    assert "read 2 range(s)" in result.stderr or "executors" in result.stderr
    # Freeing a read's stored rows logs nothing: Spark's RDD.unpersist warns of every local
    # checkpoint, which was a line per read job, several a second for as long as the daemon ran.
    assert "locally checkpointed" not in result.stderr
    assert spark_warnings(result.stderr) == [], "a clean run logs no Spark WARN or ERROR line"


def test_a_batch_of_many_pieces_is_written_without_parquets_memory_warnings(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    # A batch of several leases is written with a Parquet writer a piece open at once in each
    # task (session.SQL_DEFAULTS). From 8 open writers in one JVM, Parquet's memory manager
    # warned at every writer opened or closed (jvm_logs.QUIET). One core: a write is one task.
    result, parquet = _read_all(
        kinesis_client, unique_name, localstack_endpoint, tmp_path, 20, 4000,
        max_records=100_000, target="local[1]",
    )  # fmt: skip
    assert max(_pieces_a_batch(parquet)) >= 8, "no batch held enough pieces to show it"
    assert "Total allocation exceeds" not in result.stderr
    assert spark_warnings(result.stderr) == []


def _pieces_a_batch(parquet: Path) -> list[int]:
    """How many pieces each write held: a piece's files are named by the Spark write job that
    made them (``part-NNNNN-<job's uuid>.c000...``)."""
    writes = Counter(f.name.split("-", 2)[2][:36] for f in parquet.glob("*/part-*.parquet"))
    return list(writes.values())


def test_a_resharded_stream_read_on_the_executors_parents_first(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(200))
    _split(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(200, 400))
    config, parquet = _config(tmp_path, unique_name, localstack_endpoint)
    result = _job(config, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert _written(parquet) == list(range(400)), "every record once"


_FUNCTION = '''
"""A foreachBatch function: stores each batch's numbers under its batch id (idempotent: a batch
id seen again must hold the same numbers, else a mismatch file); with FN_CRASH set, the process
dies (os._exit, as kill -9) right after its first write, before any checkpoint moved; with
FN_FREE set, its first call frees every RDD Spark stores before it reads the batch."""
import json
import os
import pathlib

OUT = pathlib.Path(os.environ["FN_OUT"])


def write(df, batch_id):
    if os.environ.get("FN_FREE") and not (OUT / "freed").exists():
        # As an executor lost would: every read's rows stored on the executors are gone.
        (OUT / "freed").write_text(str(batch_id))
        jsc = df.sparkSession.sparkContext._jsc
        for rdd_id in list(jsc.getPersistentRDDs().keys()):
            jsc.sc().unpersistRDD(int(rdd_id), True)
    rows = sorted(int(bytes(r["data"]).decode()) for r in df.select("data").collect())
    target = OUT / f"{batch_id}.json"
    if target.exists():
        if json.loads(target.read_text()) != rows:
            (OUT / f"mismatch-{batch_id}").write_text(json.dumps(rows))
        return
    target.write_text(json.dumps(rows))
    if os.environ.get("FN_CRASH") and not (OUT / "crashed").exists():
        (OUT / "crashed").write_text(str(batch_id))
        os._exit(9)
'''


def _function_job(
    tmp_path: Path, name: str, endpoint: str, max_records: int, flags: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """One ``--until-caught-up`` job writing with ``_FUNCTION`` (its batches in tmp_path/batches;
    ``flags``: FN_CRASH, FN_FREE), on one SQLite lease table across runs."""
    import os

    (tmp_path / "crashfn.py").write_text(_FUNCTION)
    (tmp_path / "batches").mkdir(exist_ok=True)
    config = tmp_path / "fn.toml"
    config.write_text(f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "sqlite:{tmp_path / "fn.db"}"
idle_time_between_reads = 0.2
failover_time = 3.0
[sink]
sink = "crashfn:write"
spark_target = "local[2]"
max_wait = 1.0
max_records = {max_records}
read_on = "executors"
""")
    env = worker_env(tmp_path / "out") | {"FN_OUT": str(tmp_path / "batches")} | flags
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config),
         "--until-caught-up"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip


def test_a_batch_in_flight_at_a_crash_is_read_again_exactly_by_the_next_owner(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """The first run dies right after its sink wrote the first batch: its pending checkpoint
    names the pieces, not their records. The next run (a bigger record budget, more records on
    the stream) reads those pieces again on the executors, pinned to their last records: the
    function sees the same batch ids with the same records, and every record is written once."""

    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(150))
    out = tmp_path / "batches"

    def run(max_records: int, crash: bool) -> subprocess.CompletedProcess[str]:
        flags = {"FN_CRASH": "1"} if crash else {}
        return _function_job(tmp_path, unique_name, localstack_endpoint, max_records, flags)

    first = run(40, crash=True)
    assert first.returncode == 9, first.stderr[-3000:]
    crashed = (out / "crashed").read_text()
    before = json.loads((out / f"{crashed}.json").read_text())
    assert len(before) == 40
    produce(kinesis_client, unique_name, range(150, 300))

    second = run(1000, crash=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert not list(out.glob("mismatch-*")), "a batch id came back with other records"
    assert json.loads((out / f"{crashed}.json").read_text()) == before
    written = sorted(n for f in out.glob("*.json") for n in json.loads(f.read_text()))
    assert written == list(range(300)), "every record once"
    assert "re-forming" in second.stderr


def test_rows_lost_on_the_executors_are_read_again_and_written_once(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """An executor lost after a read took the rows it stored: the first batch's function frees
    every RDD Spark stores, then reads its frame, which fails. The batch's pieces are read again
    on the executors, pinned to their ends, and the function gets the same batch id with the
    same records; no lease parks; every record is written once and the job exits 0."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=2)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(300))
    result = _function_job(tmp_path, unique_name, localstack_endpoint, 60, {"FN_FREE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "batches"
    freed = (out / "freed").read_text()
    assert (out / f"{freed}.json").exists(), "the batch whose rows were freed is written"
    assert not list(out.glob("mismatch-*")), "a batch id came back with other records"
    written = sorted(n for f in out.glob("*.json") for n in json.loads(f.read_text()))
    assert written == list(range(300)), "every record once"
    assert "are read again" in result.stderr
    assert "parking" not in result.stderr and "parked" not in result.stderr


def test_rows_lost_after_a_parents_end_was_read_are_read_again_before_its_shard_end(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """The same loss on a split stream's parent, whose end is read with (or right after) its
    records: the batch holding them is written during the consumer's shard-end step. Its
    pieces are read again, pinned, while that step waits (its relay had ended with the shard's
    end: the lane parked and the lease waited out its failures and a parking); the parent's
    SHARD_END checkpoint comes after them, then its children; every record once."""
    kinesis_client.create_stream(StreamName=unique_name, ShardCount=1)
    wait_active(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(150))
    _split(kinesis_client, unique_name)
    produce(kinesis_client, unique_name, range(150, 300))
    result = _function_job(tmp_path, unique_name, localstack_endpoint, 1000, {"FN_FREE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "batches"
    freed = (out / "freed").read_text()
    first = json.loads((out / f"{freed}.json").read_text())
    assert first == list(range(150)), "the parent's records, freed and read again"
    assert not list(out.glob("mismatch-*")), "a batch id came back with other records"
    written = sorted(n for f in out.glob("*.json") for n in json.loads(f.read_text()))
    assert written == list(range(300)), "every record once"
    assert "are read again" in result.stderr
    assert "parking" not in result.stderr and "parked" not in result.stderr
