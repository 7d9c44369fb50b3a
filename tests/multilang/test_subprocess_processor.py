"""SubprocessProcessor with real child processes and a real Checkpointer (memory lease table):
the protocol, checkpoint errors, stray lines, stderr, timeouts and child restarts. No LocalStack."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from multilang_helpers import (
    KCLPY_APP,
    PROTOCOL_SCRIPT,
    HeldShard,
    held_shard,
    pid_alive,
    read_events,
    read_records,
    records,
    seq,
)

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import SHARD_END, TRIM_HORIZON, ExtendedSequenceNumber
from kclpy_spark.multilang.child import ChildSpec, resolve_command
from kclpy_spark.multilang.subprocess_processor import (
    ChildFailedError,
    ChildTimeoutError,
    SubprocessProcessor,
)
from kclpy_spark.processor import (
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RedeliverFromCheckpoint,
    ShardEndedInput,
    ShutdownRequestedInput,
)


def spec(tmp_path: Path, script: Path = PROTOCOL_SCRIPT, **env: str) -> ChildSpec:
    output = tmp_path / "out"
    output.mkdir(exist_ok=True)
    return ChildSpec(
        command=(sys.executable, str(script)),
        cwd=tmp_path,
        timeout=10.0,
        shutdown_grace=5.0,
        env={**os.environ, "KCLPY_SPARK_SAMPLE_OUTPUT": str(output), **env},
    )


async def start(processor: SubprocessProcessor, shard: HeldShard) -> None:
    checkpoint = shard.stored()
    await processor.initialize(
        InitializeInput(shard.shard_id, checkpoint.sequence_number, checkpoint.sub_sequence_number)
    )


async def deliver(processor: SubprocessProcessor, shard: HeldShard, start_at: int, n: int) -> None:
    batch = records(start_at, n)
    shard.deliver(batch)
    await processor.process_records(ProcessRecordsInput(batch, 0, shard.checkpointer))


async def kill_child(processor: SubprocessProcessor) -> None:
    """Kill the running child, as an OOM kill would, and wait for it to be gone."""
    proc = processor._proc
    assert proc is not None
    proc.kill()
    await proc.wait()


def child_pid(processor: SubprocessProcessor) -> int:
    proc = processor._proc
    assert proc is not None
    return proc.pid


@pytest.mark.parametrize("app", ["protocol_script", "amazon_kclpy_app"])
def test_records_checkpoints_shard_end_and_exit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, app: str, request: pytest.FixtureRequest
) -> None:
    if app == "amazon_kclpy_app":
        request.getfixturevalue("amazon_kclpy")
    script = PROTOCOL_SCRIPT if app == "protocol_script" else KCLPY_APP
    caplog.set_level(logging.INFO)
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, script))

    async def scenario() -> int:
        await start(processor, shard)
        pid = child_pid(processor)
        await deliver(processor, shard, 1, 3)
        assert shard.stored() == ExtendedSequenceNumber(seq(3))
        await deliver(processor, shard, 4, 2)
        assert shard.stored() == ExtendedSequenceNumber(seq(5))
        shard.checkpointer.mark_shard_end()
        await processor.shard_ended(ShardEndedInput(shard.checkpointer))
        return pid

    pid = asyncio.run(scenario())
    assert shard.stored() == SHARD_END
    assert not pid_alive(pid)  # its input ended and it exited
    out = read_records(tmp_path / "out")
    assert [r["data"] for r in out] == ["r1", "r2", "r3", "r4", "r5"]
    assert [r["arrival"] for r in out] == [1_700_000_000_000 + n for n in range(1, 6)]
    messages = [r.getMessage() for r in caplog.records]
    assert any("exited with status 0" in m for m in messages)
    if app == "protocol_script":
        stray = [m for m in messages if "skipping unexpected line on the child's stdout" in m]
        assert stray and "shardId-000000000000" in stray[0] and "stray line" in stray[0]
        child = [r for r in caplog.records if r.name == "kclpy_spark.multilang.child"]
        assert any(
            r.getMessage() == "shard shardId-000000000000: initialized shardId-000000000000 at "
            "TRIM_HORIZON"
            for r in child
        )


def test_an_amazon_kclpy_child_is_sent_an_empty_record_list_with_its_lag(
    tmp_path: Path, amazon_kclpy: ModuleType
) -> None:
    """callProcessRecordsEvenForEmptyRecordList: the consumer calls process_records with no
    records; the child gets a processRecords message with an empty list and the read's lag,
    and what it was given last stays what it holds."""
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, KCLPY_APP))

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)
        await processor.process_records(ProcessRecordsInput([], 1234, shard.checkpointer))
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    assert [(e["event"], e.get("lag")) for e in read_events(tmp_path / "out")] == [
        ("initialize", None),
        ("no_records", 1234),
        ("lease_lost", None),
    ]
    assert shard.stored() == ExtendedSequenceNumber(seq(2))


def test_a_failed_checkpoint_is_answered_with_the_error_name(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))

    async def scenario() -> None:
        await start(processor, shard)
        shard.holder.drop(shard.shard_id)  # the lease is lost: checkpoints must fail
        await deliver(processor, shard, 1, 2)
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    events = read_events(tmp_path / "out")
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoints == [
        {**checkpoints[0], "seq": seq(2), "sub": 0, "error": "ShutdownException"}
    ]
    assert [e["event"] for e in events][-2:] == ["leaseLost", "exit"]


def test_a_checkpoint_outside_the_delivered_range_is_illegal_argument(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))

    async def scenario() -> None:
        await start(processor, shard)
        batch = records(1, 2)
        shard.deliver(records(1, 1))  # the checkpointer was told only of the first record
        await processor.process_records(ProcessRecordsInput(batch, 0, shard.checkpointer))
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    [checkpoint] = [e for e in read_events(tmp_path / "out") if e["event"] == "checkpoint"]
    assert checkpoint["error"] == "IllegalArgumentException"


def test_shutdown_requested_then_lease_lost_then_end_of_input(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 1)
        await processor.shutdown_requested(ShutdownRequestedInput(shard.checkpointer))

    asyncio.run(scenario())
    names = [e["event"] for e in read_events(tmp_path / "out")]
    assert names == [
        "initialize",
        "processRecords",
        "checkpoint",
        "shutdownRequested",
        "checkpoint",
        "leaseLost",
        "exit",
    ]


def quick_from_now(processor: SubprocessProcessor) -> None:
    """A second's timeoutInSeconds from here on: the child's start (a Python process, a second
    or more under the suite's load) had the spec's own."""
    processor._spec = dataclasses.replace(processor._spec, timeout=1)


def test_a_silent_child_is_timed_out_and_killed(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, SAMPLE_HANG_ON="processRecords"))

    async def scenario() -> tuple[int, float]:
        await start(processor, shard)
        quick_from_now(processor)
        pid = child_pid(processor)
        began = time.monotonic()
        with pytest.raises(ChildTimeoutError, match="timeoutInSeconds"):
            await deliver(processor, shard, 1, 1)
        return pid, time.monotonic() - began

    pid, took = asyncio.run(scenario())
    assert 0.9 <= took < 5
    assert not pid_alive(pid)
    assert processor._proc is None


def test_stray_lines_do_not_restart_the_childs_timeout(tmp_path: Path) -> None:
    """timeoutInSeconds counts until the child's next message, not its next line: a hung app
    whose background thread keeps printing is still timed out."""
    shard = held_shard()
    chatty = spec(tmp_path, SAMPLE_HANG_ON="processRecords", SAMPLE_HANG_CHATTY="1")
    processor = SubprocessProcessor(chatty)

    async def scenario() -> float:
        await start(processor, shard)
        quick_from_now(processor)
        began = time.monotonic()
        with pytest.raises(ChildTimeoutError, match="timeoutInSeconds"):
            await asyncio.wait_for(deliver(processor, shard, 1, 1), 20)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 5
    assert processor._proc is None


def test_a_timed_out_child_takes_the_processes_it_started_with_it(tmp_path: Path) -> None:
    """An app started by a wrapper script that does not ``exec`` it: killing the wrapper alone
    would leave the hung app running, orphaned, each retry one more."""
    shard = held_shard()
    wrapper = tmp_path / "run_app.sh"
    wrapper.write_text(f'#!/bin/sh\n"{sys.executable}" "{PROTOCOL_SCRIPT}"\necho done\n')
    wrapper.chmod(0o755)
    wrapped = spec(tmp_path, SAMPLE_HANG_ON="processRecords")
    processor = SubprocessProcessor(ChildSpec(**{**wrapped.__dict__, "command": (str(wrapper),)}))

    async def scenario() -> None:
        await start(processor, shard)
        quick_from_now(processor)
        with pytest.raises(ChildTimeoutError):
            await deliver(processor, shard, 1, 1)

    asyncio.run(scenario())
    hung = [e["pid"] for e in read_events(tmp_path / "out") if e["event"] == "hanging"]
    assert len(hung) == 1
    deadline = time.monotonic() + 5
    while pid_alive(hung[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(hung[0]), "the app the wrapper started outlived the timeout"


def test_a_dead_child_is_replaced_for_the_next_batch(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))

    async def scenario() -> None:
        await start(processor, shard)
        await kill_child(processor)
        await deliver(processor, shard, 1, 2)  # a new child is started and initialized
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    assert processor.children_started == 2
    assert shard.stored() == ExtendedSequenceNumber(seq(2))
    inits = [e for e in read_events(tmp_path / "out") if e["event"] == "initialize"]
    assert len(inits) == 2 and inits[0]["pid"] != inits[1]["pid"]


def test_a_child_started_after_one_died_resumes_at_what_was_checkpointed(tmp_path: Path) -> None:
    """The new child's initialize said the tenure's start, though its predecessor had
    checkpointed since: an app that resumes from initialize's sequence number redid that work."""
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)  # the child checkpoints at record 2
        await kill_child(processor)
        await deliver(processor, shard, 3, 1)  # a new child is started and initialized
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    inits = [e for e in read_events(tmp_path / "out") if e["event"] == "initialize"]
    assert [e["seq"] for e in inits] == ["TRIM_HORIZON", seq(2)]
    assert shard.stored() == ExtendedSequenceNumber(seq(3))


