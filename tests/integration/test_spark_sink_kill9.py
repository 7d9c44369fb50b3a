"""kill -9 of a worker in the middle of a sink write, then a restart: nothing is lost and the
replayed batch is not duplicated in the idempotent sinks (Parquet and Delta).

The worker is a real daemon process (``kclpy-spark run --config`` with a ``[sink]`` table) with
local Spark. Its sink writes Parquet, then Delta; the first write
stalls between the two, and the test kills the process group (Python and its JVM) there: the batch
is in the Parquet output, not in Delta, and not checkpointed (its pending checkpoint is set).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from spark_e2e import (
    OUT_ENV,
    STALL_ENV,
    STALL_FROM_ENV,
    create_stream,
    kinesis_client,
    put,
    written,
)

from checkpoint.base.errors import ResourceNotFoundError
from checkpoint.stores.sqlite import SQLiteLeaseTable
from kclpy_spark.spark.pieces import PendingState

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORDS = 400


def start_worker(config: Path, out: Path, log: Path, stall: Path | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    env[OUT_ENV] = str(out)
    env.pop(STALL_ENV, None)
    if stall is not None:
        env[STALL_ENV] = str(stall)
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "kclpy_spark.cli", "run", "--config", str(config)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill -9 takes the JVM too
        )


def worker_toml(stream: str, endpoint: str, db: Path) -> str:
    """The worker part of a test's config file (the test adds its ``[sink]``)."""
    return (
        f'application_name = "{stream}"\nstream_name = "{stream}"\n'
        f'endpoint_url = "{endpoint}"\ninitial_position = "TRIM_HORIZON"\n'
        f'lease_store = "sqlite:{db}"\nfailover_time = 3.0\n'
        "idle_time_between_reads = 0.2\nshard_sync_interval = 1.0\n\n"
    )


def wait_for(
    condition: Any,
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    progress: Any = None,
) -> None:
    """Poll ``condition`` until true. With ``progress`` (a callable whose value changes as work
    gets done), ``timeout`` counts from the last change, up to four times ``timeout`` in all: a
    stalled worker fails as before, a slow one on a loaded machine is waited for."""
    start = last_change = time.monotonic()
    seen = progress() if progress else None
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(
                f"worker exited ({proc.returncode}) before {what}:\n"
                + log.read_text(errors="replace")[-4000:]
            )
        now = time.monotonic()
        if progress is not None and (value := progress()) != seen:
            seen, last_change = value, now
        if now - last_change > timeout or now - start > 4 * timeout:
            raise AssertionError(
                f"timed out waiting for {what} ({now - start:.0f} s, progress {seen}, last "
                f"change {now - last_change:.0f} s ago):\n"
                + log.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.3 if progress is None else 1.0)


def delta_sequences(path: Path) -> dict[str, list[str]]:
    from deltalake import DeltaTable

    if not (path / "_delta_log").exists():
        return {}
    table = DeltaTable(str(path)).to_pyarrow_table(columns=["shard_id", "sequence_number"])
    out: dict[str, list[str]] = {}
    for shard, seq in zip(
        table.column("shard_id").to_pylist(),
        table.column("sequence_number").to_pylist(),
        strict=True,
    ):
        out.setdefault(shard, []).append(seq)
    return out


def _all_in_both(out: Path, produced: dict[str, list[str]]) -> bool:
    """Every record produced is in the Parquet output and in the Delta table."""
    p, d = written(out), delta_sequences(out / "delta")
    return all(
        set(seqs) <= set(p.get(s, [])) and set(seqs) <= set(d.get(s, []))
        for s, seqs in produced.items()
    )


