"""Spark's own log lines (its JVM's log4j) in the daemon's shape: the same stderr, the same text
or JSON format, at the level ``--log-level`` gives, without the start-up noise.

Local and cluster-client Spark start their driver JVM from this process, so its logging is set
before that start: a log4j2 configuration written here and named in ``PYSPARK_SUBMIT_ARGS``
(unless the user set that variable). Spark at INFO is very talkative, so the daemon's INFO keeps
Spark at WARN; DEBUG shows Spark's INFO.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The daemon's level -> Spark's.
LEVELS = {"DEBUG": "INFO", "INFO": "WARN", "WARNING": "WARN", "ERROR": "ERROR",
          "CRITICAL": "FATAL"}  # fmt: skip
# Lines that say nothing a user can act on: the native-Hadoop notice, the shutdown hook's list,
# and Parquet's memory manager, which warns at every writer opened or closed once 8 or more are
# open in one JVM (128 MiB row groups each would not fit a 1 GiB heap) and shrinks their row
# groups: a batch of many pieces is written with a writer a piece open at once (session.py's
# SQL_DEFAULTS), each piece far smaller than a row group (~2 lines a second at 24 shards).
QUIET = (
    "org.apache.hadoop.util.NativeCodeLoader",
    "org.apache.spark.util.ShutdownHookManager",
    "org.apache.parquet.hadoop.MemoryManager",
)

_TEXT = "%d{yyyy-MM-dd HH:mm:ss,SSS} %-7p spark.%c{1}: %m%n%ex"
_JSON = (
    '{"time":"%d{yyyy-MM-dd\'T\'HH:mm:ss.SSS\'Z\'}{UTC}","level":"%p","logger":"spark.%c{1}",'
    '"message":"%enc{%m}{JSON}","exception":"%enc{%ex}{JSON}"}%n'
)


def spark_level(level: str) -> str:
    return LEVELS.get(level.upper(), "WARN")


# local[N] only: a micro-batch lives in the driver and travels inside its task, so every batch
# over 1000 KiB made Spark warn of a "task of very large size" it cannot avoid in one process.
LOCAL_ONLY_QUIET = ("org.apache.spark.scheduler.TaskSetManager",)


def log4j2_properties(level: str, fmt: str, *, local: bool = False) -> str:
    """A log4j2 properties file: one console appender on stderr in the daemon's format."""
    pattern = _JSON if fmt == "json" else _TEXT
    lines = [
        "status = error",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        f"appender.console.layout.pattern = {pattern}",
        f"rootLogger.level = {spark_level(level)}",
        "rootLogger.appenderRef.stderr.ref = console",
        # A PySpark driver counts as a shell: Spark sets the root level to this logger's (WARN
        # if unset), saying so on stderr, unless the two agree.
        "logger.repl.name = org.apache.spark.repl.Main",
        f"logger.repl.level = {spark_level(level)}",
    ]
    for i, name in enumerate(QUIET + (LOCAL_ONLY_QUIET if local else ())):
        lines += [f"logger.quiet{i}.name = {name}", f"logger.quiet{i}.level = error"]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def jvm_logging(
    level: str,
    fmt: str,
    directory: Path | None = None,
    *,
    local: bool = False,
    java_options: str = "",
) -> Iterator[Path | None]:
    """Around the start of the driver JVM: write the configuration (in a new private folder
    under ``directory``, the system's temporary one by default) and name it for the JVM; gone
    again afterwards (it is read once, at the start). Does nothing (yields None) if the user set
    ``PYSPARK_SUBMIT_ARGS`` or a JVM runs already.

    The configuration is named with ``--driver-java-options``, which takes the place of the
    ``spark.driver.extraJavaOptions`` setting: pass that setting as ``java_options`` and it is
    kept (after ours, so a ``-Dlog4j2.configurationFile`` of the user's wins)."""
    if "PYSPARK_SUBMIT_ARGS" in os.environ or _jvm_running():
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="kclpy-spark-log4j-", dir=directory))
    path = folder / "log4j2.properties"
    path.write_text(log4j2_properties(level, fmt, local=local), encoding="utf-8")
    options = f"-Dlog4j2.configurationFile={path.resolve().as_uri()} {java_options}".strip()
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--driver-java-options {shlex.quote(options)} pyspark-shell"
    )
    try:
        yield path
    finally:
        os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        shutil.rmtree(folder, ignore_errors=True)


def _jvm_running() -> bool:
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._active_spark_context is not None
