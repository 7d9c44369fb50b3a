"""Before executors read: one small Spark job that asks each of them whether it can import this
project and reach the stream, so a missing install or a wrong endpoint is one line at start-up
instead of a stream of failed tasks every batch.

Each probe task answers with its process id and host (what tests use to see separate executor
processes), the kclpy-spark version it imported and, when the call failed, the error; the
driver turns the first failure, or an executor on another version than its own (the ranges it
plans would be read by other rules there), into one ``ExecutorProbeError`` line naming the cure.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

from checkpoint.base.errors import KclpySparkError, brief
from kclpy_spark.spark.cluster_read import default_parallelism
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.sink_batch import Interrupter

T = TypeVar("T")

PROBE_DDL = "pid bigint, host string, error string, version string"
PROBE_TIMEOUT = 5.0  # seconds for the executor's one DescribeStreamSummary call
# A probe job still waiting for executors after this long (a cluster with no free cores or memory
# for its tasks) is cancelled: start-up ends with one line instead of waiting for ever.
PROBE_DEADLINE = 600.0
_NO_MODULE = "No module named 'kclpy_spark'"
_INSTALL = (
    "install kclpy-spark (and its dependencies) in the executors' Python, or ship it with "
    "spark.archives / --py-files (README, the Spark section)"
)


# What a read on an executor imports (range_tasks, retrieval/range_reader): the probe imports it
# too, so an executor with boto3 but without aiobotocore fails here, not in every read task.
_READS_IMPORT = ("kclpy_spark.spark.range_tasks", "kclpy_spark.retrieval.range_reader",
                 "aiobotocore.session", "aiohttp", "msgspec")  # fmt: skip
_IMPORT_FAILED = "import failed: "


class ExecutorProbeError(KclpySparkError):
    """The executors cannot read: not importable there, or the stream out of their reach."""

    retriable = False


@dataclass(frozen=True)
class ProbeAnswer:
    pid: int
    host: str
    error: str | None
    version: str | None = None


def other_version(answers: list[ProbeAnswer], ours: str) -> ProbeAnswer | None:
    """The first executor that imported another kclpy-spark version than the driver's."""
    return next((a for a in answers if a.version != ours), None)


def within(run: Callable[[], T], jobs: Interrupter | None, deadline: float) -> T:
    """``run()`` (one Spark action on this thread), its jobs cancelled after ``deadline``
    seconds: ExecutorProbeError then. Without ``jobs``, no deadline."""
    if jobs is None:
        return run()
    tag = f"kclpy-spark-probe-{uuid.uuid4().hex[:8]}"
    overran = threading.Event()

    def cancel() -> None:
        overran.set()
        jobs.interrupt(tag)

    timer = threading.Timer(deadline, cancel)
    timer.daemon = True
    timer.start()
    try:
        with jobs.tagged(tag):
            return run()
    except Exception as exc:
        if overran.is_set():
            raise ExecutorProbeError(
                f"the start-up probe job did not finish within {deadline:.0f}s: no executor "
                "ran its tasks (a cluster without free cores or memory for them: Spark's log "
                "says 'Initial job has not accepted any resources')"
            ) from exc
        raise
    finally:
        timer.cancel()


def probe_executors(
    session: Any,
    aws: AwsTarget,
    stream_arg: Mapping[str, str],
    *,
    tasks: int | None = None,
    jobs: Interrupter | None = None,
    deadline: float = PROBE_DEADLINE,
) -> list[ProbeAnswer]:
    """Run ``tasks`` probe tasks (default: the session's default parallelism); raise
    ``ExecutorProbeError`` with one line if any could not import this project or reach the
    stream, or (with ``jobs``) the job did not end within ``deadline``; else every answer."""
    n = tasks or default_parallelism(session)
    probe = functools.partial(probe_partition, aws, dict(stream_arg))
    try:
        rows = within(
            lambda: session.range(0, n, 1, n).mapInArrow(probe, PROBE_DDL).collect(), jobs, deadline
        )
    except ExecutorProbeError:
        raise
    except Exception as exc:
        text = str(exc)
        if _NO_MODULE in text:
            raise ExecutorProbeError(
                f"the Spark executors cannot import kclpy_spark: {_INSTALL}"
            ) from exc
        raise ExecutorProbeError(
            f"the Spark executors could not run the probe job: {failure_cause(text)}"
        ) from exc
    answers = [ProbeAnswer(int(r["pid"]), str(r["host"]), r["error"], r["version"]) for r in rows]
    failed = next((a for a in answers if a.error), None)
    if failed is not None and failed.error and failed.error.startswith(_IMPORT_FAILED):
        raise ExecutorProbeError(
            f"a Spark executor on {failed.host} cannot import what its reads need "
            f"({failed.error.removeprefix(_IMPORT_FAILED)}): {_INSTALL}"
        )
    if failed is not None:
        where = aws.endpoint_url or f"the {aws.region} endpoint"
        raise ExecutorProbeError(
            f"a Spark executor on {failed.host} cannot reach Kinesis stream "
            f"{_stream_name(stream_arg)} at {where}: {failed.error}"
        )
    from kclpy_spark import __version__

    other = other_version(answers, __version__)
    if other is not None:
        raise ExecutorProbeError(
            f"a Spark executor on {other.host} runs kclpy-spark {other.version}, this worker "
            f"{__version__}: install the same version on both (or ship this one with "
            "spark.archives / --py-files)"
        )
    return answers


