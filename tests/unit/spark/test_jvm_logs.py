"""Spark's JVM logging in the daemon's shape (issue 18): the configuration written before the
driver JVM starts, and nothing left behind."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from kclpy_spark.spark import jvm_logs
from kclpy_spark.spark.jvm_logs import jvm_logging, log4j2_properties, spark_level


@pytest.mark.parametrize(
    ("daemon", "spark"),
    [("DEBUG", "INFO"), ("INFO", "WARN"), ("warning", "WARN"), ("ERROR", "ERROR"), ("x", "WARN")],
)
def test_levels(daemon: str, spark: str) -> None:
    assert spark_level(daemon) == spark


def test_the_text_format_matches_the_daemons_and_quiets_the_noise() -> None:
    text = log4j2_properties("INFO", "text")
    assert "appender.console.target = SYSTEM_ERR" in text
    assert "%d{yyyy-MM-dd HH:mm:ss,SSS} %-7p spark.%c{1}: %m%n" in text  # logs.TEXT_FORMAT's shape
    assert "rootLogger.level = WARN" in text and "logger.repl.level = WARN" in text
    assert "org.apache.hadoop.util.NativeCodeLoader" in text
    assert "logger.quiet2.name = org.apache.parquet.hadoop.MemoryManager" in text
    assert "TaskSetManager" not in text  # on a cluster a large task costs network: kept
    assert "org.apache.spark.scheduler.TaskSetManager" in log4j2_properties("INFO", "text",
                                                                            local=True)  # fmt: skip


def test_the_json_format_escapes_the_message() -> None:
    text = log4j2_properties("DEBUG", "json")
    assert '"message":"%enc{%m}{JSON}"' in text and "rootLogger.level = INFO" in text


def test_the_configuration_is_named_for_the_jvm_start_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setattr(jvm_logs, "_jvm_running", lambda: False)
    with jvm_logging("INFO", "text", tmp_path) as path:
        assert path is not None and path.exists()
        args = os.environ["PYSPARK_SUBMIT_ARGS"]
        assert args.startswith("--driver-java-options ") and args.endswith(" pyspark-shell")
        assert path.resolve().as_uri() in args
    assert "PYSPARK_SUBMIT_ARGS" not in os.environ and not path.exists()
    assert list(tmp_path.iterdir()) == []  # its private folder went with it


def test_the_users_driver_java_options_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --driver-java-options takes the place of spark.driver.extraJavaOptions: both must be in it
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setattr(jvm_logs, "_jvm_running", lambda: False)
    user = "-XX:+UseParallelGC -Dname='two words'"
    with jvm_logging("INFO", "text", tmp_path, java_options=user) as path:
        assert path is not None
        args = shlex.split(os.environ["PYSPARK_SUBMIT_ARGS"])  # as pyspark's launcher splits it
        assert args[0] == "--driver-java-options" and args[2:] == ["pyspark-shell"]
        assert args[1] == f"-Dlog4j2.configurationFile={path.resolve().as_uri()} {user}"


def test_a_users_submit_args_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 2g pyspark-shell")
    monkeypatch.setattr(jvm_logs, "_jvm_running", lambda: False)
    with jvm_logging("INFO", "text", tmp_path) as path:
        assert path is None
    assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--driver-memory 2g pyspark-shell"
    assert list(tmp_path.iterdir()) == []
