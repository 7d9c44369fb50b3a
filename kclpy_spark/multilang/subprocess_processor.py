"""A RecordProcessor that runs the application's ``executableName`` per lease and speaks the
MultiLang protocol with it, as the Java MultiLangDaemon's MultiLangShardRecordProcessor does.

One child process per lease, started in ``initialize``: each call sends one message and reads the
child's stdout until the ``status`` reply, answering the checkpoint requests that come before it
through our Checkpointer (in a thread: it writes to the lease table) with the Java exception's
name as ``error`` on failure. Non-JSON stdout lines are skipped with a warning; the child's
stderr is logged line by line with the shard id (logger ``kclpy_spark.multilang.child``).

Lifecycle, as the KCL: after ``leaseLost`` or ``shardEnded`` the child's stdin is closed and it
gets ``shutdown_grace`` seconds to exit before it is terminated; at a graceful shutdown it gets
``shutdownRequested`` (its chance to checkpoint), then ``leaseLost``, then end of input.

Failures (a choice, documented here; the Java daemon exits the whole JVM on each of them):

* A child that does not answer within ``timeout`` seconds (``timeoutInSeconds``, per message read,
  as the KCL counts it) is killed and ``ChildTimeoutError`` is raised. A child that exits or
  breaks the protocol is killed and ``ChildFailedError`` is raised.
* From ``process_records`` that means the worker's failure policy applies to this lease only: the
  batch is offered again after a backoff, to a new child (started and initialized again), and
  after ``max_processing_attempts`` failures the lease is parked: released, with a reopen time
  every worker sees, and redelivered from its last checkpoint later. No record is skipped.
* From ``initialize`` the same policy: tried again after a backoff, with a new child, and after
  ``max_processing_attempts`` failures the lease is parked.
* ``shard_ended`` starts a new child if the consumer retries shard end (no SHARD_END checkpoint
  was made); ``lease_lost`` and ``shutdown_requested`` never start one.

Children are started in their own session, so a Ctrl-C in a terminal reaches only the worker,
which then shuts them down in order; a child also exits when the worker dies (its stdin ends).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shlex
import signal
from collections.abc import Sequence
from typing import Any

from checkpoint.checkpointer import DEPENDENCY, INVALID_STATE, CheckpointError
from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.multilang import protocol
from kclpy_spark.multilang.child import ChildSpec
from kclpy_spark.multilang.exit_watch import ExitWatch
from kclpy_spark.processor import (
    Checkpointer,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    RecordProcessor,
    RedeliverFromCheckpoint,
    ShardEndedInput,
    ShutdownRequestedInput,
)

log = logging.getLogger(__name__)
child_log = logging.getLogger("kclpy_spark.multilang.child")

# The longest stdout/stderr line read whole; a longer (stray) line is skipped in pieces. Protocol
# replies are tiny, but a child may print large debug output.
LINE_LIMIT = 8 * 1024 * 1024
# After SIGTERM, how long a child may take to exit before SIGKILL.
TERMINATE_WAIT = 2.0
# How often a child's exit is looked for while it is awaited.
EXIT_POLL = 0.05
# After a child exited, how long the last of its stdout is read (a process it started may hold
# the pipe open).
STDOUT_AFTER_EXIT = 1.0
# Stderr lines of a child kept to explain its end.
STDERR_TAIL = 20
# The most of one stderr line logged and kept (a child may print megabytes on one line; each
# lease's child keeps its tail).
STDERR_LINE_CHARS = 4096


class ChildFailedError(Exception):
    """The child process exited, could not be started, or broke the protocol."""


class ChildTimeoutError(ChildFailedError):
    """The child did not answer within timeoutInSeconds."""


class SubprocessProcessor(RecordProcessor):
    """Runs one child per lease; every method is async and awaited on the worker's loop."""

    def __init__(self, spec: ChildSpec) -> None:
        self._spec = spec
        self._proc: asyncio.subprocess.Process | None = None
        self._watch: ExitWatch | None = None  # the running child's stdout reads (exit_watch.py)
        self._stderr: asyncio.Task[None] | None = None
        # The child's last stderr lines: an error that ends it says what it printed last.
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._init: InitializeInput | None = None
        self.shard_id = "?"
        self.children_started = 0
        # The last record the running child took (its status came back); past what the tenure
        # checkpointed, the child holds records only it knew of.
        self._given_end: ExtendedSequenceNumber | None = None

    # --- the RecordProcessor API -----------------------------------------------------------------

    async def initialize(self, initialize_input: InitializeInput) -> None:
        self._init = initialize_input
        self.shard_id = initialize_input.shard_id
        await self._guarded(self._start())

    async def process_records(self, process_records_input: ProcessRecordsInput) -> None:
        records, checkpointer = process_records_input.records, process_records_input.checkpointer
        line = protocol.encode_process_records(records, process_records_input.millis_behind_latest)
        try:
            await self._guarded(self._call(line, protocol.PROCESS_RECORDS, checkpointer))
        except ChildFailedError as exc:
            # Judged after the call: what the child checkpointed before it died is not held.
            if self._holds_unconfirmed(checkpointer):  # its replacement must get it again
                self._given_end = None
                why = f"{exc}; it held records it had not checkpointed"
                raise RedeliverFromCheckpoint(why) from exc
            raise
        if records:
            last = records[-1]
            self._given_end = ExtendedSequenceNumber(last.sequence_number, last.sub_sequence_number)

    async def lease_lost(self, lease_lost_input: LeaseLostInput) -> None:
        if not self._running():
            await self._close()
            return
        await self._guarded(self._finish([(protocol.lease_lost_message(), None)]))

    async def shard_ended(self, shard_ended_input: ShardEndedInput) -> None:
        message, checkpointer = protocol.shard_ended_message(), shard_ended_input.checkpointer
        try:
            await self._guarded(self._finish([(message, checkpointer)], start=True))
        except ChildFailedError as exc:
            # As in process_records: one death, one failure, and a read again; not after the
            # child checkpointed SHARD_END (then it held nothing: the shard is finished).
            if self._holds_unconfirmed(checkpointer):
                self._given_end = None
                why = f"{exc}; it held records it had not checkpointed"
                raise RedeliverFromCheckpoint(why) from exc
            raise

    async def shutdown_requested(self, shutdown_requested_input: ShutdownRequestedInput) -> None:
        if not self._running():
            await self._close()
            return
        steps = [
            (protocol.shutdown_requested_message(), shutdown_requested_input.checkpointer),
            (protocol.lease_lost_message(), None),
        ]
        await self._guarded(self._finish(steps))

    # --- one child -------------------------------------------------------------------------------

    def _running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def _holds_unconfirmed(self, checkpointer: Checkpointer | None) -> bool:
        """Whether the running child took records past what ``checkpointer`` wrote: a child
        that buffers until it checkpoints (the KCL's usual pattern) has them only in memory."""
        given = self._given_end
        if given is None or checkpointer is None:
            return False
        if getattr(checkpointer, "shard_end_written", False):
            return False  # it checkpointed the whole shard
        written = getattr(checkpointer, "written", None)  # our Checkpointer's; None: none yet
        return written is None or given > written

    async def _guarded(self, step: Any) -> None:
        """Run ``step``; on any failure (or cancellation) kill the child first, then re-raise."""
        try:
            await step
        except BaseException:
            await self._abort()
            raise

    async def _start(self, checkpointer: Checkpointer | None = None) -> None:
        """A child, initialized at the tenure's start, or, after one that died, at what the
        tenure's ``checkpointer`` wrote since (the Java daemon exits with its child, and the
        lease's next owner starts at its checkpoint)."""
        assert self._init is not None
        spec = self._spec
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=spec.cwd,
                env=None if spec.env is None else dict(spec.env),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as exc:
            raise ChildFailedError(
                f"shard {self.shard_id}: cannot start {shlex.join(spec.command)}: {exc}"
            ) from exc
        self._proc = proc
        self._watch = ExitWatch(proc.pid, STDOUT_AFTER_EXIT)
        self._given_end = None
        self.children_started += 1
        assert proc.stderr is not None
        self._stderr = asyncio.create_task(self._drain_stderr(proc.stderr))
        log.info(
            "shard %s: started child process %d: %s",
            self.shard_id,
            proc.pid,
            shlex.join(spec.command),
        )
        init = self._init
        seq, sub = init.sequence_number, init.sub_sequence_number
        written = getattr(checkpointer, "written", None)  # our Checkpointer's; None: none yet
        if written is not None:
            seq, sub = written.sequence_number, written.sub_sequence_number
        message = protocol.initialize_message(init.shard_id, seq, sub)
        await self._exchange(message, protocol.INITIALIZE, None)

    async def _call(
        self, message: dict[str, Any] | bytes, action: str, checkpointer: Checkpointer | None
    ) -> None:
        if not self._running():
            if self._proc is not None:
                log.warning(
                    "shard %s: the child process exited (status %s); starting a new one",
                    self.shard_id,
                    self._proc.returncode,
                )
                await self._close()
            if self._holds_unconfirmed(checkpointer):
                # Started at the checkpoint and given only what comes next, a new child would
                # never see what the dead one held: the Java daemon exits with its child, and
                # the lease's next owner reads from the checkpoint; so does this tenure.
                self._given_end = None
                raise RedeliverFromCheckpoint(
                    f"shard {self.shard_id}: the child process exited holding records it had "
                    "not checkpointed"
                )
            await self._start(checkpointer)
        await self._exchange(message, action, checkpointer)

    async def _finish(
        self, steps: Sequence[tuple[dict[str, Any], Checkpointer | None]], *, start: bool = False
    ) -> None:
        """Send the closing messages, then end the child's input and let it exit."""
        for message, checkpointer in steps:
            if start:
                await self._call(message, message["action"], checkpointer)
            else:
                await self._exchange(message, message["action"], checkpointer)
        await self._close()

    async def _send(self, message: dict[str, Any] | bytes) -> None:
        """Write one message (a dict, or a line already encoded) to the child's stdin."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(message if isinstance(message, bytes) else protocol.encode(message))
            await asyncio.wait_for(proc.stdin.drain(), self._spec.timeout)
        except TimeoutError:
            raise ChildTimeoutError(
                f"shard {self.shard_id}: the child did not read its input for "
                f"{self._spec.timeout:.0f}s (timeoutInSeconds)"
            ) from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChildFailedError(
                f"shard {self.shard_id}: the child process closed its input: {exc}"
            ) from None

    async def _exchange(
        self, message: dict[str, Any] | bytes, action: str, checkpointer: Checkpointer | None
    ) -> None:
        """Send ``message`` and serve checkpoint requests until the child's status for it."""
        assert self._proc is not None
        began_running = self._proc.returncode is None
        await self._send(message)
        while True:
            reply = await self._next_message(action, began_running)
            if isinstance(reply, protocol.CheckpointRequest):
                error = await self._checkpoint(reply, checkpointer)
                await self._send(
                    protocol.checkpoint_reply(
                        reply.sequence_number, reply.sub_sequence_number, error
                    )
                )
                continue
            if reply.response_for != action:
                raise ChildFailedError(
                    f"shard {self.shard_id}: the child answered status for "
                    f"{reply.response_for!r} while {action!r} was expected"
                )
            return

    async def _next_message(self, action: str, began_running: bool) -> protocol.ChildMessage:
        """The child's next message; ``timeoutInSeconds`` counts until it comes, however many
        stray lines come first (as the MultiLangDaemon waits for a message, not a line). A child
        that ends during the call (it ``began_running``) takes what it left running with it."""
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        loop = asyncio.get_running_loop()
        timeout = self._spec.timeout
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                assert self._watch is not None
                line = await self._watch.read_line(proc.stdout, left)
            except TimeoutError:
                raise ChildTimeoutError(
                    f"shard {self.shard_id}: no answer from the child for "
                    f"{self._spec.timeout:.0f}s while waiting for the status of {action!r} "
                    "(timeoutInSeconds); killing it"
                ) from None
            except ValueError:
                log.warning(
                    "shard %s: skipping an over-long line on the child's stdout", self.shard_id
                )
                continue
            if not line:
                status = await self._wait_exit(proc, 1.0)
                if began_running and status is not None:  # its group's id is still its own
                    await self._end_leftovers(proc)
                raise ChildFailedError(
                    f"shard {self.shard_id}: the child process ended (status {status}) while "
                    f"{action!r} was waiting for its status{await self._last_words()}"
                )
            decoded = protocol.decode_child_line(line)
            if decoded is None:
                continue
            if isinstance(decoded, protocol.StrayLine):
                log.warning(
                    "shard %s: skipping unexpected line on the child's stdout (%s): %s",
                    self.shard_id,
                    decoded.reason,
                    decoded.text[:500],
                )
                continue
            return decoded

    async def _checkpoint(
        self, request: protocol.CheckpointRequest, checkpointer: Checkpointer | None
    ) -> str | None:
        """Checkpoint for the child; the error name to send back, or None on success."""
        seq, sub = request.sequence_number, request.sub_sequence_number
        if checkpointer is None:
            log.error(
                "shard %s: the child asked to checkpoint at %s, but there is no checkpointer now",
                self.shard_id,
                seq,
            )
            return INVALID_STATE
        try:
            await asyncio.to_thread(checkpointer.checkpoint, seq, sub)
        except CheckpointError as exc:
            log.info("shard %s: checkpoint at %s failed: %s", self.shard_id, seq, exc)
            return exc.value
        except Exception:
            log.exception("shard %s: checkpoint at %s failed unexpectedly", self.shard_id, seq)
            return DEPENDENCY
        return None

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:
                continue  # an over-long line: the rest arrives as the next line
            if not line:
                return
            text = line[:STDERR_LINE_CHARS].decode("utf-8", "replace").rstrip()
            if len(line) > STDERR_LINE_CHARS:
                text += f" [{len(line) - STDERR_LINE_CHARS} more bytes]"
            if text:
                self._stderr_tail.append(text)
                child_log.info("shard %s: %s", self.shard_id, text)

    async def _last_words(self) -> str:
        """The ended child's last stderr lines, for the error that reports its end."""
        task = self._stderr
        if task is not None:  # never raises for the task; the caller's cancel goes through
            await asyncio.wait({task}, timeout=1.0)
        if not self._stderr_tail:
            return ""
        return "; its stderr ended with: " + " | ".join(self._stderr_tail)

    # --- ending a child --------------------------------------------------------------------------

    @staticmethod
    async def _wait_exit(proc: asyncio.subprocess.Process, timeout: float) -> int | None:
        """The child's exit status once it exits, None if it has not within ``timeout``. Its
        ``returncode``, not ``proc.wait()``: on Python 3.11 that returns only once the child's
        pipes are closed too, which a process it started may hold open for ever."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while proc.returncode is None and loop.time() < deadline:
            await asyncio.sleep(min(EXIT_POLL, max(0.0, deadline - loop.time())))
        return proc.returncode

    async def _drain_stdout(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:
                continue
            if not line:
                return
            decoded = protocol.decode_child_line(line)
            if decoded is not None:
                log.warning(
                    "shard %s: skipping line on the child's stdout after its last message: %s",
                    self.shard_id,
                    line.decode("utf-8", "replace").rstrip()[:500],
                )

    async def _close(self) -> None:
        """End the child's input and give it ``shutdown_grace`` seconds to exit; then stop it.
        Its exit is awaited, not its stdout's end: a process it started may hold that open (each
        close waited the whole grace, and the process lived on). Whatever it started and left
        running goes with it. Cancelled meanwhile (the worker's stop ran out of time), it is
        killed: it was out of ``_abort``'s reach and ran on."""
        proc, self._proc = self._proc, None
        self._unwatch()
        if proc is None:
            return
        try:
            await self._end_and_wait(proc)
        except BaseException:
            await self._kill(proc)
            raise
        await self._end_stderr()
        log.info("shard %s: child process %d exited with status %s", self.shard_id, proc.pid,
                 proc.returncode)  # fmt: skip

    async def _end_and_wait(self, proc: asyncio.subprocess.Process) -> None:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
            with contextlib.suppress(Exception):
                await proc.stdin.wait_closed()
        # Its stdout is read while it exits: a full pipe would block it.
        drain = asyncio.ensure_future(self._drain_stdout(proc))
        exited_before = proc.returncode is not None  # long ago maybe: its pid may be reused
        try:
            if await self._wait_exit(proc, self._spec.shutdown_grace) is not None:
                if not exited_before:  # just now: its group's id is still its own
                    await self._end_leftovers(proc)
                return
            log.warning(
                "shard %s: child process %d did not exit within %.1fs of its input ending; "
                "terminating it",
                self.shard_id,
                proc.pid,
                self._spec.shutdown_grace,
            )
            await self._stop(proc)
        finally:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(drain), STDOUT_AFTER_EXIT)
            drain.cancel()

    async def _end_leftovers(self, proc: asyncio.subprocess.Process) -> None:
        """The child exited just now: what it started and left running in its group (orphans
        now) gets SIGTERM, and SIGKILL if still there ``TERMINATE_WAIT`` later (a helper that
        ignores SIGTERM lived on, one more each time a lease ended)."""
        if not _signal_group(proc, signal.SIGTERM, exited_just_now=True):
            return  # none left
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TERMINATE_WAIT
        while _group_alive(proc.pid) and loop.time() < deadline:
            await asyncio.sleep(EXIT_POLL)
        if _group_alive(proc.pid):
            _signal_group(proc, signal.SIGKILL, exited_just_now=True)
            log.warning(
                "shard %s: killed what child process %d left running (it ignored SIGTERM)",
                self.shard_id, proc.pid,
            )  # fmt: skip

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        _signal_group(proc, signal.SIGTERM)
        if await self._wait_exit(proc, TERMINATE_WAIT) is not None:
            await self._end_leftovers(proc)  # any that ignore SIGTERM
            return
        _signal_group(proc, signal.SIGKILL)
        await self._wait_exit(proc, TERMINATE_WAIT)

    async def _end_stderr(self) -> None:
        task, self._stderr = self._stderr, None
        if task is None:
            return
        try:
            await asyncio.wait({task}, timeout=1.0)
        finally:
            task.cancel()  # cancelled meanwhile too: nothing else holds it

    def _cancel_stderr(self) -> None:
        task, self._stderr = self._stderr, None
        if task is not None:
            task.cancel()

    def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()

    async def _abort(self) -> None:
        """Kill the child at once (after a failure or a cancellation)."""
        proc, self._proc = self._proc, None
        self._unwatch()
        if proc is not None:
            await self._kill(proc)

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """SIGKILL the child's group (while it runs), await its exit, stop reading its stderr."""
        if proc.returncode is None:
            _signal_group(proc, signal.SIGKILL)
            log.warning("shard %s: killed child process %d", self.shard_id, proc.pid)
        with contextlib.suppress(Exception):
            await self._wait_exit(proc, TERMINATE_WAIT)
        self._cancel_stderr()


def _signal_group(
    proc: asyncio.subprocess.Process, sig: int, *, exited_just_now: bool = False
) -> bool:
    """Signal the child and every process it started: it leads a session and process group of
    its own (``start_new_session``), so an app run by a wrapper script (``executableName =
    run.sh`` without ``exec``) goes with the wrapper instead of living on, orphaned. Only while
    the child is not yet reaped (its pid, the group's id, cannot have been reused), or when it
    ``exited_just_now`` (seen by a poll while its input ended): then the processes it left in
    its group keep the id theirs (a pid is not reused while a group bears it), and with none
    left ``killpg`` finds nothing unless the pid was reused within that moment. (A child that
    died earlier, between calls, is not signalled so: its pid may be another child's by now.)
    Whether the group was there to signal."""
    if proc.returncode is not None and not exited_just_now:
        return False
    try:
        os.killpg(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        if not exited_just_now:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        return False


def _group_alive(pgid: int) -> bool:
    """Whether a process of ours is left in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
