"""ExitWatch: a child's stdout read ends at the child's exit though a process it started holds
the pipe open (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from kclpy_spark.multilang.exit_watch import ExitWatch

# The child prints a line and exits; its background helper keeps stdout open for 30 s.
SCRIPT = "sleep 30 & echo $! >&2; echo last-words; exit 0"


async def _lines(cancel_from_outside: bool = False) -> tuple[list[bytes], float, int]:
    proc = await asyncio.create_subprocess_exec(
        "sh", "-c", SCRIPT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    watch = ExitWatch(proc.pid, grace=0.5)
    helper = int((await proc.stderr.readline()).decode())
    began = time.monotonic()
    try:
        got = [await watch.read_line(proc.stdout, 10.0)]  # written before its exit
        if cancel_from_outside:
            read = asyncio.ensure_future(watch.read_line(proc.stdout, 10.0))
            await asyncio.sleep(0.1)
            read.cancel()
            with pytest.raises(asyncio.CancelledError):
                await read
            return got, time.monotonic() - began, helper
        got.append(await watch.read_line(proc.stdout, 10.0))  # then its end, in the grace
        return got, time.monotonic() - began, helper
    finally:
        watch.close()
        watch.close()  # idempotent
        os.kill(helper, signal.SIGKILL)
        await proc.communicate()  # the pipes end with the helper


def test_a_read_after_the_child_exited_ends_within_the_grace_though_a_helper_holds_stdout() -> None:
    got, took, _ = asyncio.run(_lines())
    assert got == [b"last-words\n", b""]
    assert took < 5.0, f"the end took {took:.1f}s"


def test_a_read_cancelled_by_its_caller_stays_cancelled() -> None:
    got, _, _ = asyncio.run(_lines(cancel_from_outside=True))
    assert got == [b"last-words\n"]


def test_a_child_reaped_before_it_is_watched_counts_as_exited() -> None:
    async def scenario() -> bool:
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
        watch = ExitWatch(proc.pid, grace=0.5)
        watch.close()
        return watch.exited

    assert asyncio.run(scenario())


def test_its_own_cancel_swallowed_by_a_read_that_returned_does_not_linger() -> None:
    """The grace timer's cancel and the helper's line came in one loop iteration: wait_for gave
    the line and the cancel stayed counted on the task, so the next child's own cancel there was
    taken for the worker's and raised."""

    async def scenario() -> tuple[bytes, int, bytes]:
        first, second = ExitWatch(os.getpid(), 0.5), ExitWatch(os.getpid(), 0.5)
        stream = asyncio.StreamReader()
        try:
            read = asyncio.ensure_future(first.read_line(stream, 10.0))
            await asyncio.sleep(0.05)
            stream.feed_data(b"late line\n")
            first._end_read()  # in the same iteration as the line
            line = await read
            left = read.cancelling()
            again = asyncio.StreamReader()

            async def next_child() -> bytes:
                asyncio.get_running_loop().call_later(0.05, second._end_read)
                return await second.read_line(again, 10.0)

            return line, left, await asyncio.ensure_future(next_child())
        finally:
            first.close()
            second.close()

    # the late line (not the dead child's: it came at the grace's end) is left unread
    assert asyncio.run(scenario()) == (b"", 0, b"")


def test_a_backlog_the_child_wrote_before_its_exit_is_read_however_long_its_handling_takes() -> (
    None
):
    """Reading after the exit ended at the exit plus the grace by the clock: a child that wrote
    many stray lines, then its status, then exited had its status dropped while the caller was
    still logging the strays."""

    async def scenario() -> list[bytes]:
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
        watch = ExitWatch(proc.pid, grace=0.2)  # reaped already: exited
        stream = asyncio.StreamReader()
        stream.feed_data(b"stray\n" * 5 + b"status\n")
        got = []
        while line := await watch.read_line(stream, None):
            got.append(line)
            await asyncio.sleep(0.1)  # handling each line: 0.6 s in all, past the grace
        return got

    assert asyncio.run(scenario()) == [b"stray\n"] * 5 + [b"status\n"]


def test_a_stop_while_the_ended_childs_last_words_are_awaited_stays_a_stop(tmp_path: Path) -> None:
    """The wait for an ended child's last stderr lines (a helper holding its stderr) swallowed
    the caller's cancel (a worker stopping): the call failed as a dead child's instead, and the
    batch went the failure way."""
    from kclpy_spark.multilang.child import ChildSpec
    from kclpy_spark.multilang.subprocess_processor import SubprocessProcessor

    processor = SubprocessProcessor(ChildSpec(command=("true",), cwd=tmp_path, timeout=10.0))

    async def scenario() -> None:
        held = asyncio.Event()
        processor._stderr = asyncio.ensure_future(held.wait())  # its stderr never ends
        words = asyncio.ensure_future(processor._last_words())
        await asyncio.sleep(0.1)
        words.cancel()
        with pytest.raises(asyncio.CancelledError):
            await words
        held.set()

    asyncio.run(scenario())