def test_a_child_that_exits_mid_call_fails_the_call(tmp_path: Path) -> None:
    script = tmp_path / "quitter.py"
    script.write_text(
        "import sys, json\n"
        "line = sys.stdin.readline()\n"
        "print(json.dumps({'action': 'status', 'responseFor': 'initialize'}), flush=True)\n"
        "sys.stdin.readline()\n"
        "sys.exit(3)\n"
    )
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, script))

    async def scenario() -> None:
        await start(processor, shard)
        with pytest.raises(ChildFailedError, match=r"ended \(status 3\)"):
            await deliver(processor, shard, 1, 1)

    asyncio.run(scenario())


def test_a_status_for_the_wrong_action_is_a_protocol_error(tmp_path: Path) -> None:
    script = tmp_path / "confused.py"
    script.write_text(
        "import sys, json\n"
        "for line in sys.stdin:\n"
        "    print(json.dumps({'action': 'status', 'responseFor': 'initialize'}), flush=True)\n"
    )
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, script))

    async def scenario() -> None:
        await start(processor, shard)
        with pytest.raises(ChildFailedError, match="'initialize' while 'processRecords'"):
            await deliver(processor, shard, 1, 1)

    asyncio.run(scenario())
    assert processor._proc is None


def test_a_child_that_cannot_start(tmp_path: Path) -> None:
    shard = held_shard()
    missing = ChildSpec(command=(str(tmp_path / "missing"),), cwd=tmp_path)
    with pytest.raises(ChildFailedError, match="cannot start"):
        asyncio.run(start(SubprocessProcessor(missing), shard))


