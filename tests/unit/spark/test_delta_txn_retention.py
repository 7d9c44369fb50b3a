"""A Delta table keeps one application transaction id per lease key the sink ever wrote (a
reshard's parents too): with ``delta_txn_retention_days`` the table the sink creates expires the
ids of leases gone quiet that long (Delta's ``delta.setTransactionRetentionDuration``), each
transaction stamped with its commit time. Real deltalake, no Spark."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pyarrow as pa
import pytest

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.pieces import SCHEMA, Piece, PieceKey
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sink_config import sink_config
from kclpy_spark.spark.sink_setup import load_sink
from kclpy_spark.spark.sinks import TXN_RETENTION, DeltaSink

deltalake = pytest.importorskip("deltalake")
DAY = 86_400.0


def batch(lease: str, version: int) -> SinkBatch:
    key = PieceKey(lease, ExtendedSequenceNumber("1"), ExtendedSequenceNumber("1"))
    row = {"stream": "s", "shard_id": lease, "sequence_number": "1", "sub_sequence_number": 0,
           "partition_key": "k", "approximate_arrival_timestamp": 0, "data": b"x"}  # fmt: skip
    table = pa.Table.from_pylist([row], schema=SCHEMA)
    return SinkBatch(version, (Piece(key, lease, 1),), table, tokens={lease: version})


class Wall:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("retention", "parent_kept"), [(2.0, False), (None, True)], ids=["retention", "unset"]
)
def test_a_lease_quiet_past_the_retention_leaves_the_table_and_others_stay(
    tmp_path: Path, retention: float | None, parent_kept: bool
) -> None:
    wall = Wall()
    wall.now -= 3 * DAY  # the parent's last write, three days ago
    path = str(tmp_path / "delta")
    sink = DeltaSink(path, txn_retention_days=retention, wall_clock=wall)
    sink.write(batch("parent", 4))
    wall.now += 3 * DAY - 60  # the child's, a minute ago (within any retention)
    sink.write(batch("child", 1))
    reader = DeltaSink(path)  # a fresh look at the table
    assert reader.committed_versions(["parent", "child"]) == {
        "parent": 4 if parent_kept else 0,
        "child": 1,
    }
    configuration = deltalake.DeltaTable(path).metadata().configuration
    expected = None if retention is None else f"interval {round(retention * DAY)} seconds"
    assert configuration.get(TXN_RETENTION) == expected


def test_a_retired_version_carries_its_commit_time_too(tmp_path: Path) -> None:
    wall = Wall()
    path = str(tmp_path / "delta")
    sink = DeltaSink(path, txn_retention_days=1.0, wall_clock=wall)
    sink.write(batch("a", 1))
    wall.now -= 2 * DAY  # retired "two days ago": already past the retention when read
    sink.retire_tokens(batch("a", 2))
    assert DeltaSink(path).committed_version("a") == 0
    wall.now += 2 * DAY
    sink.retire_tokens(batch("a", 3))
    assert DeltaSink(path).committed_version("a") == 3


def test_a_table_made_before_without_it_is_named_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = str(tmp_path / "delta")
    DeltaSink(path).write(batch("a", 1))
    sink = DeltaSink(path, txn_retention_days=30.0)
    with caplog.at_level(logging.WARNING):
        sink.write(batch("a", 2))
        assert sink.committed_versions(["a"]) == {"a": 2}
        sink.write(batch("a", 3))
    warned = [r.getMessage() for r in caplog.records if TXN_RETENTION in r.getMessage()]
    assert len(warned) == 1 and "set_table_properties" in warned[0]


def test_the_config_key_reaches_the_sink_and_a_short_retention_is_refused(
    tmp_path: Path,
) -> None:
    cfg = sink_config(f"delta:{tmp_path / 'delta'}", delta_txn_retention_days=7)
    sink = load_sink(cfg, application="app")
    assert isinstance(sink, DeltaSink)
    sink.write(batch("a", 1))
    configuration = deltalake.DeltaTable(str(tmp_path / "delta")).metadata().configuration
    assert configuration[TXN_RETENTION] == "interval 604800 seconds"
    with pytest.raises(ConfigError, match="delta_txn_retention_days' must be >= 1"):
        sink_config(f"delta:{tmp_path / 'delta'}", delta_txn_retention_days=0.5)
