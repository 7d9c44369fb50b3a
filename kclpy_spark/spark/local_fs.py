"""Parquet writes to a local path without a ``chmod`` process per file.

Hadoop's local filesystem sets the mode of every folder it makes and every file it creates;
without Hadoop's native library (pip's pyspark ships none) it does so by starting ``chmod``: ~5 ms
of CPU each here, and a Parquet sink's batch makes some thirty (staging folders, one folder and one
file per piece per task, their ``.crc`` checksums). ``NoForkLocalFileSystem`` (``java/``, built
into ``kclpy-spark-localfs.jar`` by ``scripts/build_localfs_jar.sh``) sets the same bits with a
system call, and writes no ``.crc`` files (it is the raw filesystem).

It is used only where it is surely loadable: a ``local[N]`` session (driver and tasks in one JVM)
whose classpath has the jar. A session this package builds for a ``local[N]`` target gets the jar
(``with_jar``); an adopted session has it only if its owner put ``JAR`` in ``spark.jars`` when
building it (the JVM loads those jars at its start). The choice is per write (``write_options``),
never the session's ``file:`` scheme: the user's own reads and writes keep Hadoop's default
filesystem.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JAR = Path(__file__).parent / "java" / "kclpy-spark-localfs.jar"
CLASS = "kclpyspark.NoForkLocalFileSystem"
# Per write: the file: scheme's class, and no cached instance (Hadoop caches one filesystem per
# scheme for the whole JVM; a cached default one would be handed out regardless of the class).
OPTIONS: Mapping[str, str] = {"fs.file.impl": CLASS, "fs.file.impl.disable.cache": "true"}

_checked: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def with_jar(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the jar added to ``spark.jars`` (kept: the jars already there)."""
    jars = [j for j in conf.get("spark.jars", "").split(",") if j.strip()]
    if str(JAR) not in jars and JAR.is_file():
        jars.append(str(JAR))
    return {**conf, "spark.jars": ",".join(jars)} if jars else dict(conf)


def write_options(df: Any) -> Mapping[str, str]:
    """The options that make ``df``'s Parquet write use ``NoForkLocalFileSystem``, if its session
    is a ``local[N]`` one that can load the class; else none (Hadoop's default)."""
    try:
        sc = df.sparkSession.sparkContext
    except Exception:  # Spark Connect: no SparkContext here (and the server's JVM is not ours)
        return {}
    with _lock:
        usable = _checked.get(sc)
        if usable is None:
            usable = _checked[sc] = _usable(sc)
    return OPTIONS if usable else {}


def _usable(sc: Any) -> bool:
    try:
        if not sc._jsc.isLocal():  # Spark's own rule: tasks in this JVM (local, local[...])
            return False  # executors elsewhere: each would need the jar too
        jvm = sc._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(CLASS, False, loader)
    except Exception:
        log.info("Parquet writes use Hadoop's local filesystem (%s is not on the classpath)", CLASS)
        return False
    return True