# Where a failed job's text names its cause: a worker Python that cannot start, a Python or a
# Java exception line (not the stack frames around them).
_CANNOT_RUN = re.compile(r"Cannot run program [^\n]*")
_EXCEPTION_LINE = re.compile(r"^(Caused by: )?[\w.$]*(Error|Exception)\b(: .*)?$")


def failure_cause(text: str) -> str:
    """The line of a failed Spark job's text that says why, in at most 300 characters."""
    found = _CANNOT_RUN.search(text)
    if found:
        return brief(
            f"{found.group(0).strip()} (the executors' Python: PYSPARK_PYTHON or "
            "spark.pyspark.python must name one that exists there)"
        )
    lines = [line.strip() for line in text.splitlines()]
    causes = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return brief(causes[-1] if causes else next((x for x in lines if x), text))


def _stream_name(stream_arg: Mapping[str, str]) -> str:
    return next(iter(stream_arg.values()), "?")


def probe_partition(
    aws: AwsTarget, stream_arg: dict[str, str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """On an executor: the imports its reads need, then one DescribeStreamSummary with a short
    deadline and no retries."""
    from kclpy_spark import __version__

    imported = None
    try:
        for module in _READS_IMPORT:
            importlib.import_module(module)
    except ImportError as exc:
        imported = f"{_IMPORT_FAILED}{type(exc).__name__}: {exc}"
    for batch in batches:
        error = imported or _reach(aws, stream_arg)
        n = batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([os.getpid()] * n, pa.int64()),
                pa.array([socket.gethostname()] * n, pa.string()),
                pa.array([error] * n, pa.string()),
                pa.array([__version__] * n, pa.string()),
            ],
            names=["pid", "host", "error", "version"],
        )


def _reach(aws: AwsTarget, stream_arg: dict[str, str]) -> str | None:
    """One DescribeStreamSummary from this executor: None, or why it failed (told to the
    driver, which makes it one line)."""
    import boto3

    from kclpy_spark.aws import botocore_config, endpoint_kwargs

    try:
        client = boto3.session.Session().client(
            "kinesis",
            config=botocore_config(timeout=PROBE_TIMEOUT, attempts=1),
            **endpoint_kwargs(aws.region, aws.endpoint_url),
        )
        client.describe_stream_summary(**stream_arg)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# --- a Parquet sink's folder on a cluster -------------------------------------------------------


def probe_shared_folder(
    session: Any,
    folder: Path,
    what: str,
    *,
    tasks: int | None = None,
    jobs: Interrupter | None = None,
    deadline: float = PROBE_DEADLINE,
) -> None:
    """On a cluster, a small Spark write of one row a task into ``folder``, the way the sink
    writes (its tasks write, the driver commits): when this worker then misses a task's file,
    the folder is a disk only some machines see (not a shared mount), which is one ConfigError
    naming ``what``. There Spark's commit found nothing to move, wrote _SUCCESS, and the piece
    was published empty while its checkpoint moved: its records were lost. JVM only: a worker
    that reads on the driver needs no Python on the executors."""
    from checkpoint.base.errors import ConfigError

    n = tasks or default_parallelism(session)
    marks = folder / f".kclpy-spark-shared-{uuid.uuid4().hex[:12]}"
    rows = session.range(0, n, 1, n).selectExpr("cast(id as string) as value")
    try:
        within(lambda: rows.write.text(marks.as_uri()), jobs, deadline)
        written = len(list(marks.glob("part-*"))) if marks.is_dir() else 0
    except ExecutorProbeError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    except Exception as exc:
        raise ConfigError(
            f"{what}: the executors could not write to {str(folder)!r}: {failure_cause(str(exc))}"
        ) from None
    finally:
        shutil.rmtree(marks, ignore_errors=True)
    problem = unshared(written, n, folder)
    if problem is not None:
        raise ConfigError(f"{what}: {problem}")


def unshared(written: int, tasks: int, folder: Path) -> str | None:
    """Why ``folder`` is not shared when this worker found ``written`` of ``tasks`` files."""
    if written >= tasks:
        return None
    return (
        f"{tasks - written} of {tasks} Spark tasks wrote to a folder {str(folder)!r} this worker "
        "does not see; on a cluster it must be on storage every executor and this worker share "
        "(a shared mount)"
    )
