"""One application consuming several streams (LocalStack, a real worker process): lease keys in the
KCL's multi-stream format, separate checkpoints, and streams added or removed while running."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from worker_procs import fleet, read_output, wait_active, wait_for

from checkpoint.stores.sqlite import SQLiteLeaseTable


def _config(app: str, endpoint: str, db: Path, streams: list[str]) -> str:
    tables = "".join(
        f'\n[[streams]]\nstream_name = "{s}"\ninitial_position = "TRIM_HORIZON"\n' for s in streams
    )
    return f"""
application_name = "{app}"
endpoint_url = "{endpoint}"
lease_store = "sqlite:{db}"
processor = "kclpy_spark.demo.samples:JsonLinesProcessor"
failover_time = 3.0
idle_time_between_reads = 0.2
shard_sync_interval = 1.0
{tables}"""


def test_several_streams_one_application(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    names = {x: f"{unique_name[:40]}-{x}" for x in ("a", "b", "c")}
    for label, shards in (("a", 2), ("b", 1), ("c", 1)):
        kinesis_client.create_stream(StreamName=names[label], ShardCount=shards)
    for name in names.values():
        wait_active(kinesis_client, name)
    output = tmp_path / "out"
    db = tmp_path / "leases.db"
    try:
        a = {f"a{n}" for n in produce_named(kinesis_client, names["a"], "a", 30)}
        b = {f"b{n}" for n in produce_named(kinesis_client, names["b"], "b", 20)}
        config = _config(unique_name, localstack_endpoint, db, [names["a"], names["b"]])
        with fleet(tmp_path, config, output) as workers:
            workers.start("multi")
            seen = lambda: {line["data"] for line in read_output(output)}  # noqa: E731
            wait_for("records of streams a and b", lambda: a | b <= seen(), timeout=60)
            table = SQLiteLeaseTable(db, namespace=unique_name)
            keys = sorted(x.lease_key for x in table.list_leases())
            assert len(keys) == 3
            pattern = r"^\d{12}:(%s):\d+:shardId-\d{12}$"
            assert all(
                re.match(pattern % "|".join(map(re.escape, names.values())), k) for k in keys
            )
            assert {k.split(":")[1] for k in keys} == {names["a"], names["b"]}
            # Separate checkpoints: each lease holds a sequence number of its own stream's shard
            # (the processor writes its output, then checkpoints: waited for, not assumed).
            wait_for(
                "a checkpoint on every lease",
                lambda: all(not x.checkpoint.is_sentinel for x in table.list_leases()),
                timeout=30,
            )

            # Add stream c and remove stream b in the config file while the worker runs.
            workers.config.write_text(
                _config(unique_name, localstack_endpoint, db, [names["a"], names["c"]])
            )
            c = {f"c{n}" for n in produce_named(kinesis_client, names["c"], "c", 15)}
            wait_for("records of the added stream c", lambda: c <= seen(), timeout=60)
            wait_for(
                "stream b's lease to be handed back",
                lambda: all(
                    x.lease_owner is None
                    for x in table.list_leases()
                    if x.lease_key.split(":")[1] == names["b"]
                ),
                timeout=30,
            )
            late_b = {f"b{n}" for n in produce_named(kinesis_client, names["b"], "b", 5, start=100)}
            more_a = {f"a{n}" for n in produce_named(kinesis_client, names["a"], "a", 5, start=100)}
            wait_for("more records of stream a", lambda: more_a <= seen(), timeout=60)
            assert not late_b & seen(), "a removed stream was still consumed"
    finally:
        for name in names.values():
            kinesis_client.delete_stream(StreamName=name, EnforceConsumerDeletion=True)


def produce_named(kinesis: Any, stream: str, prefix: str, count: int, start: int = 0) -> list[int]:
    """Put records whose data is ``<prefix><n>``; returns the numbers."""
    numbers = list(range(start, start + count))
    entries = [{"Data": f"{prefix}{n}".encode(), "PartitionKey": f"{prefix}-{n}"} for n in numbers]
    resp = kinesis.put_records(StreamName=stream, Records=entries)
    assert resp["FailedRecordCount"] == 0
    return numbers