def _in_both(out: Path) -> tuple[int, int]:
    """Pieces in the Parquet output and commits in the Delta log (progress while waiting): two
    folder listings, where reading the records again would double each poll's cost."""
    return (
        sum(1 for _ in (out / "parquet").glob("kcl_piece=*")),
        sum(1 for _ in (out / "delta" / "_delta_log").glob("*.json")),
    )


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_kill9_during_a_write_then_restart_loses_nothing_and_duplicates_nothing(
    localstack_endpoint: str, unique_name: str, tmp_path: Path, read_on: str
) -> None:
    """Read on the driver or on Spark's executors (then the restart reads the stalled batch's
    pieces again on the executors, pinned to their recorded last records)."""
    stream = unique_name
    kinesis = kinesis_client(localstack_endpoint)
    create_stream(kinesis, stream, 2)
    try:
        produced = put(kinesis, stream, 0, RECORDS)
        out, db = tmp_path / "out", tmp_path / "leases.db"
        config = tmp_path / "worker.toml"
        config.write_text(
            worker_toml(stream, localstack_endpoint, db)
            + '[sink]\nsink = "spark_e2e:StallingSink"\nspark_target = "local[2]"\n'
            "max_records = 150\nmax_wait = 0.5\nmax_attempts = 3\nretry_base_delay = 0.1\n"
            f'read_on = "{read_on}"\n'
            "writers = 1\n"  # one write at a time: nothing is checkpointed while it stalls
            '[sink.spark_conf]\n"spark.sql.shuffle.partitions" = "2"\n'
        )
        log = tmp_path / "worker.log"
        stall = tmp_path / "stalled.json"

        first = start_worker(config, out, log, stall)
        try:
            wait_for(stall.exists, 120, "the first write to stall", first, log)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # kill -9, Python and JVM
            first.wait(30)
        stalled = set(json.loads(stall.read_text()))
        on_disk = {p.name.split("=", 1)[1] for p in (out / "parquet").glob("kcl_piece=*")}
        assert stalled <= on_disk, "the stalled batch should be in the Parquet output"
        assert delta_sequences(out / "delta") == {}
        leases = SQLiteLeaseTable(db, namespace=stream).list_leases()
        assert any(x.pending_checkpoint is not None for x in leases)
        assert all(x.checkpoint.is_sentinel for x in leases)  # nothing was checkpointed

        second = start_worker(config, out, log, None)
        try:
            wait_for(lambda: _all_in_both(out, produced), 150,
                     "every record in Parquet and Delta", second, log,
                     progress=lambda: _in_both(out))  # fmt: skip
        finally:
            os.killpg(second.pid, signal.SIGTERM)  # graceful: flush, checkpoint, release
            assert second.wait(60) == 0, log.read_text(errors="replace")[-4000:]
        for name, got in (("parquet", written(out)), ("delta", delta_sequences(out / "delta"))):
            for shard, seqs in produced.items():
                assert sorted(got[shard], key=int) == sorted(seqs, key=int), f"{name} {shard}"
        leases = SQLiteLeaseTable(db, namespace=stream).list_leases()
        for lease in leases:
            assert lease.pending_checkpoint is None
            assert lease.checkpoint.sequence_number == max(produced[lease.shard_id], key=int)
            # Released: the killed worker's status record is still fresh for two failover
            # times after the kill, but the second worker saw its leases expire, so its stop
            # hands it nothing (Suspects; it did before, and the lease waited out its expiry).
            assert lease.lease_owner is None, lease.lease_owner
        text = log.read_text(errors="replace")
        assert "already written; skipped" in text  # the replay was recognised, not rewritten
    finally:
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_kill9_with_a_later_batch_written_before_an_earlier_one_reforms_both_exactly(
    localstack_endpoint: str,
    unique_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_on: str,
) -> None:
    """Pipelined batches (2 writers, 2 batches of a lease in flight): the first batch stalls
    before its write while the next batch of the same lease is written; kill -9 then. The
    checkpoint has not moved (it never passes the unwritten batch), the pending checkpoint lists
    both pieces, and after a restart every record is in the Parquet output exactly once (the
    piece written ahead is re-formed identically and skipped)."""
    stream = unique_name
    kinesis = kinesis_client(localstack_endpoint)
    create_stream(kinesis, stream, 1)
    try:
        produced = put(kinesis, stream, 0, 300)
        [seqs] = produced.values()
        monkeypatch.setenv(STALL_FROM_ENV, seqs[0])  # the lease's first batch stalls
        out, db = tmp_path / "out", tmp_path / "leases.db"
        config = tmp_path / "worker.toml"
        config.write_text(
            worker_toml(stream, localstack_endpoint, db)
            + '[sink]\nsink = "spark_e2e:OvertakingSink"\nspark_target = "local[2]"\n'
            'scope = "lease"\nwriters = 2\nbatches_in_flight = 2\n'
            "max_records = 100\nmax_wait = 0.5\nmax_attempts = 3\nretry_base_delay = 0.1\n"
            f'read_on = "{read_on}"\n'
        )
        log = tmp_path / "worker.log"
        marker = tmp_path / "overtaken.json"

        first = start_worker(config, out, log, marker)
        try:
            wait_for(marker.exists, 120, "a batch to overtake the stalled one", first, log)
            # What an operator sees meanwhile: two batches of the lease out (kclpy-spark status).
            wait_for(lambda: _sink_in_flight(config) == [2], 60, "status: 2 out", first, log)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # kill -9, Python and JVM
            first.wait(30)
        seen = json.loads(marker.read_text())
        on_disk = {p.name.split("=", 1)[1] for p in (out / "parquet").glob("kcl_piece=*")}
        assert set(seen["overtook"]) <= on_disk and not set(seen["stalled"]) & on_disk
        [lease] = SQLiteLeaseTable(db, namespace=stream).list_leases()
        assert lease.checkpoint.is_sentinel  # never past the batch that was not written
        state = PendingState.decode(lease.pending_checkpoint_state)
        assert state is not None and len(state.pieces) == 2, lease.pending_checkpoint_state
        listed = [p.piece_of(lease.lease_key) for p in state.pieces]
        assert [k.piece_id for k in listed if k] == seen["stalled"] + seen["overtook"]

        second = start_worker(config, out, log, None)
        try:

            def all_written() -> bool:
                got = written(out)
                return all(set(seqs) <= set(got.get(s, [])) for s, seqs in produced.items())

            wait_for(all_written, 150, "every record in Parquet", second, log,
                     progress=lambda: _in_both(out))  # fmt: skip
        finally:
            os.killpg(second.pid, signal.SIGTERM)  # graceful: flush, checkpoint, release
            assert second.wait(60) == 0, log.read_text(errors="replace")[-4000:]
        got = written(out)
        for shard, seqs in produced.items():
            assert sorted(got[shard], key=int) == sorted(seqs, key=int), shard
        [lease] = SQLiteLeaseTable(db, namespace=stream).list_leases()
        assert lease.pending_checkpoint is None
        assert lease.checkpoint.sequence_number == max(produced[lease.shard_id], key=int)
        assert "already written; skipped" in log.read_text(errors="replace")
    finally:
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)