def test_cancelling_a_call_kills_the_child(tmp_path: Path) -> None:
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, SAMPLE_HANG_ON="processRecords"))

    async def scenario() -> int:
        await start(processor, shard)
        pid = child_pid(processor)
        task = asyncio.ensure_future(deliver(processor, shard, 1, 1))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid

    pid = asyncio.run(scenario())
    assert not pid_alive(pid)


def test_resolve_command(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text("print('hi')\n")
    # A .py script that is not executable runs with this interpreter.
    assert resolve_command("app.py --flag 'a b'", tmp_path) == (
        sys.executable,
        str(script),
        "--flag",
        "a b",
    )
    script.chmod(0o755)
    assert resolve_command("app.py", tmp_path) == (str(script),)
    assert resolve_command("python3 app.py", tmp_path)[1:] == ("app.py",)
    with pytest.raises(ConfigError, match="not found on PATH"):
        resolve_command("no-such-program-here x", tmp_path)
    with pytest.raises(ConfigError, match="cannot be split"):
        resolve_command("python3 'unterminated", tmp_path)
    (tmp_path / "data.txt").write_text("x")
    with pytest.raises(ConfigError, match="is not executable"):
        resolve_command("data.txt", tmp_path)
    # Issue 15: an interpreter that exists with a script that does not used to start, fail at
    # once ("can't open file", logged at INFO) and be retried forever.
    with pytest.raises(ConfigError, match=r"no_such_script\.py' does not exist"):
        resolve_command("python3 no_such_script.py", tmp_path)


def test_the_error_of_a_child_that_died_quotes_its_last_stderr_lines(tmp_path: Path) -> None:
    """Issue 15: a child that could not run (e.g. "can't open file") said so only at INFO; the
    failure that ends it (and counts toward parking the lease) now carries its last words."""
    script = tmp_path / "crasher.py"
    script.write_text(
        "import sys\n"
        "sys.stdin.readline()\n"
        "print('Traceback: ModuleNotFoundError: No module named foo', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, script))

    async def scenario() -> None:
        with pytest.raises(ChildFailedError, match=r"stderr ended with: .*No module named foo"):
            await start(processor, shard)

    asyncio.run(scenario())


def test_a_childs_long_stderr_lines_are_cut_in_its_tail_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each line was kept whole (up to 8 MB) in every lease's 20-line tail and logged whole."""
    from kclpy_spark.multilang.subprocess_processor import STDERR_LINE_CHARS

    script = tmp_path / "shouter.py"
    script.write_text(
        "import sys\n"
        "sys.stdin.readline()\n"
        "for _ in range(3):\n"
        "    print('x' * 1_000_000, file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path, script))

    async def scenario() -> None:
        with pytest.raises(ChildFailedError, match=r"more bytes\]"):
            await start(processor, shard)

    with caplog.at_level(logging.INFO, logger="kclpy_spark.multilang.child"):
        asyncio.run(scenario())
    kept = list(processor._stderr_tail)
    assert len(kept) == 3 and all(len(x) < STDERR_LINE_CHARS + 40 for x in kept)
    logged = [r.getMessage() for r in caplog.records if r.name == "kclpy_spark.multilang.child"]
    assert len(logged) == 3 and max(map(len, logged)) < STDERR_LINE_CHARS + 100


BUFFERING_CHILD = """\
import json, os, sys
out, every = os.environ["FLUSHED"], int(os.environ["FLUSH_EVERY"])
held, batches = [], 0
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n"); sys.stdout.flush()
def flush():
    global held
    with open(out, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "flushed": held}) + "\\n")
    held = []
    send({"action": "checkpoint", "sequenceNumber": None, "subSequenceNumber": None})
    sys.stdin.readline()
for line in sys.stdin:
    message = json.loads(line)
    action = message["action"]
    if action == "initialize":
        with open(out + ".inits", "a") as fh:
            fh.write(str(message.get("sequenceNumber")) + "\\n")
    if action == "processRecords":
        if os.environ.get("DIE_ON") in [r["sequenceNumber"] for r in message["records"]]:
            os._exit(9)  # killed in the middle of this batch
        held += [r["sequenceNumber"] for r in message["records"]]
        batches += 1
        if batches % every == 0:
            flush()
            if os.environ.get("DIE_AFTER_FLUSH"):
                os._exit(9)  # killed after checkpointing what it held
    elif action == "shardEnded":
        if os.environ.get("DIE_AT_END"):
            os._exit(9)  # killed while told its shard ended
        flush()
        if os.environ.get("DIE_AFTER_END"):
            os._exit(9)  # killed after checkpointing SHARD_END, before its status
    send({"action": "status", "responseFor": action})
"""


def buffering(tmp_path: Path, every: int, **env: str) -> tuple[SubprocessProcessor, Path]:
    """A child that keeps records in memory and checkpoints what it flushed every ``every``
    batches and at shard end (the KCL's usual pattern); with ``DIE_ON``, it dies when given
    that record."""
    script, flushed = tmp_path / "buffering.py", tmp_path / "flushed.jsonl"
    script.write_text(BUFFERING_CHILD)
    return SubprocessProcessor(spec(tmp_path, script, FLUSHED=str(flushed),
                                    FLUSH_EVERY=str(every), **env)), flushed  # fmt: skip


def test_a_child_that_died_holding_records_it_had_not_checkpointed_asks_for_them_again(
    tmp_path: Path,
) -> None:
    """It was replaced by a child started at the checkpoint and given only the next batch:
    records 1-4 were never flushed, and that child's checkpoint went past them."""
    shard = held_shard()
    processor, flushed = buffering(tmp_path, every=3)

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)
        await deliver(processor, shard, 3, 2)  # held, not checkpointed
        await kill_child(processor)  # an OOM kill between batches
        with pytest.raises(RedeliverFromCheckpoint, match="holding records"):
            await deliver(processor, shard, 5, 2)
        assert processor.children_started == 1  # no child was given batch 5-6 alone
        # What the consumer does then: delivers again from the checkpoint (TRIM_HORIZON).
        await deliver(processor, shard, 1, 2)
        await deliver(processor, shard, 3, 2)
        await deliver(processor, shard, 5, 2)  # the new child's third batch: flushed
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    assert processor.children_started == 2
    inits = (tmp_path / "flushed.jsonl.inits").read_text().split()
    assert inits == ["TRIM_HORIZON", "TRIM_HORIZON"]  # the new child starts at the checkpoint
    lines = [json.loads(x) for x in flushed.read_text().splitlines()]
    assert [s for x in lines for s in x["flushed"]] == [seq(n) for n in range(1, 7)]
    assert shard.stored() == ExtendedSequenceNumber(seq(6))


@pytest.mark.parametrize("when", ["mid-call", "shard end", "during shard end"])
def test_a_child_that_dies_holding_records_fails_so_they_come_again(
    tmp_path: Path, when: str
) -> None:
    """Dying in the middle of a batch, or before its shard end was told, a child holding
    earlier batches' records: a plain failure had the batch (or shard end) retried with a new
    child that never saw them; SHARD_END was then stored past them for good."""
    shard = held_shard()
    # "during shard end": it dies while told (one death, one failure: it was two)
    extra = {"DIE_AT_END": "1"} if when == "during shard end" else {}
    processor, flushed = buffering(tmp_path, every=5, DIE_ON=seq(3), **extra)

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)  # held
        if when == "mid-call":
            with pytest.raises(RedeliverFromCheckpoint, match=r"ended \(status 9\)"):
                await deliver(processor, shard, 3, 2)
        else:
            if when == "shard end":
                await kill_child(processor)  # found dead when told
            shard.checkpointer.mark_shard_end()
            with pytest.raises(RedeliverFromCheckpoint):
                await processor.shard_ended(ShardEndedInput(shard.checkpointer))

    asyncio.run(scenario())
    assert shard.stored() == TRIM_HORIZON  # nothing went past the held records
    assert not flushed.exists()


def test_a_child_that_dies_after_checkpointing_shard_end_asks_for_nothing_again(
    tmp_path: Path,
) -> None:
    """Its held records were flushed with the SHARD_END checkpoint: a death before its status
    is a plain failure (the shard is finished), not a read of the whole shard again."""
    shard = held_shard()
    processor, flushed = buffering(tmp_path, every=5, DIE_AFTER_END="1")

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)  # held
        shard.checkpointer.mark_shard_end()
        with pytest.raises(ChildFailedError) as failed:
            await processor.shard_ended(ShardEndedInput(shard.checkpointer))
        assert not isinstance(failed.value, RedeliverFromCheckpoint)

    asyncio.run(scenario())
    assert shard.stored() == SHARD_END
    assert json.loads(flushed.read_text())["flushed"] == [seq(1), seq(2)]


