"""#49 item 16: after a handoff timeout or local expiry, the old owner's Delta write of a piece
may still run while the new owner writes the same piece with the same app-transaction version.

delta-rs does not check an app version against the table: a write whose snapshot already holds
the other owner's commit of that version commits it again (shown below: 4 rows for 2). The sink
now checks the versions on the snapshot it commits from, so the second commit either sees the
first (skipped) or is refused by delta-rs as a concurrent transaction (a failed attempt; the retry
then sees it). Real deltalake, no Spark."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from checkpoint.sequence import TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.spark.micro_batcher import BatcherSettings, MicroBatcher
from kclpy_spark.spark.pieces import SCHEMA, Piece, PieceKey
from kclpy_spark.spark.sink_batch import SinkBatch
from kclpy_spark.spark.sinks import DeadLetterDirectory, DeltaSink

deltalake = pytest.importorskip("deltalake")


def piece(lease: str) -> Piece:
    key = PieceKey(lease, ExtendedSequenceNumber("1"), ExtendedSequenceNumber("2"))
    return Piece(key, lease, 2)


PIECE = piece("shardId-0")


def batch(tokens: Any, lease: str = "shardId-0") -> SinkBatch:
    rows = [
        {"stream": "s", "shard_id": lease, "sequence_number": str(i),
         "sub_sequence_number": 0, "partition_key": "k", "approximate_arrival_timestamp": 0,
         "data": b"x"}
        for i in (1, 2)
    ]  # fmt: skip
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    return SinkBatch(7, (piece(lease),), table, tokens=tokens)


def rows(path: Path) -> int:
    return int(deltalake.DeltaTable(str(path)).to_pyarrow_table().num_rows)


class OldOwnerWritesAfterOurRead(DeltaSink):
    """The new owner's sink: once armed, the old owner's write of the same piece lands right
    after the new owner's write read the table to check what is committed."""

    def __init__(self, path: str, old_owner: DeltaSink) -> None:
        super().__init__(path)
        self.old_owner, self.fired = old_owner, False
        self.old_tokens: dict[str, int] = {}
        self.armed = False  # set once both owners have prepared

    def _old_owner_writes(self) -> None:
        if self.armed and not self.fired:
            self.fired = True
            self.old_owner.write(batch(self.old_tokens))

    def committed_versions(self, lease_keys: Any) -> dict[str, int]:
        out = super().committed_versions(lease_keys)
        self._old_owner_writes()
        return out

    def _snapshot(self) -> Any:
        snapshot = super()._snapshot()
        self._old_owner_writes()
        return snapshot


def test_two_owners_writing_one_piece_commit_it_once(tmp_path: Path) -> None:
    path = str(tmp_path / "delta")
    DeltaSink(path).write(batch({}, "shardId-9"))  # the table exists, with another lease's data
    before = rows(tmp_path / "delta")
    old_owner = DeltaSink(path)
    new_owner = OldOwnerWritesAfterOurRead(path, old_owner)
    tokens = new_owner.prepare([PIECE])  # both prepared version 1 of the lease's app id
    new_owner.old_tokens = dict(old_owner.prepare([PIECE]))
    assert tokens == new_owner.old_tokens == {"shardId-0": 1}
    new_owner.armed = True
    try:
        new_owner.write(batch(tokens))
    except deltalake.exceptions.CommitFailedError as exc:  # refused: a failed attempt
        assert "Concurrent transaction" in str(exc)
        new_owner.write(batch(tokens))  # the retry sees the old owner's commit and skips it
    assert new_owner.fired
    assert rows(tmp_path / "delta") - before == 2  # once, not twice


def test_a_write_after_the_other_owners_commit_skips_the_piece(tmp_path: Path) -> None:
    path = str(tmp_path / "delta")
    old_owner, new_owner = DeltaSink(path), DeltaSink(path)
    tokens = new_owner.prepare([PIECE])
    old_owner.write(batch(old_owner.prepare([PIECE])))
    new_owner.write(batch(tokens))
    assert rows(tmp_path / "delta") == 2


