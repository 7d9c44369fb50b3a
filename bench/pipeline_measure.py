"""What ``bench_pipeline.py`` measures a run with: the stream's records and the warm window
(``Loaded``, ``Progress``), the CPU of a process tree over time (``TreeCpu``), and the stream
itself (``stream_source``: kinesalite loaded with the records, or the stand-in server)."""

from __future__ import annotations

import argparse
import bisect
import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kinesalite import Kinesalite, load_stream
from standin_server import sequence_number

PAGE = 10_000  # records per stand-in GetRecords page
MIN_WINDOW_STEPS = 3  # commits (or bare writes) inside the warm window, at the least


def note_tree(
    root: psutil.Process,
    seen: dict[int, tuple[str, float]],
    jvm_kids: dict[int, set[int]] | None = None,
) -> None:
    """Note in ``seen`` each process of ``root``'s tree by pid: its name and CPU seconds so far
    (a process that ended keeps its last figure). With ``jvm_kids``, also the CPU of each JVM's
    children that ended (``_note_reaped``), under the JVM's pid negated."""
    with contextlib.suppress(psutil.Error):
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                name = proc.name()
                seen[proc.pid] = (name, times.user + times.system)
                if name == "java" and jvm_kids is not None:
                    _note_reaped(proc, times, seen, jvm_kids)


def _note_reaped(
    jvm: psutil.Process,
    times: Any,
    seen: dict[int, tuple[str, float]],
    jvm_kids: dict[int, set[int]],
) -> None:
    """The CPU of the JVM's children that ended, counted as the JVM's: processes it starts for a
    few milliseconds (Hadoop's local filesystem runs ``chmod`` for every file and folder it makes
    when Hadoop's native library is missing), too short-lived for the samples to see. Frozen once
    a Python child seen before has ended (PySpark's daemon, at the end): its CPU, noted already,
    would come in twice."""
    pythons = {c.pid for c in jvm.children() if c.name().startswith("python")}
    known = jvm_kids.setdefault(jvm.pid, set())
    if known - pythons:
        return
    known |= pythons
    seen[-jvm.pid] = ("java", times.children_user + times.children_system)


