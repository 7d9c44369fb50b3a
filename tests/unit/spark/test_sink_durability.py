"""Published data is durable before its checkpoint moves (issue 14, finding 9): the Parquet sink
fsyncs a piece's files and folder before renaming it into place and the sink's folder after the
batch's renames; the dead-letter writer fsyncs its file and folder; staging folders of crashed
writers are removed.

The fsync calls are recorded by wrapping the sink's own fsync helper (the real fsync still runs):
a power cut cannot be staged in a test, the order of the calls that survive one can."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark import sinks
from kclpy_spark.spark.pieces import SCHEMA, Piece, PieceKey
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sinks import DeadLetterDirectory, ParquetSink


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Path]]:
    calls: list[tuple[str, Path]] = []
    real_fsync, real_rename, real_replace = sinks.fsync_path, os.rename, os.replace

    def fsync(path: str | os.PathLike[str]) -> None:
        calls.append(("fsync", Path(path)))
        real_fsync(path)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(("rename", Path(dst)))
        real_rename(src, dst)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(("rename", Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(sinks, "fsync_path", fsync)
    monkeypatch.setattr(sinks.os, "rename", rename)
    monkeypatch.setattr(sinks.os, "replace", replace)
    return calls


def test_each_piece_is_fsynced_before_its_rename_and_the_renames_after(
    tmp_path: Path, synced: list[tuple[str, Path]]
) -> None:
    sink = ParquetSink(tmp_path / "out")
    moves = []
    for i in range(3):
        src = tmp_path / "out" / "_staging" / "b1" / f"kcl_piece_index={i}"
        src.mkdir(parents=True)
        for name in (f"part-0-{i}.parquet", f"part-1-{i}.parquet"):
            (src / name).write_bytes(b"data")
        moves.append((src, tmp_path / "out" / f"kcl_piece=p{i}"))
    sink._publish(moves)
    for i, (_, dst) in enumerate(moves):
        rename_at = synced.index(("rename", dst))
        before = {path.name for kind, path in synced[:rename_at] if kind == "fsync"}
        assert {f"part-0-{i}.parquet", f"part-1-{i}.parquet", f"kcl_piece_index={i}"} <= before
        assert sorted(p.name for p in dst.iterdir()) == [
            f"part-0-{i}.parquet",
            f"part-1-{i}.parquet",
        ]
    # The renames are made durable together, once, after the last of them.
    last_rename = max(synced.index(("rename", dst)) for _, dst in moves)
    assert synced[last_rename + 1 :] == [("fsync", tmp_path / "out")]
    assert synced.count(("fsync", tmp_path / "out")) == 1  # not once a piece


def test_a_dead_letter_file_and_its_folder_are_fsynced(
    tmp_path: Path, synced: list[tuple[str, Path]]
) -> None:
    key = PieceKey("shardId-0", ExtendedSequenceNumber("1"), ExtendedSequenceNumber("1"))
    table = pa.Table.from_pylist(
        [
            {
                "stream": "s",
                "shard_id": "shardId-0",
                "sequence_number": "1",
                "sub_sequence_number": 0,
                "partition_key": "k",
                "approximate_arrival_timestamp": 0,
                "data": b"x",
            }
        ],
        schema=SCHEMA,
    )
    dead = DeadLetterDirectory(tmp_path / "dlq")
    dead.write(SinkBatch(7, (Piece(key, "shardId-0", 1),), table), RuntimeError("boom"))
    final = tmp_path / "dlq" / f"batch-{7:016x}.parquet"
    kinds = [kind for kind, _ in synced]
    assert kinds == ["fsync", "rename", "fsync"]
    assert synced[1] == ("rename", final) and synced[2] == ("fsync", final.parent)
    assert final.exists()
    # Two sinks sharing the location keep a file each, named and marked with the sink.
    for name in ("parquet", "alerts"):
        shared = DeadLetterDirectory(tmp_path / "dlq", sink_name=name)
        shared.write(SinkBatch(7, (Piece(key, "shardId-0", 1),), table), RuntimeError(name))
    import pyarrow.parquet as pq

    for name in ("parquet", "alerts"):
        path = tmp_path / "dlq" / f"batch-{7:016x}-{name}.parquet"
        metadata = pq.read_schema(path).metadata
        assert metadata[b"kclpy_spark.sink"] == name.encode()
        assert name.encode() in metadata[b"kclpy_spark.error"]


def test_pieces_found_in_place_are_fsynced_before_they_are_acknowledged(
    tmp_path: Path, synced: list[tuple[str, Path]]
) -> None:
    """A kill -9 between a piece's rename and the fsync of the sink's folder left the piece in
    place but maybe not on disk: the retry (or the new owner) skipped it as written and its
    checkpoint moved; an OS crash then lost it. Found in place, it is fsynced first."""
    sink = ParquetSink(tmp_path / "out")
    key = PieceKey("shardId-0", ExtendedSequenceNumber("1"), ExtendedSequenceNumber("1"))
    piece = Piece(key, "shardId-0", 1)
    placed = sink.piece_dir(piece)
    placed.mkdir(parents=True)
    (placed / "part-0.parquet").write_bytes(b"data")
    sink.write(SinkBatch(7, (piece,), pa.Table.from_pylist([], schema=SCHEMA)))
    assert [path for _, path in synced] == [placed / "part-0.parquet", placed, tmp_path / "out"]
    # A dead-letter file found in place (a replay) is fsynced, with its folder, as well.
    dead = DeadLetterDirectory(tmp_path / "dlq")
    final = tmp_path / "dlq" / f"batch-{7:016x}.parquet"
    final.parent.mkdir()
    final.write_bytes(b"data")
    synced.clear()
    dead.write(SinkBatch(7, (piece,), pa.Table.from_pylist([], schema=SCHEMA)), RuntimeError())
    assert synced == [("fsync", final), ("fsync", final.parent)]


def test_staging_folders_of_crashed_writers_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    staging = tmp_path / "out" / "_staging"
    old, fresh = staging / "crashed", staging / "writing"
    for folder in (old, fresh):
        (folder / "kcl_piece_index=0").mkdir(parents=True)
    hour_ago = time.time() - 2 * 3600
    os.utime(old, (hour_ago, hour_ago))
    ParquetSink(tmp_path / "out")  # cleans at start
    assert not old.exists() and fresh.exists()


def test_a_dead_letter_write_that_fails_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failed try (a full disk, a hang) left its temporary file behind: with a retry every
    few seconds, the folder filled with them."""
    key = PieceKey("shardId-0", ExtendedSequenceNumber("1"), ExtendedSequenceNumber("1"))
    row = {"stream": "s", "shard_id": "shardId-0", "sequence_number": "1",
           "sub_sequence_number": 0, "partition_key": "k", "approximate_arrival_timestamp": 0,
           "data": b"x"}  # fmt: skip
    batch = SinkBatch(7, (Piece(key, "shardId-0", 1),), pa.Table.from_pylist([row], SCHEMA))

    def disk_full(path: str | os.PathLike[str]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sinks, "fsync_path", disk_full)
    dead = DeadLetterDirectory(tmp_path / "dlq")
    for _ in range(3):
        with pytest.raises(OSError, match="No space"):
            dead.write(batch, RuntimeError("boom"))
    assert list((tmp_path / "dlq").iterdir()) == []


def test_a_dead_letter_write_cut_short_leaves_no_file_for_good(tmp_path: Path) -> None:
    """A crash or a stop in the middle of a dead-letter write left its temporary file, up to a
    batch's size, for good (a failed write deletes its own); the sink's set-up sweeps the old
    ones, and leaves alone one another worker may be writing now."""
    folder = tmp_path / "dlq"
    folder.mkdir()
    cut_short = folder / ".batch-0000000000000007.parquet.1a2b3c4d.tmp"
    cut_short.write_bytes(b"x" * 1000)
    two_hours_ago = time.time() - 2 * 3600
    os.utime(cut_short, (two_hours_ago, two_hours_ago))
    writing_now = folder / ".batch-0000000000000008.parquet.5e6f7a8b.tmp"
    writing_now.write_bytes(b"y")
    kept = folder / "batch-0000000000000009.parquet"
    kept.write_bytes(b"z")
    os.utime(kept, (two_hours_ago, two_hours_ago))
    DeadLetterDirectory(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted([writing_now.name, kept.name])