class HangsFirst(DeltaSink):
    """A Delta sink whose first write gives no answer until the lease's next batch is written,
    then commits (a slow delta-rs call: the interrupt at the timeout cannot stop it)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.release = threading.Event()
        self.first_done = threading.Event()
        self.calls = 0

    def write(self, batch: SinkBatch) -> None:
        self.calls += 1
        if self.calls == 1:
            self.release.wait(30)
            try:
                super().write(batch)
            finally:
                self.first_done.set()
            return
        self.release.set()
        self.first_done.wait(30)
        super().write(batch)


def test_a_hung_delta_write_is_not_dead_lettered_so_the_next_batch_is_not_lost(
    tmp_path: Path,
) -> None:
    """Dead-lettered (acknowledged) while it still ran, the hung write later committed its
    version; the lease's next batch, prepared meanwhile with the same version, was skipped as
    committed and its checkpoint moved: its records were in neither the table nor the
    dead-letter folder."""
    from tests.unit.spark.test_micro_batcher import SHARDS, Env, esn, records

    sink = HangsFirst(str(tmp_path / "delta"))
    # One batcher, its write of A hung while the lease is taken again: 3 s a write (and as
    # much grace), so B's write, which waits for A's commit and then commits, answers in time
    # under the suite's load too (0.2 s did not always).
    env = Env(BatcherSettings(max_records=3, write_timeout=3.0, max_attempts=1))
    env.batcher = MicroBatcher(
        sink, env.settings, clock=env.clock, sleep=env.sleeps.append, threaded=False,
        dead_letter=DeadLetterDirectory(tmp_path / "dead"),
    )  # fmt: skip
    try:
        env.take(SHARDS[0])
        env.deliver(SHARDS[0], records(1, 3))  # A: 10..30, hangs
        env.batcher.run_until_idle()
        assert env.lease(SHARDS[0]).checkpoint == TRIM_HORIZON  # not acknowledged: parked
        assert not (tmp_path / "dead").exists() or not any((tmp_path / "dead").iterdir())
        env.take(SHARDS[0], worker="worker-b")  # taken again: A re-formed with its version
        env.deliver(SHARDS[0], records(1, 6))
        env.batcher.run_until_idle()
        sink.first_done.wait(30)
        assert env.lease(SHARDS[0]).checkpoint == esn(60)
        table = deltalake.DeltaTable(str(tmp_path / "delta")).to_pyarrow_table()
        assert sorted(int(s) for s in table.column("sequence_number").to_pylist()) == [
            10, 20, 30, 40, 50, 60
        ]  # fmt: skip
    finally:
        sink.release.set()
        env.batcher.close()


def test_two_applications_writing_one_table_keep_their_pieces_apart(tmp_path: Path) -> None:
    """One application per stream, both into one table: their leases of one name (each
    stream's shardId-0) shared a transaction id, so one's commit made the other's piece look
    committed, skipped, and its checkpoint moved (its records lost)."""
    from kclpy_spark.spark.sink_config import SinkConfig
    from kclpy_spark.spark.sink_setup import load_sink

    cfg = SinkConfig(f"delta:{tmp_path / 'delta'}")
    orders, clicks = load_sink(cfg, application="orders"), load_sink(cfg, application="clicks")
    assert isinstance(orders, DeltaSink) and isinstance(clicks, DeltaSink)
    tokens = {app: sink.prepare([PIECE]) for app, sink in (("o", orders), ("c", clicks))}
    orders.write(batch(tokens["o"]))
    clicks.write(batch(tokens["c"]))
    assert rows(tmp_path / "delta") == 4


class TableMadeMeanwhile(DeltaSink):
    """No table at this writer's snapshot; another writer (an old owner of the same piece)
    creates it, with that piece, before this one writes."""

    def __init__(self, path: str, other: DeltaSink, tokens: Any) -> None:
        super().__init__(path)
        self.other, self.tokens, self.fired = other, tokens, False

    def _snapshot(self) -> Any:
        snapshot = super()._snapshot()
        if not self.fired:
            self.fired = True
            self.other.write(batch(self.tokens))
        return snapshot


def test_the_first_write_into_a_table_made_meanwhile_commits_its_piece_once(
    tmp_path: Path,
) -> None:
    """Appended without a snapshot, the write did not check the other's commit of its piece:
    4 rows for 2. Now it is made with ``mode="error"``, and when the table exists by then the
    write looks again and appends from what it finds (here: the piece, skipped)."""
    path = str(tmp_path / "delta")
    old_owner = DeltaSink(path)
    tokens = old_owner.prepare([PIECE])
    new_owner = TableMadeMeanwhile(path, old_owner, tokens)
    new_owner.write(batch(tokens))  # refused as "already exists": reads the table, skips it
    assert rows(tmp_path / "delta") == 2


def test_a_retired_version_is_never_committed_late_nor_given_again(tmp_path: Path) -> None:
    """A batch dead-lettered while a write of its version might still commit (an earlier
    tenure's, hung): retired, that write commits nothing, and the next batch gets the next
    version (before, it got the same one and was skipped as committed: its records nowhere)."""
    path = str(tmp_path / "delta")
    sink = DeltaSink(path)
    sink.write(batch({}, "shardId-9"))  # the table exists
    hung = sink.prepare([PIECE])  # version 1: its write hangs, the batch is dead-lettered
    sink.retire_tokens(batch(hung))
    late = DeltaSink(path)
    late.write(batch(hung))  # the hung write lands at last: already committed, skipped
    assert sink.prepare([PIECE]) == {"shardId-0": 2}
    assert rows(tmp_path / "delta") == 2  # shardId-9's only


class RetiredAfterOurRead(DeltaSink):
    """The hung write of a version: it read the table, then the batch was dead-lettered and its
    version retired by the lease's new owner, then it commits from what it read."""

    def __init__(self, path: str, retirer: DeltaSink, tokens: Any) -> None:
        super().__init__(path)
        self.retirer, self.tokens = retirer, tokens

    def _snapshot(self) -> Any:
        snapshot = super()._snapshot()
        self.retirer.retire_tokens(batch(self.tokens))
        return snapshot


def test_a_write_that_read_the_table_before_its_version_was_retired_commits_nothing(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "delta")
    DeltaSink(path).write(batch({}, "shardId-9"))  # the table exists
    retirer = DeltaSink(path)
    tokens = retirer.prepare([PIECE])
    hung = RetiredAfterOurRead(path, retirer, tokens)
    with pytest.raises(deltalake.exceptions.CommitFailedError, match="Concurrent transaction"):
        hung.write(batch(tokens))
    assert rows(tmp_path / "delta") == 2 and retirer.prepare([PIECE]) == {"shardId-0": 2}


def test_the_sinks_table_objects_are_loaded_afresh_after_a_bounded_number_of_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One DeltaTable object kept and updated at every prepare and write grew ~50 KB and took
    more CPU at each commit (bench/results/delta-table-refresh.md): a daemon's driver grew for
    weeks. Each is loaded afresh after DELTA_TABLE_UPDATES updates; every piece still commits
    once, at its version."""
    from kclpy_spark.spark import sinks

    loads: list[int] = []

    class CountedTable(deltalake.DeltaTable):  # type: ignore[misc, name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            loads.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(deltalake, "DeltaTable", CountedTable)
    monkeypatch.setattr(sinks, "DELTA_TABLE_UPDATES", 3)
    path = str(tmp_path / "delta")
    sink = DeltaSink(path)
    sink.write(batch({}, "shardId-9"))  # makes the table
    loads.clear()  # counted from here: making it loads objects too
    for n in range(1, 13):
        key = PieceKey("shardId-0", ExtendedSequenceNumber(str(2 * n)),
                       ExtendedSequenceNumber(str(2 * n + 1)))  # fmt: skip
        tokens = sink.prepare([Piece(key, "shardId-0", 2)])
        assert tokens == {"shardId-0": n}
        sink.write(SinkBatch(n, (Piece(key, "shardId-0", 2),), batch({}).table, tokens=tokens))
    # 12 prepares and 12 writes, each object updated at most 3 times between loads
    assert 6 <= len(loads) <= 8, len(loads)  # kept for ever: 0 or 1
    assert rows(tmp_path / "delta") == 2 + 12 * 2
    assert sink.committed_version("shardId-0") == 12


def test_a_table_not_found_on_a_reload_is_an_error_not_a_first_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reload of a table the sink had seen that found no log (a storage or mount hiccup) was
    taken for "no table yet": the lease's next version was 1, the write's own snapshot (at
    version 3) skipped the piece as committed, and the batch was acknowledged with its records
    written nowhere. It is a retriable error now; once the table is found again the piece
    commits at its version."""
    from kclpy_spark.spark import sinks

    sink = DeltaSink(str(tmp_path / "delta"))
    for _ in range(3):
        sink.write(batch(sink.prepare([PIECE])))
    real = deltalake.DeltaTable
    hiccups = [deltalake.exceptions.TableNotFoundError("no files in log segment")]

    def loaded(*args: Any, **kwargs: Any) -> Any:
        if hiccups:
            raise hiccups.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(deltalake, "DeltaTable", loaded)
    sink._shared._updates = sinks.DELTA_TABLE_UPDATES  # due for a reload
    with pytest.raises(sinks.DeltaTableGoneError, match="not found any more"):
        sink.prepare([PIECE])
    tokens = sink.prepare([PIECE])
    assert tokens == {"shardId-0": 4}
    sink.write(batch(tokens))
    assert rows(tmp_path / "delta") == 4 * 2


def test_a_retry_after_one_of_its_leases_moved_on_writes_the_others(tmp_path: Path) -> None:
    """A batch of two leases failed its first attempt; meanwhile one lease moved, and its new
    owner re-formed that piece and committed the next one too. The retry skips that piece (the
    table is past its version) and writes the other lease's: refused instead, the whole batch
    failed, and the other lease's records went to the dead letter or parked."""
    sink = DeltaSink(str(tmp_path / "delta"))
    moved, kept = piece("shardId-0"), piece("shardId-1")
    for _ in range(2):  # the new owner: the re-formed piece at 1, its next one at 2
        sink.write(batch(sink.prepare([moved])))
    rows_of = [*batch({}, "shardId-0").table.to_pylist(), *batch({}, "shardId-1").table.to_pylist()]
    retry = SinkBatch(7, (moved, kept), pa.Table.from_pylist(rows_of, schema=SCHEMA),
                      tokens={"shardId-0": 1, "shardId-1": 1})  # fmt: skip
    sink.write(retry)
    assert sink.committed_versions(["shardId-0", "shardId-1"]) == {"shardId-0": 2, "shardId-1": 1}
    assert rows(tmp_path / "delta") == 2 * 2 + 2


def test_a_table_removed_under_the_sink_fails_its_writes_until_it_is_back(tmp_path: Path) -> None:
    """A removed table failed every update of the sink's kept table objects, and they were never
    loaded afresh: every write failed until the process restarted, even once another worker had
    made the table again. Now the next use loads it afresh: not found (the writes fail, never
    taken for a first write), then found again once it is back."""
    import shutil

    from kclpy_spark.spark import sinks

    path = tmp_path / "delta"
    sink = DeltaSink(str(path))
    for _ in range(2):
        sink.write(batch(sink.prepare([PIECE])))
    shutil.rmtree(path)
    failures = 0
    for _ in range(3):  # the failed update, then fresh loads that find nothing
        with pytest.raises(Exception) as raised:
            sink.prepare([PIECE])
        failures += isinstance(raised.value, sinks.DeltaTableGoneError)
    assert failures >= 2
    other = DeltaSink(str(path))  # another worker makes it again
    other.write(batch(other.prepare([piece("shardId-5")]), "shardId-5"))
    assert sink.prepare([PIECE]) == {"shardId-0": 1}