def test_kill9_between_two_sinks_then_restart_each_sink_gets_every_record(
    localstack_endpoint: str, unique_name: str, tmp_path: Path
) -> None:
    """``[[sinks]]``: Parquet, then a function. The function's first call stalls after Parquet
    wrote the batch; kill -9 there. Nothing is checkpointed (the function never acknowledged);
    after a restart the re-formed batch is skipped by Parquet (same pieces) and given to the
    function again, and each sink holds every record."""
    stream = unique_name
    kinesis = kinesis_client(localstack_endpoint)
    create_stream(kinesis, stream, 2)
    try:
        produced = put(kinesis, stream, 0, 300)
        out, db = tmp_path / "out", tmp_path / "leases.db"
        out.mkdir()
        config = tmp_path / "worker.toml"
        config.write_text(
            worker_toml(stream, localstack_endpoint, db) + '[sink]\nspark_target = "local[2]"\n'
            "max_records = 100\nmax_wait = 0.5\nmax_attempts = 3\nretry_base_delay = 0.1\n"
            "writers = 1\n"  # one batch at a time: nothing is checkpointed while it stalls
            f'[[sinks]]\nsink = "parquet:{out / "parquet"}"\n'
            '[[sinks]]\nsink = "spark_e2e:stall_then_note"\n'
        )
        log = tmp_path / "worker.log"
        stall = tmp_path / "stalled.json"

        first = start_worker(config, out, log, stall)
        try:
            wait_for(stall.exists, 120, "the function's first call to stall", first, log)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # kill -9, Python and JVM
            first.wait(30)
        stalled = set(json.loads(stall.read_text()))
        on_disk = {p.name.split("=", 1)[1] for p in (out / "parquet").glob("kcl_piece=*")}
        assert stalled <= on_disk, "Parquet (the first sink) had written the stalled batch"
        leases = SQLiteLeaseTable(db, namespace=stream).list_leases()
        assert all(x.checkpoint.is_sentinel for x in leases)  # the function never acknowledged
        pending = [PendingState.decode(x.pending_checkpoint_state) for x in leases]
        tokens = [p.token for state in pending if state for p in state.pieces]
        assert tokens and all(set(t["by_sink"]) == {"parquet", "stall_then_note"} for t in tokens)

        second = start_worker(config, out, log, None)
        notes = out / "function.jsonl"
        try:

            def all_in_both() -> bool:
                got = written(out)
                noted = _noted(notes)
                return sum(noted.values()) == 300 and all(
                    set(seqs) <= set(got.get(s, [])) for s, seqs in produced.items()
                )

            wait_for(all_in_both, 150, "every record in both sinks", second, log,
                     progress=lambda: (_in_both(out), _noted(notes)))  # fmt: skip
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            assert second.wait(60) == 0, log.read_text(errors="replace")[-4000:]
        got = written(out)
        for shard, seqs in produced.items():
            assert sorted(got[shard], key=int) == sorted(seqs, key=int), shard
        assert stalled <= set(_noted(notes))  # the function got the stalled pieces again
        for lease in SQLiteLeaseTable(db, namespace=stream).list_leases():
            assert lease.pending_checkpoint is None
            assert lease.checkpoint.sequence_number == max(produced[lease.shard_id], key=int)
        assert "already written; skipped" in log.read_text(errors="replace")
    finally:
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)