def split_cpu(seen: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds of the JVM (processes named ``java``) and of the rest (Python)."""
    jvm = sum(cpu for name, cpu in seen.values() if name == "java")
    return {"jvm": jvm, "python": sum(c for _, c in seen.values()) - jvm}


class TreeCpu:
    """CPU seconds of a process and its descendants, sampled until it ends: the last figure seen
    of each process, Python and the JVM (``java``) apart, and the totals over time (so that the
    steady state's share can be read without the start-up)."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self._seen: dict[int, tuple[str, float]] = {}
        self._jvm_kids: dict[int, set[int]] = {}  # each JVM's Python children seen
        # (wall time, python, jvm, the root process alone: the daemon's own Python)
        self._series: list[tuple[float, float, float, float]] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while self._root.is_running() and self._root.status() != psutil.STATUS_ZOMBIE:
            note_tree(self._root, self._seen, self._jvm_kids)
            used = split_cpu(self._seen)
            own = self._seen.get(self._root.pid, ("", 0.0))[1]
            self._series.append((time.time(), used["python"], used["jvm"], own))
            time.sleep(0.2)

    def totals(self) -> dict[str, float]:
        self._thread.join(10.0)
        return split_cpu(self._seen) | {"driver": self._seen.get(self._root.pid, ("", 0.0))[1]}

    def between(self, began: float, ended: float) -> dict[str, float]:
        """CPU used from wall time ``began`` to ``ended`` (the samples nearest each end)."""

        def at(when: float) -> tuple[float, float, float, float]:
            return min(self._series, key=lambda s: abs(s[0] - when))

        first, last = at(began), at(ended)
        return {
            "python": last[1] - first[1],
            "jvm": last[2] - first[2],
            "driver": last[3] - first[3],
        }


@dataclass(frozen=True)
class Loaded:
    """The stream's records (every sequence number by shard, sorted) and the *warm window*: the
    part of the run between ``window[0]`` and ``window[1]`` of the records checkpointed (the bare
    pipeline: written). Its start leaves the JVM time to compile its per-row code; its end
    comes while records are still being read (the sink's buffer runs ahead of its checkpoints),
    so the window is a steady state, early in a daemon's life."""

    positions: dict[str, list[int]]
    window: tuple[float, float]

    @property
    def records(self) -> int:
        return sum(len(s) for s in self.positions.values())

    def done(self, checkpoints: dict[str, int]) -> int:
        """Records at or before each shard's checkpoint."""
        return sum(
            bisect.bisect_right(s, checkpoints.get(k, -1)) for k, s in self.positions.items()
        )


@dataclass
class Progress:
    """When a run reached each end of the warm window (wall time, records done then), how many
    commits moved it on in between (``steps``), and when it was done."""

    opened: tuple[float, int] | None = None
    closed: tuple[float, int] | None = None
    steps: int = 0
    done_at: float = 0.0
    _last: int = -1
    served: list[int | None] = field(default_factory=list)  # records read at the open, the close

    def note(
        self, now: float, done: int, loaded: Loaded, served: Callable[[], int | None] = lambda: None
    ) -> None:
        if self.opened is not None and self.closed is None and done != self._last:
            self.steps += 1
        self._last = done
        if self.opened is None and done >= loaded.window[0] * loaded.records:
            self.opened = (now, done)
            self.served.append(served())
        if self.closed is None and done >= loaded.window[1] * loaded.records:
            self.closed = (now, done)
            self.served.append(served())

    def read_share(self) -> float | None:
        """Records read in the window over those checkpointed in it (None if not counted)."""
        if len(self.served) != 2 or None in self.served or not self.opened or not self.closed:
            return None
        first, last = self.served
        assert first is not None and last is not None
        written = self.closed[1] - self.opened[1]
        return (last - first) / written if written else None

    def check(self, variant: str) -> None:
        """Raise unless the window opened, closed later, and spans ``MIN_WINDOW_STEPS`` commits
        (a window of one batch measures that batch, not a rate)."""
        if self.opened is None or self.closed is None or self.closed <= self.opened:
            raise RuntimeError(f"{variant}: no warm window ({self})")
        if self.steps < MIN_WINDOW_STEPS:
            raise RuntimeError(
                f"{variant}: the warm window spans {self.steps} commit(s), fewer than "
                f"{MIN_WINDOW_STEPS}: use more --records or a wider --window"
            )


def parse_window(text: str) -> tuple[float, float]:
    low, high = (float(x) for x in text.split(","))
    if not 0 <= low < high <= 1:
        raise argparse.ArgumentTypeError("FROM,TO with 0 <= FROM < TO <= 1")
    return low, high


@contextlib.contextmanager
def stream_source(args: Any) -> Iterator[tuple[str, str, Loaded]]:
    """The endpoint, the stream and its records: kinesalite loaded with ``--records``, or the
    stand-in server serving as many (rounded up to whole 10,000-record pages per shard)."""
    if args.source == "kinesalite":
        with Kinesalite() as kinesalite:
            stream = f"pipeline-{int(time.time())}"
            positions: dict[str, list[int]] = {}
            put_s = load_stream(
                kinesalite.endpoint,
                stream,
                shards=args.shards,
                records=args.records,
                size=args.size,
                positions=positions,
            )
            print(f"put {args.records:,} records in {put_s:.0f}s", flush=True)
            yield kinesalite.endpoint, stream, Loaded(positions, args.window)
        return
    pages = -(-args.records // (args.shards * PAGE))
    server = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("standin_server.py")),
            "--synthetic",
            str(PAGE),
            "--size",
            str(args.size),
            "--shards",
            str(args.shards),
            "--pages",
            str(pages),
            "--read-limit",
            str(args.read_limit),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        every = [int(sequence_number(p, i)) for p in range(pages) for i in range(PAGE)]
        positions = {f"shardId-{i:012d}": every for i in range(args.shards)}
        print(f"stand-in server: {args.shards} shards of {pages} pages at {endpoint}", flush=True)
        yield endpoint, "standin", Loaded(positions, args.window)
    finally:
        server.terminate()
        server.wait(timeout=10)
