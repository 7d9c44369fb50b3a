"""The configuration of the sessions this package starts: its defaults, the user's over them."""

from __future__ import annotations

from kclpy_spark.spark import local_fs
from kclpy_spark.spark.session import DEBUGGING, KRYO, SERIALIZER, SparkTarget, classic_conf

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