def _sink_in_flight(config: Path) -> list[int | None]:
    """Each lease's sink batches in flight as ``kclpy-spark status --json`` shows them."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "kclpy_spark.cli", "status", "--config", str(config), "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [row["sink_in_flight"] for row in json.loads(done.stdout)["leases"]]


def _noted(path: Path) -> dict[str, int]:
    """Rows by piece id the function noted (a piece given twice counts once)."""
    if not path.exists():
        return {}
    return dict(json.loads(line) for line in path.read_text().splitlines() if line)


def _table_state(db: Path, stream: str) -> dict[str, tuple[Any, bytes | None]]:
    """Each lease's checkpoint and pending state, by lease key (none before the worker made the
    table: its file comes a moment before its tables)."""
    if not db.exists():
        return {}
    try:
        leases = SQLiteLeaseTable(db, namespace=stream).list_leases()
    except ResourceNotFoundError:
        return {}
    return {x.lease_key: (x.checkpoint, x.pending_checkpoint_state) for x in leases}


def _both_leases_in_flight(db: Path, stream: str, before: dict[str, Any]) -> bool:
    """Both leases have pieces out (a pending checkpoint naming pieces), and the pending
    checkpoints are not all those left ``before`` the worker started: worker-scope batches of
    this worker's were being written, or written and not yet acknowledged."""
    now = _table_state(db, stream)
    states = [PendingState.decode(raw) for _, raw in now.values()]
    fresh = any(now[key] != before.get(key) for key in now)
    return len(now) == 2 and fresh and all(s is not None and s.pieces for s in states)


@pytest.mark.parametrize("read_on", ["driver", "executors"])
def test_kill9_with_the_built_in_sinks_at_their_defaults_writes_each_record_once(
    localstack_endpoint: str, unique_name: str, tmp_path: Path, read_on: str
) -> None:
    """``parquet:`` and ``delta:`` with nothing else set: worker scope (a batch holds pieces of
    both shards), two writers and two batches of a lease in flight. Records flow all along; the
    worker is killed with -9 twice while both leases have pieces out, and restarted; every record
    is in each sink exactly once (docs/guarantees.md, "exactly once in any scope")."""
    import threading

    stream = unique_name
    kinesis = kinesis_client(localstack_endpoint)
    create_stream(kinesis, stream, 2)
    produced: dict[str, list[str]] = {}
    stop = threading.Event()

    def produce() -> None:
        at = 0
        while not stop.is_set():
            for shard, seqs in put(kinesis, stream, at, 20).items():
                produced.setdefault(shard, []).extend(seqs)
            at += 20
            stop.wait(0.2)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        out, db = tmp_path / "out", tmp_path / "leases.db"
        config = tmp_path / "worker.toml"
        config.write_text(
            worker_toml(stream, localstack_endpoint, db)
            + '[sink]\nspark_target = "local[2]"\nmax_records = 60\nmax_wait = 0.3\n'
            f'read_on = "{read_on}"\n'
            f'[[sinks]]\nsink = "parquet:{out / "parquet"}"\n'
            f'[[sinks]]\nsink = "delta:{out / "delta"}"\n'
        )
        log = tmp_path / "worker.log"
        producer.start()
        caught = 0  # kills after which both leases still had this worker's pieces pending
        for _ in range(2):
            before = _table_state(db, stream)
            worker = start_worker(config, out, log, None)
            try:

                def acknowledged(before: dict[str, Any] = before) -> bool:  # a checkpoint moved
                    now = _table_state(db, stream)
                    return any(now[k][0] != before.get(k, (None,))[0] for k in now)

                def in_flight(before: dict[str, Any] = before) -> bool:
                    return _both_leases_in_flight(db, stream, before)

                wait_for(acknowledged, 120, "a checkpoint", worker, log)
                wait_for(in_flight, 60, "both leases out", worker, log)
            finally:
                os.killpg(worker.pid, signal.SIGKILL)  # kill -9, Python and JVM
                worker.wait(30)
            caught += _both_leases_in_flight(db, stream, before)
        stop.set()
        producer.join(30)
        assert caught >= 1, "no kill came while batches of both leases were out"
        last = start_worker(config, out, log, None)
        try:
            wait_for(lambda: _all_in_both(out, produced), 150,
                     "every record in Parquet and Delta", last, log,
                     progress=lambda: _in_both(out))  # fmt: skip
        finally:
            os.killpg(last.pid, signal.SIGTERM)
            assert last.wait(60) == 0, log.read_text(errors="replace")[-4000:]
        assert sum(map(len, produced.values())) > 0
        for name, got in (("parquet", written(out)), ("delta", delta_sequences(out / "delta"))):
            for shard, seqs in produced.items():
                assert sorted(got[shard], key=int) == sorted(seqs, key=int), f"{name} {shard}"
        # The killed batches were formed again from their pending checkpoints (whether a sink
        # had written them by the kill, and so skips them, is the kill's timing).
        assert "re-forming the range" in log.read_text(errors="replace")
    finally:
        stop.set()
        kinesis.delete_stream(StreamName=stream, EnforceConsumerDeletion=True)
