"""The start-up probe's rules (executor_probe.py): which answer is on another kclpy-spark version
than the driver's, and what a probe task answers (its version beside its error)."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from kclpy_spark import __version__
from kclpy_spark.spark.executor_probe import (
    ExecutorProbeError,
    ProbeAnswer,
    failure_cause,
    other_version,
    probe_partition,
    within,
)
from kclpy_spark.spark.range_tasks import AwsTarget


@pytest.mark.parametrize(
    ("versions", "other"),
    [
        (["1.2.0", "1.2.0"], None),  # every executor on the driver's version
        (["1.2.0", "1.1.0"], 1),  # one on an older one: named
        ([None], 0),  # an answer without a version (an executor older than the check)
        ([], None),
    ],
)
def test_an_executor_on_another_version_is_found(
    versions: list[str | None], other: int | None
) -> None:
    answers = [ProbeAnswer(i, f"host-{i}", None, v) for i, v in enumerate(versions)]
    found = other_version(answers, "1.2.0")
    assert found == (None if other is None else answers[other])


def test_a_probe_task_answers_with_its_version_and_its_error() -> None:
    unreachable = AwsTarget("us-east-1", "http://127.0.0.1:9")  # refused at once
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1], pa.int64())], names=["id"])
    [answer] = list(probe_partition(unreachable, {"StreamName": "s"}, iter([batch])))
    rows = answer.to_pylist()
    assert [r["version"] for r in rows] == [__version__, __version__]
    assert all(r["error"] for r in rows)  # the endpoint refused the call


def test_a_probe_task_fails_where_the_reads_cannot_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """It imported boto3 only: an executor without aiobotocore passed, then failed every range."""
    monkeypatch.setitem(sys.modules, "aiobotocore.session", None)  # import raises ImportError
    reachable = AwsTarget("us-east-1", "http://127.0.0.1:9")
    batch = pa.RecordBatch.from_arrays([pa.array([0], pa.int64())], names=["id"])
    [answer] = list(probe_partition(reachable, {"StreamName": "s"}, iter([batch])))
    [row] = answer.to_pylist()
    assert row["error"].startswith("import failed: ") and "aiobotocore" in row["error"]


JVM_TEXT = """An error occurred while calling o85.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed
java.io.IOException: Cannot run program "/nonexistent/bin/python": error=2, No such file
\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
\tat org.apache.spark.util.SparkErrorUtils.tryWithSafeFinally(SparkErrorUtils.scala:86)
"""
PYTHON_TEXT = """org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/worker.py", line 1, in main
    at org.apache.spark.util.Utils$.tryOrIOException(Utils.scala:1)
ValueError: the answer was not Arrow
\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)
"""


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        # It named a stack frame (SparkErrorUtils...): the first line with "Error" in it.
        (JVM_TEXT, 'Cannot run program "/nonexistent/bin/python"'),
        (PYTHON_TEXT, "ValueError: the answer was not Arrow"),
        ("no exception named here", "no exception named here"),
    ],
)
def test_a_failed_probe_job_is_named_by_its_cause(text: str, needle: str) -> None:
    cause = failure_cause(text)
    assert needle in cause and "tryWithSafeFinally" not in cause and len(cause) <= 300


class Jobs:
    """Spark's job tags as the session holder offers them: an interrupt ends the tagged run."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.tags: list[str] = []

    @contextlib.contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        self.tags.append(tag)
        yield

    def interrupt(self, tag: str) -> None:
        assert tag == self.tags[-1]
        self.cancelled.set()


def test_a_probe_job_no_executor_runs_ends_at_its_deadline_with_one_line() -> None:
    """A standalone cluster without free cores or memory for its tasks: start-up waited for
    ever (Spark logging "Initial job has not accepted any resources")."""
    jobs = Jobs()

    def waits_for_resources() -> list[Any]:
        assert jobs.cancelled.wait(10)
        raise RuntimeError("Job 0 cancelled part of cancelled job tag kclpy-spark-probe")

    with pytest.raises(ExecutorProbeError, match="did not finish within 0s") as err:
        within(waits_for_resources, jobs, 0.05)
    assert "\n" not in str(err.value)
    assert within(lambda: ["answer"], jobs, 10.0) == ["answer"]  # in time: its answer
    assert within(lambda: ["answer"], None, 0.0) == ["answer"]  # no jobs to cancel: no deadline


def test_an_import_error_while_making_the_client_is_a_failed_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was caught as the imports' own ImportError and passed over: the probe said yes."""
    import boto3

    def broken(*_: Any, **__: Any) -> Any:
        raise ImportError("botocore lacks a module this client needs")

    monkeypatch.setattr(boto3.session.Session, "client", broken)
    batch = pa.RecordBatch.from_arrays([pa.array([0], pa.int64())], names=["id"])
    [answer] = list(
        probe_partition(AwsTarget("us-east-1", None), {"StreamName": "s"}, iter([batch]))
    )
    assert "botocore lacks a module" in answer.to_pylist()[0]["error"]


@pytest.mark.parametrize(("value", "refused"), [(None, False), ("false", False), ("TRUE", True)])
def test_reading_on_the_executors_refuses_speculation(value: str | None, refused: bool) -> None:
    """A speculative copy of a read task reads the shard again and may keep other records for
    the same partition: one line at start-up, not records lost or twice. (A session's
    ``conf.get`` answers the settings it started with, spark-defaults.conf's included; Spark does
    not let a test change this one on a running session.)"""
    from types import SimpleNamespace

    from checkpoint.base.errors import ConfigError
    from kclpy_spark.spark.sink_setup import refuse_speculation

    settings = {} if value is None else {"spark.speculation": value}
    session = SimpleNamespace(conf=SimpleNamespace(get=settings.get))
    if refused:
        with pytest.raises(ConfigError, match=r"spark\.speculation off"):
            refuse_speculation(session)
    else:
        refuse_speculation(session)
