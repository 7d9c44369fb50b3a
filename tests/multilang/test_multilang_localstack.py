"""``kclpy-spark multilang`` against LocalStack, as a real daemon process: a hand-written protocol
script and an amazon_kclpy application (as child processes and in-process) each process every
record, checkpoint, and survive a split; a child that stops answering is timed out and its lease
released."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from multilang_helpers import (
    KCLPY_APP,
    PROTOCOL_SCRIPT,
    create_stream,
    daemon,
    events_named,
    pid_alive,
    produce,
    properties_text,
    read_events,
    read_records,
    split_first_shard,
    wait_for,
)

from checkpoint.sequence import ExtendedSequenceNumber
from checkpoint.stores.dynamodb import DynamoDBLeaseTable

FIRST, SECOND = range(0, 12), range(12, 24)


def _split_scenario(
    kinesis: Any,
    dynamodb: Any,
    endpoint: str,
    name: str,
    workdir: Path,
    executable: str,
    *args: str,
) -> tuple[list[dict[str, Any]], str, str]:
    """Run the daemon through a split; returns (records written, parent shard id, daemon log)."""
    output = workdir / "out"
    create_stream(kinesis, name, 1)
    produced: dict[str, list[str]] = defaultdict(list)

    def put(numbers: range) -> None:
        for shard, seqs in produce(kinesis, name, numbers).items():
            produced[shard].extend(seqs)

    def processed() -> set[str]:
        return {r["data"] for r in read_records(output)}

    put(FIRST)
    props = properties_text(name=name, endpoint=endpoint, executable=executable)
    with daemon(workdir, props, output, *args) as running:
        wait_for("the first records", lambda: {f"n{n}" for n in FIRST} <= processed(), 90)
        parent = split_first_shard(kinesis, name)
        put(SECOND)
        wait_for("the records after the split", lambda: {f"n{n}" for n in SECOND} <= processed(),
                 120)  # fmt: skip
        table = DynamoDBLeaseTable(dynamodb, name, create_if_missing=False)

        def checkpointed() -> bool:
            leases = {x.shard_id: x for x in table.list_leases()}
            parent_done = parent not in leases or leases[parent].checkpoint.is_shard_end
            children_done = all(
                leases[shard].checkpoint == ExtendedSequenceNumber(seqs[-1])
                for shard, seqs in produced.items()
                if shard != parent and shard in leases
            )
            return parent_done and children_done and len(produced) == 3

        wait_for("every shard's checkpoint at its last record", checkpointed, 60)
        assert running.stop() == 0
        log = running.text()
    lines = read_records(output)
    counts = Counter(r["data"] for r in lines)
    assert set(counts) == {f"n{n}" for n in (*FIRST, *SECOND)}
    assert max(counts.values()) == 1, "records were delivered twice"
    first_t: dict[str, float] = {}
    last_t: dict[str, float] = defaultdict(float)
    for line in lines:
        first_t[line["shard"]] = min(first_t.get(line["shard"], line["t"]), line["t"])
        last_t[line["shard"]] = max(last_t[line["shard"]], line["t"])
    children = [s for s in produced if s != parent]
    assert len(children) == 2
    for child in children:
        assert first_t[child] >= last_t[parent], f"{child} started before its parent ended"
    assert "worker w1 stopped" in log
    return lines, parent, log


def test_protocol_script_processes_checkpoints_and_survives_a_split(
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    stream_name: str,
    tmp_path: Path,
) -> None:
    executable = f"{sys.executable} {PROTOCOL_SCRIPT}"
    _, parent, log = _split_scenario(
        kinesis_client, dynamodb_client, localstack_endpoint, stream_name, tmp_path, executable
    )
    events = read_events(tmp_path / "out")
    # Each checkpoint the script asked for was made; shard end was checkpointed as SHARD_END.
    assert all(e["error"] is None for e in events if e["event"] == "checkpoint")
    assert [e["shard"] for e in events if e["event"] == "shardEnded"] == [parent]
    # One child process per lease, all gone after the graceful shutdown.
    pids = {e["pid"] for e in events}
    assert len(pids) == 3 and not any(pid_alive(pid) for pid in pids)
    assert {e["pid"] for e in events if e["event"] == "exit"} == pids
    assert f"shard {parent}: initialized {parent} at TRIM_HORIZON" in log  # its stderr
    assert f"shard {parent}: skipping unexpected line on the child's stdout" in log


@pytest.mark.parametrize("mode", ["subprocess", "in-process"])
def test_amazon_kclpy_app_processes_checkpoints_and_survives_a_split(
    amazon_kclpy: ModuleType,
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    stream_name: str,
    tmp_path: Path,
    mode: str,
) -> None:
    executable = f"{sys.executable} {KCLPY_APP}"
    args = ("--in-process",) if mode == "in-process" else ()
    lines, parent, log = _split_scenario(
        kinesis_client, dynamodb_client, localstack_endpoint, stream_name, tmp_path, executable,
        *args,
    )  # fmt: skip
    events = read_events(tmp_path / "out")
    assert not [e for e in events if e["event"] == "checkpoint_error"]
    assert [e["shard"] for e in events if e["event"] == "shard_ended"] == [parent]
    pids = {line["pid"] for line in lines}
    if mode == "in-process":
        assert "in-process path" in log and "started child process" not in log
        assert len(pids) == 1  # the daemon itself
    else:
        assert "subprocess path" in log
        assert len(pids) == 3 and not any(pid_alive(pid) for pid in pids)


def test_a_silent_child_is_timed_out_and_its_lease_released(
    kinesis_client: Any,
    dynamodb_client: Any,
    localstack_endpoint: str,
    stream_name: str,
    tmp_path: Path,
) -> None:
    name = stream_name
    output = tmp_path / "out"
    create_stream(kinesis_client, name, 1)
    produce(kinesis_client, name, range(3))
    props = properties_text(
        name=name,
        endpoint=localstack_endpoint,
        executable=f"{sys.executable} {PROTOCOL_SCRIPT}",
        extra={
            "timeoutInSeconds": "2",
            # kclpy-spark's failure policy: park the lease after the first failed batch.
            "kclpyspark.max_processing_attempts": "1",
            "kclpyspark.park_duration": "600",
        },
    )
    with daemon(tmp_path, props, output, env={"SAMPLE_HANG_ON": "processRecords"}) as running:
        table = DynamoDBLeaseTable(dynamodb_client, name, create_if_missing=False)

        def hanging() -> list[dict[str, Any]]:
            return events_named(output, "hanging")

        wait_for("the child to stop answering", lambda: bool(hanging()), 60)

        def released() -> bool:
            leases = table.list_leases()
            return bool(leases) and all(
                x.lease_owner is None and x.closed_until is not None for x in leases
            )

        wait_for("the lease to be released", released, 60)
        assert not pid_alive(hanging()[0]["pid"])
        assert running.proc.poll() is None  # the daemon itself keeps running
        assert running.stop() == 0
        log = running.text()
    assert "timeoutInSeconds" in log and "killed child process" in log
    assert "parked" in log
    assert not read_records(output)


def test_an_app_that_asks_for_empty_record_lists_gets_them_on_a_quiet_shard(
    amazon_kclpy: ModuleType,
    kinesis_client: Any,
    localstack_endpoint: str,
    stream_name: str,
    tmp_path: Path,
) -> None:
    """callProcessRecordsEvenForEmptyRecordList = true: once its records are read, the child
    is sent processRecords with no records after each empty read, with the shard's lag."""
    output = tmp_path / "out"
    create_stream(kinesis_client, stream_name, 1)
    produce(kinesis_client, stream_name, range(2))
    props = properties_text(
        name=stream_name,
        endpoint=localstack_endpoint,
        executable=f"{sys.executable} {KCLPY_APP}",
        extra={"callProcessRecordsEvenForEmptyRecordList": "true"},
    )
    with daemon(tmp_path, props, output) as running:
        wait_for("two empty record lists", lambda: len(events_named(output, "no_records")) >= 2, 60)
        assert running.stop() == 0
        log = running.text()
    assert {r["data"] for r in read_records(output)} == {"n0", "n1"}
    assert all(isinstance(e["lag"], int) for e in events_named(output, "no_records"))
    assert "processRecords after empty reads too" in log
    assert "not supported" not in log