def test_a_child_that_checkpointed_what_it_held_before_it_died_fails_plainly(
    tmp_path: Path,
) -> None:
    """Judged before the call, the records it held made its death a read from the checkpoint
    again, though it had flushed and checkpointed them in the batch it died in."""
    shard = held_shard()
    processor, flushed = buffering(tmp_path, every=2, DIE_AFTER_FLUSH="1")

    async def scenario() -> None:
        await start(processor, shard)
        await deliver(processor, shard, 1, 2)  # held
        with pytest.raises(ChildFailedError) as failed:
            await deliver(processor, shard, 3, 2)  # flushed, checkpointed, then it dies
        assert not isinstance(failed.value, RedeliverFromCheckpoint)

    asyncio.run(scenario())
    assert shard.stored() == ExtendedSequenceNumber(seq(4))
    assert json.loads(flushed.read_text())["flushed"] == [seq(n) for n in range(1, 5)]


def _wrapped(tmp_path: Path, script: str) -> SubprocessProcessor:
    """The sample app run by a shell wrapper: ``script`` around ``$APP`` (the app's command)."""
    wrapper = tmp_path / "run_app.sh"
    wrapper.write_text(f'#!/bin/sh\nAPP=\'"{sys.executable}" "{PROTOCOL_SCRIPT}"\'\n{script}\n')
    wrapper.chmod(0o755)
    return SubprocessProcessor(ChildSpec(**{**spec(tmp_path).__dict__, "command": (str(wrapper),)}))


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not pid_alive(pid)


