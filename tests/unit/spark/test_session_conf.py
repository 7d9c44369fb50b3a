"""The configuration of the sessions this package starts: its defaults, the user's over them."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kclpy_spark.spark import local_fs
from kclpy_spark.spark.session import (
    DEBUGGING,
    KRYO,
    SERIALIZER,
    SparkSessionHolder,
    SparkTarget,
    _set_over_connect,
    classic_conf,
    spark_defaults,
)

THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


def test_batches_go_to_the_tasks_as_arrow_unless_the_user_says_otherwise() -> None:
    local = classic_conf(SparkTarget.parse("local[2]"), {})
    assert local[THRESHOLD] == "0"
    assert local["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert local["spark.driver.host"] == "127.0.0.1"  # a local master binds to loopback
    assert str(local_fs.JAR) in local["spark.jars"]
    cluster = classic_conf(SparkTarget.parse("spark://10.0.0.5:7077"), {THRESHOLD: "48MB"})
    assert cluster[THRESHOLD] == "48MB"
    assert "spark.driver.host" not in cluster and "spark.jars" not in cluster


def test_column_call_sites_are_not_recorded_unless_the_user_says_so() -> None:
    assert classic_conf(SparkTarget.parse("local[2]"), {})[DEBUGGING] == "false"
    assert classic_conf(SparkTarget.parse("local[2]"), {DEBUGGING: "true"})[DEBUGGING] == "true"


def test_records_are_serialized_with_kryo_unless_the_user_says_otherwise() -> None:
    assert classic_conf(SparkTarget.parse("local[2]"), {})[SERIALIZER] == KRYO
    java = "org.apache.spark.serializer.JavaSerializer"
    assert classic_conf(SparkTarget.parse("spark://h:7077"), {SERIALIZER: java})[SERIALIZER] == java


def test_the_sites_spark_defaults_outrank_ours_and_the_users_toml_outranks_both(
    tmp_path: Path,
) -> None:
    """Settings given to the builder outrank spark-defaults.conf: ours replaced a cluster's time
    zone, serializer, jars and driver JVM options (EMR's, Dataproc's, a Kerberos flag)."""
    (tmp_path / "spark-defaults.conf").write_text(
        "# the cluster's\n"
        "spark.sql.session.timeZone   America/New_York\n"
        "spark.serializer=org.apache.spark.serializer.JavaSerializer\n"
        "spark.driver.extraJavaOptions -Dmy.flag=1\n"
        "spark.jars: /site/user.jar\n"
        "spark.master yarn\n"  # spark_target says where the session runs
        "not.spark 1\n"
        "spark.executor.extraJavaOptions -Dfoo=1 \\\n"  # continued, as Java reads it
        "    -Dbar=2\n"
        "spark.app.tag\\:x   a\\\\b  \n"  # escapes: the key's colon, a backslash
    )
    site = spark_defaults({"SPARK_CONF_DIR": str(tmp_path)})
    assert site == {
        "spark.sql.session.timeZone": "America/New_York",
        "spark.serializer": "org.apache.spark.serializer.JavaSerializer",
        "spark.driver.extraJavaOptions": "-Dmy.flag=1",
        "spark.jars": "/site/user.jar",
        "spark.executor.extraJavaOptions": "-Dfoo=1 -Dbar=2",
        "spark.app.tag:x": "a\\b",
    }
    conf = classic_conf(SparkTarget.parse("local[2]"), {"spark.sql.session.timeZone": "UTC"}, site)
    assert conf["spark.sql.session.timeZone"] == "UTC"  # the TOML's spark_conf
    assert conf["spark.serializer"].endswith("JavaSerializer")
    assert conf["spark.driver.extraJavaOptions"] == "-Dmy.flag=1"
    assert conf["spark.jars"].split(",")[0] == "/site/user.jar"  # ours added after
    assert "spark.master" not in conf
    assert spark_defaults({"SPARK_HOME": str(tmp_path / "x")}) == {}


def test_a_setting_a_connect_server_keeps_for_itself_is_a_warning_not_a_failed_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The builder passed static and core settings over silently; set one by one after the
    short retry policy, they failed start-up (spark.sql.warehouse.dir, spark.executor.memory)."""

    class Conf:
        def __init__(self) -> None:
            self.set_ = {}

        def set(self, key: str, value: str) -> None:
            if key.startswith("spark.executor"):
                raise RuntimeError(f"[CANNOT_MODIFY_CONFIG] Cannot modify {key}")
            if key == "broken":
                raise RuntimeError("the server is gone")
            self.set_[key] = value

    session = SimpleNamespace(conf=Conf())
    _set_over_connect(session, "spark.executor.memory", "2g")
    _set_over_connect(session, "spark.sql.shuffle.partitions", "4")
    assert session.conf.set_ == {"spark.sql.shuffle.partitions": "4"}
    assert "spark.executor.memory" in caplog.text
    with pytest.raises(RuntimeError, match="gone"):
        _set_over_connect(session, "broken", "x")


@pytest.mark.parametrize(
    ("master", "target"),
    [
        ("local[4]", "local[4]"),
        ("spark://10.0.0.5:7077", "spark://10.0.0.5:7077"),
        ("yarn", "yarn"),
        ("mesos://old:5050", "spark://adopted:7077"),  # none we know: capped as a cluster's
    ],
)
def test_an_adopted_session_keeps_its_own_master(master: str, target: str) -> None:
    """Every classic session was labelled local[2]: an adopted cluster session's batches were
    not capped below its task-size limit."""
    session = SimpleNamespace(sparkContext=SimpleNamespace(master=master))
    assert SparkSessionHolder.adopt(session).target.master == target


def test_a_session_that_does_not_stop_is_left_after_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A JVM that answers no more held the process past SIGTERM's grace until SIGKILL."""
    import threading

    never = threading.Event()
    holder = SparkSessionHolder("local[1]")
    holder._session = SimpleNamespace(stop=lambda: never.wait(30))
    holder.stop(timeout=0.05)
    never.set()
    assert holder._session is None and "did not stop" in caplog.text


def test_a_session_whose_jvm_is_already_gone_stops_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A supervisor that signals the whole process group (systemd's default, ``kill -TERM --
    -pgid``) stops Spark's JVM as the daemon stops: the session's stop then failed in its
    thread, logged as an uncaught exception with two tracebacks after a clean stop."""
    import threading

    uncaught: list[Any] = []
    hook, threading.excepthook = threading.excepthook, uncaught.append

    def refused() -> None:
        raise ConnectionRefusedError(111, "Connection refused")

    try:
        holder = SparkSessionHolder("local[1]")
        holder._session = SimpleNamespace(stop=refused)
        with caplog.at_level(logging.INFO):
            holder.stop(timeout=5.0)
    finally:
        threading.excepthook = hook
    assert uncaught == []
    [line] = [r for r in caplog.records if r.name == "kclpy_spark.spark.session"]
    assert line.levelno == logging.INFO and "already gone" in line.getMessage()
    assert line.exc_info is None
