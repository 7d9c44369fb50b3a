"""When the Parquet sink's writes use the no-chmod local filesystem (local_fs.py): only on a
``local[N]`` session that loads the class, asked once per SparkContext; and how the jar joins
``spark.jars``. Stand-ins for the session: these are the branches a real one cannot reach here
(tests/integration/test_local_fs.py covers the real one)."""

from __future__ import annotations

from typing import Any

import pytest

from kclpy_spark.spark import local_fs


class _Jvm:
    def __init__(self, loads: bool) -> None:
        self.loads = loads
        self.asked = 0
        self.java = self
        self.lang = self
        self.Thread = self
        self.Class = self

    def currentThread(self) -> Any:
        return self

    def getContextClassLoader(self) -> str:
        return "loader"

    def forName(self, name: str, initialize: bool, loader: str) -> str:
        self.asked += 1
        assert (name, initialize, loader) == (local_fs.CLASS, False, "loader")
        if not self.loads:
            raise RuntimeError("java.lang.ClassNotFoundException: " + name)
        return name


class _JavaContext:
    def __init__(self, local: bool) -> None:
        self.local = local

    def isLocal(self) -> bool:
        return self.local


class _Context:
    def __init__(self, local: bool, loads: bool = True) -> None:
        self._jsc = _JavaContext(local)
        self._jvm = _Jvm(loads)


class _Frame:
    def __init__(self, sc: _Context | None) -> None:
        self._sc = sc

    @property
    def sparkSession(self) -> Any:
        if self._sc is None:
            raise AttributeError("Spark Connect has no SparkContext")
        return type("S", (), {"sparkContext": self._sc})()


@pytest.mark.parametrize(
    ("local", "loads", "used"),
    [
        (True, True, True),
        (True, False, False),  # the jar is not on the session's classpath
        (False, True, False),  # executors in other JVMs (local-cluster, a cluster master)
    ],
)
def test_used_only_by_local_sessions_that_load_it(local: bool, loads: bool, used: bool) -> None:
    sc = _Context(local, loads)
    assert local_fs.write_options(_Frame(sc)) == (local_fs.OPTIONS if used else {})
    assert sc._jvm.asked == (1 if local else 0)  # not local: the class is not even looked for


def test_spark_connect_keeps_hadoops_default() -> None:
    assert local_fs.write_options(_Frame(None)) == {}


def test_the_class_is_looked_for_once_per_context() -> None:
    sc = _Context(local=True)
    for _ in range(5):
        assert local_fs.write_options(_Frame(sc)) == local_fs.OPTIONS
    assert sc._jvm.asked == 1


def test_the_options_name_the_class_and_bypass_hadoops_cache() -> None:
    assert local_fs.OPTIONS == {
        "fs.file.impl": "kclpyspark.NoForkLocalFileSystem",
        "fs.file.impl.disable.cache": "true",
    }
    assert local_fs.JAR.is_file()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, "{jar}"),
        ({"spark.jars": "/a.jar"}, "/a.jar,{jar}"),
        ({"spark.jars": "/a.jar, ,/b.jar"}, "/a.jar,/b.jar,{jar}"),
        ({"spark.jars": "{jar}"}, "{jar}"),  # not twice
    ],
)
def test_the_jar_joins_spark_jars(given: dict[str, str], expected: str) -> None:
    jar = str(local_fs.JAR)
    conf = {k: v.format(jar=jar) for k, v in given.items()}
    out = local_fs.with_jar({**conf, "spark.app.name": "x"})
    assert out["spark.jars"] == expected.format(jar=jar)
    assert out["spark.app.name"] == "x"
