"""A Delta table keeps one application transaction id per lease key the sink ever wrote (a
reshard's parents too): with ``delta_txn_retention_days`` the table the sink creates expires the
ids of leases gone quiet that long (Delta's ``delta.setTransactionRetentionDuration``), each
transaction stamped with its commit time. Real deltalake, no Spark."""

from __future__ import annotations

import logging
import threading
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
from kclpy_spark.spark.sinks import TXN_RETENTION, DeltaSink, interval_seconds

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


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if TXN_RETENTION in r.getMessage()]


@pytest.mark.parametrize(
    ("made_with", "configured", "warned"),
    [
        (None, 30.0, True),  # made before it was configured
        (30.0, None, True),  # made by another application: its retention is this one's too
        (30.0, 7.0, True),
        (30.0, 30.0, False),  # made by this sink
        (None, None, False),
    ],
)
def test_a_table_whose_retention_differs_from_the_config_is_named_once(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    made_with: float | None,
    configured: float | None,
    warned: bool,
) -> None:
    path = str(tmp_path / "delta")
    with caplog.at_level(logging.WARNING):
        DeltaSink(path, txn_retention_days=made_with).write(batch("a", 1))
        assert not _warned(caplog)  # the sink that made it
        sink = DeltaSink(path, txn_retention_days=configured)
        assert sink.committed_versions(["a"]) == {"a": 1}
        sink.write(batch("a", 2))
        assert sink.committed_versions(["a"]) == {"a": 2}
    assert len(_warned(caplog)) == (1 if warned else 0)
    if warned:
        assert "set_table_properties" in _warned(caplog)[0]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("interval 7 days", 604_800.0), ("interval 604800 seconds", 604_800.0),
     ("INTERVAL 1 week 2 hours", 612_000.0), (None, None)],
)  # fmt: skip
def test_delta_intervals_compare_by_their_seconds(text: str | None, seconds: float | None) -> None:
    assert interval_seconds(text) == seconds


def test_an_interval_not_understood_equals_nothing() -> None:
    assert interval_seconds("7 fortnights") != interval_seconds("7 fortnights")


def test_two_writers_making_the_table_at_once_commit_a_piece_once(tmp_path: Path) -> None:
    """Both first writes made the table with their rows (delta-rs retried the losing create as
    the next version): an old and a new owner writing the same piece into a table not yet
    there wrote it twice. Each now makes it empty (or finds it) and appends from a snapshot;
    a refused append is tried again, as the batcher would."""

    def write(sink: DeltaSink, start: threading.Barrier) -> None:
        start.wait()
        try:
            sink.write(batch("a", 1))
        except Exception:  # refused as a concurrent transaction: the retry finds it committed
            sink.write(batch("a", 1))

    for attempt in range(8):
        path = str(tmp_path / f"delta-{attempt}")
        start = threading.Barrier(2)
        threads = [threading.Thread(target=write, args=(DeltaSink(path), start)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert deltalake.DeltaTable(path).to_pyarrow_table().num_rows == 1, attempt
        assert DeltaSink(path).committed_version("a") == 1


def test_the_config_key_reaches_the_sink_and_a_short_retention_is_refused(
    tmp_path: Path,
) -> None:
    cfg = sink_config(f"delta:{tmp_path / 'delta'}", delta_txn_retention_days=7)
    sink = load_sink(cfg, application="app")
    assert isinstance(sink, DeltaSink)
    sink.write(batch("a", 1))
    configuration = deltalake.DeltaTable(str(tmp_path / "delta")).metadata().configuration
    assert configuration[TXN_RETENTION] == "interval 604800 seconds"
    for bad in (0.5, float("inf"), float("nan"), 40_000.0):
        with pytest.raises(ConfigError, match=r"delta_txn_retention_days' must be 1\.\.36500"):
            sink_config(f"delta:{tmp_path / 'delta'}", delta_txn_retention_days=bad)
    # A write may end up to its timeout after it stamped its transaction: twice that at least.
    with pytest.raises(ConfigError, match=r"must be 2\.\.36500"):
        sink_config(
            f"delta:{tmp_path / 'delta'}", delta_txn_retention_days=1.5, write_timeout=86_400
        )