def test_a_child_cancelled_while_it_exits_is_killed_not_left_running(tmp_path: Path) -> None:
    """The worker's stop cancelled a consumer while the child had its grace to exit (a wrapper
    that goes on after the app): the child was out of ``_abort``'s reach and ran on."""
    shard = held_shard()
    processor = _wrapped(tmp_path, 'eval "$APP"\nsleep 30')

    async def scenario() -> int:
        await start(processor, shard)
        pid = child_pid(processor)
        task = asyncio.ensure_future(processor.lease_lost(LeaseLostInput()))
        await asyncio.sleep(1.0)  # the app answered and exited; the wrapper sleeps on
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid

    pid = asyncio.run(scenario())
    assert _gone_soon(pid), "the child outlived its consumer's cancellation"


def test_a_process_the_child_left_holding_its_stdout_neither_holds_the_close_nor_lives_on(
    tmp_path: Path,
) -> None:
    """A helper the app started held its stdout open: each close waited the whole grace for that
    pipe's end (then said the exited child did not exit), and the helper lived on, one more each
    time a lease ended."""
    shard = held_shard()
    helper_pid = tmp_path / "helper.pid"
    processor = _wrapped(tmp_path, f'sleep 60 &\necho $! > "{helper_pid}"\neval "exec $APP"')
    # A grace far past what a close may take under load (a second for each pipe's end): the
    # bug waited all of it.
    processor._spec = dataclasses.replace(processor._spec, shutdown_grace=30.0)

    async def scenario() -> float:
        await start(processor, shard)
        began = time.monotonic()
        await processor.lease_lost(LeaseLostInput())
        return time.monotonic() - began

    took = asyncio.run(scenario())
    assert took < processor._spec.shutdown_grace / 2, f"the close took {took:.1f}s"
    assert _gone_soon(int(helper_pid.read_text())), "the helper outlived the child"


def test_a_child_that_died_between_calls_has_no_group_signalled_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child reaped a while ago (killed between calls): its pid may be another child's by the
    time the next call closes it, and that child leads a group of the same id."""
    import signal

    shard = held_shard()
    processor = SubprocessProcessor(spec(tmp_path))
    signalled: list[tuple[int, int]] = []

    async def scenario() -> int:
        await start(processor, shard)
        pid = child_pid(processor)
        await kill_child(processor)
        await asyncio.sleep(0.2)
        monkeypatch.setattr(os, "killpg", lambda pgid, sig: signalled.append((pgid, sig)))
        await deliver(processor, shard, 1, 1)  # a new child takes the batch
        return pid

    pid = asyncio.run(scenario())
    assert (pid, signal.SIGTERM) not in signalled


def _helper_script(tmp_path: Path, helper: str, then: str) -> SubprocessProcessor:
    """A child that starts ``helper`` in the background (its pid in ``helper.pid``, its output
    away from the child's pipes), then runs ``then``."""
    pid_file = tmp_path / "helper.pid"
    script = f'({helper}) >/dev/null 2>&1 </dev/null &\necho $! > "{pid_file}"\n{then}'
    return _wrapped(tmp_path, script)


def test_a_helper_that_ignores_sigterm_does_not_outlive_the_child(tmp_path: Path) -> None:
    """What the child left running got SIGTERM only when it exited: a helper that ignores it
    lived on, one more each time a lease ended."""
    shard = held_shard()
    processor = _helper_script(tmp_path, "trap '' TERM; exec sleep 30", 'eval "exec $APP"')

    async def scenario() -> None:
        await start(processor, shard)
        await processor.lease_lost(LeaseLostInput())

    asyncio.run(scenario())
    assert _gone_soon(int((tmp_path / "helper.pid").read_text())), "the helper outlived the child"


def test_a_child_that_dies_during_a_call_takes_its_helpers_with_it(tmp_path: Path) -> None:
    """A child that died while a call waited for its answer was reaped by then (``_abort`` had
    nothing to signal): what it started lived on, one more at each restart."""
    shard = held_shard()
    processor = _helper_script(tmp_path, "exec sleep 30", "read line\nexit 3")

    async def scenario() -> None:
        with pytest.raises(ChildFailedError, match="ended"):
            await start(processor, shard)

    asyncio.run(scenario())
    assert _gone_soon(int((tmp_path / "helper.pid").read_text())), "the helper outlived the child"


def test_a_child_that_dies_during_a_call_while_a_helper_holds_its_stdout_ends_the_call(
    tmp_path: Path,
) -> None:
    """A helper started with ``&`` keeps the child's stdout open: its end never came, so a death
    during a call waited ``timeoutInSeconds`` (for ever without one) and the helper lived on."""
    shard = held_shard()
    processor = _wrapped(
        tmp_path, f'(exec sleep 30) &\necho $! > "{tmp_path / "helper.pid"}"\nread line\nexit 3'
    )
    began = time.monotonic()

    async def scenario() -> None:
        with pytest.raises(ChildFailedError, match="ended"):
            await start(processor, shard)

    asyncio.run(scenario())
    took = time.monotonic() - began
    assert took < processor._spec.timeout / 2, f"the call waited {took:.1f}s"
    assert _gone_soon(int((tmp_path / "helper.pid").read_text())), "the helper outlived the child"


def test_a_dead_childs_chatty_helper_does_not_keep_the_call_reading(tmp_path: Path) -> None:
    """After the child's death a helper wrote a stray line every 0.3 s: each read after the
    exit waited only the grace and got one, so the call skipped lines for ever (timeoutInSeconds
    no longer counted)."""
    shard = held_shard()
    script = "(while true; do echo stray; sleep 0.3; done) &\nread line\nexit 3"
    processor = _wrapped(tmp_path, script)
    began = time.monotonic()

    async def scenario() -> None:
        with pytest.raises(ChildFailedError, match="ended"):
            await asyncio.wait_for(start(processor, shard), 30)

    try:
        asyncio.run(scenario())
    finally:
        subprocess.run(["pkill", "-f", "echo stray"], check=False)
    assert time.monotonic() - began < processor._spec.timeout / 2
