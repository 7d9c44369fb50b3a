"""One SparkSession for the sink, chosen by one setting, the *Spark target*:

* ``local[N]`` (default ``local[2]``), ``local[*]``, ``local``: a JVM in this process; the driver
  binds to 127.0.0.1.
* a cluster master: ``spark://host:port``, ``yarn``, ``k8s://...``, ``local-cluster[...]``; this
  worker is the driver, in client mode. Tasks carry the batch's rows, and a task larger than
  ``spark.rpc.message.maxSize`` (128 MiB) fails, so batches are capped below it.
* ``sc://host:port``: a Spark Connect server; no local JVM at all (needs grpcio and friends).

Before a JVM is started, ``java`` is looked for (``JAVA_HOME``, then ``PATH``) and a missing or too
old Java is a ConfigError that says so. PYSPARK_DRIVER_PYTHON defaults to this interpreter, and
PYSPARK_PYTHON too where the executors run on this machine (elsewhere PySpark's ``python3``
unless set: python_defaults). A session's settings: its defaults, then the site's
spark-defaults.conf, then ``[sink.spark_conf]`` (classic_conf). The Connect client retries a dead
server for 10+ minutes by default; here a few seconds.

pyspark is imported inside the functions, never at module import.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from checkpoint.base.errors import ConfigError
from kclpy_spark.logs import configured
from kclpy_spark.spark import local_fs
from kclpy_spark.spark.jvm_garbage import JvmGarbage
from kclpy_spark.spark.jvm_heap import HeapFigures, HeapSampler, read_heap
from kclpy_spark.spark.jvm_logs import jvm_logging, spark_level
from kclpy_spark.spark.py4j_args import pass_plain_arguments

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Spark's default spark.rpc.message.maxSize (MiB). A task holds its share of the batch's rows, plus
# overhead: keep batches at 3/4 of the limit.
DEFAULT_RPC_MAX_MIB = 128
TASK_SIZE_SHARE = 0.75
MIN_JAVA = 17
_LOCAL = re.compile(r"^local(\[([1-9]\d*|\*)(,\d+)?\])?$")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Over Connect, createDataFrame uploads a table larger than this threshold (1 MiB by default) as a
# cached artifact that the server keeps until the session ends: ~30 MB of heap per 100k rows, a
# leak for a long-running sink. Above any batch size, tables travel inline in the plan and are
# freed with it (measured: heap flat over 12 batches of 100k rows, same speed). The gRPC message
# limit (128 MiB) then bounds a batch, hence max_batch_bytes below.
CONNECT_DEFAULTS = {"spark.sql.session.localRelationCacheThreshold": str(1024 * MIB)}
# A batch of several leases is written partitioned by piece (ParquetSink): with concurrent output
# writers Spark skips sorting each task's rows by piece (measured: 1.19 s instead of 1.46 s for
# 100k rows in 4 pieces; an unpartitioned write of the same rows took 0.95 s).
SQL_DEFAULTS = {"spark.sql.maxConcurrentOutputFileWriters": "64"}
# PySpark 4 records the Python call site of every Column function (F.col, F.lit, F.expr, ...) in
# the driver JVM for its error messages: about ten more calls to the JVM per function, each tens
# of microseconds of the driver's Python, on every batch and read job. The DataFrames this package
# builds are its own; ``[sink.spark_conf]`` can turn it on for a foreachBatch function's errors.
DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
# What Spark serializes records and blocks with. Reading on the executors stores each read's rows
# serialized until its sinks wrote them (cluster_read.py): Java's serialization of them, and
# reading them back, were a fifth of the JVM's samples at 24 shards (JFR), Kryo's half that; the
# whole path 0.96x the JVM's CPU per record (median of 5 pairs), the driver path unchanged
# (bench/results/kryo-fewer-calls.md). A foreachBatch function's own RDD jobs use it too;
# ``[sink.spark_conf]`` can set Java's back.
SERIALIZER = "spark.serializer"
KRYO = "org.apache.spark.serializer.KryoSerializer"
# A DataFrame made from Arrow below this many bytes becomes a local relation in the driver JVM:
# its rows are converted there in one thread, walked by every analyser rule, and Java-serialized
# into the tasks, one object a row. At 0 the Arrow batches go to the tasks as they are, which
# convert them in parallel (the same rows and files). Measured on the whole path at 16 shards
# (bench_pipeline.py, "parquet" against "parquet local relation"): see BENCHMARKS.md.
CLASSIC_DEFAULTS = {
    "spark.ui.enabled": "false",
    DEBUGGING: "false",
    SERIALIZER: KRYO,
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    "spark.sql.session.timeZone": "UTC",
    **SQL_DEFAULTS,
}


class TargetKind(enum.StrEnum):
    LOCAL = "local"
    CLUSTER = "cluster"
    CONNECT = "connect"


def python_defaults(target: SparkTarget) -> dict[str, str]:
    """The Python interpreters PySpark starts, unless the environment names them: the driver's is
    this one; the executors' too only where they run on this machine (elsewhere PySpark's default,
    python3, unless PYSPARK_PYTHON or spark.pyspark.python names theirs: a venv path of the driver
    is rarely there, and every Python task failed to start)."""
    found = {"PYSPARK_DRIVER_PYTHON": sys.executable}
    if target.loopback:
        found["PYSPARK_PYTHON"] = sys.executable
    return found


@dataclass(frozen=True)
class SparkTarget:
    master: str
    kind: TargetKind

    @classmethod
    def parse(cls, text: str) -> SparkTarget:
        value = text.strip()
        if value.startswith("sc://"):
            url = urlparse(value)
            if not url.hostname:
                raise ConfigError(f"spark_target {text!r}: a Connect URL is sc://host:port")
            return cls(value, TargetKind.CONNECT)
        if _LOCAL.match(value):
            return cls(value, TargetKind.LOCAL)
        if value == "yarn" or value.startswith(("spark://", "k8s://", "local-cluster[")):
            return cls(value, TargetKind.CLUSTER)
        raise ConfigError(
            f"spark_target {text!r} is not one of local[N], spark://host:port, yarn, k8s://..., "
            "local-cluster[...] or sc://host:port"
        )

    @property
    def loopback(self) -> bool:
        """Driver and executors on this machine only: bind the driver to 127.0.0.1."""
        if self.kind is TargetKind.LOCAL or self.master.startswith("local-cluster["):
            return True
        if self.master.startswith("spark://"):
            hosts = [h.rsplit(":", 1)[0] for h in self.master[len("spark://") :].split(",")]
            return all(h in _LOOPBACK for h in hosts)
        return False


def find_java() -> str:
    """The java binary Spark will start (JAVA_HOME's, else PATH's); ConfigError if none or < 17."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH, JAVA_HOME unset"
        raise ConfigError(
            f"the Spark sink needs Java {MIN_JAVA}+ for a local or cluster Spark target ({where}). "
            "Install a JDK (e.g. apt-get install openjdk-17-jre-headless) or use a Spark Connect "
            "target: spark_target = 'sc://host:15002'"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {java} -version: {exc}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_392"
            major = int(match.group(2))
        if major < MIN_JAVA:
            raise ConfigError(
                f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA}+ (set JAVA_HOME to one)"
            )
    return java


def classic_conf(
    target: SparkTarget, user: Mapping[str, str], site: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The configuration of a session this package starts (not over Connect): its defaults,
    then the site's ``spark-defaults.conf`` (``site``; read from SPARK_CONF_DIR or
    SPARK_HOME/conf when None), then the user's ``spark_conf`` over them. Settings given to the
    builder outrank spark-defaults.conf, so without reading it ours replaced a cluster's time
    zone, jars and JVM options."""
    defaults = dict(CLASSIC_DEFAULTS)
    if target.loopback:
        defaults["spark.driver.host"] = "127.0.0.1"
        defaults["spark.driver.bindAddress"] = "127.0.0.1"
    conf = {**defaults, **(spark_defaults() if site is None else site), **user}
    if target.kind is TargetKind.LOCAL:  # the Parquet sink's writes then fork no chmod (local_fs)
        conf = local_fs.with_jar(conf)
    return conf


def spark_defaults(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The ``spark.*`` settings of the ``spark-defaults.conf`` spark-submit reads (in
    SPARK_CONF_DIR, else SPARK_HOME/conf, SPARK_HOME being pip pyspark's own folder when unset):
    Java properties (continued lines and escapes as Java reads them), values trimmed as Spark
    does; none when there is no such file."""
    folder = environ.get("SPARK_CONF_DIR")
    if not folder:
        home = environ.get("SPARK_HOME") or _pyspark_home()
        folder = os.path.join(home, "conf") if home else None
    if folder is None:
        return {}
    try:
        text = Path(folder, "spark-defaults.conf").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    from kclpy_spark.multilang.javaprops import parse_properties

    found = parse_properties(text, source=str(Path(folder, "spark-defaults.conf")))
    return {  # spark_target says where the session runs
        k: v.strip() for k, v in found.items() if k.startswith("spark.") and k != "spark.master"
    }


def _pyspark_home() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


# Half of spark.sql.execution.arrow.maxRecordsPerBatch (10,000), by which PySpark slices a table.
SMALL_CHUNK_ROWS = 5_000


def _fewer_chunks(table: Any) -> Any:
    """``table`` with its chunks combined when they are small on average: once batches go to the
    tasks as Arrow (CLASSIC_DEFAULTS), one Arrow batch is one task and one file a piece, so a
    batch of many small pages would make as many tiny tasks. Full pages (the usual chunk while
    catching up) are left as they are: combining copies every byte."""
    chunks = table.column(0).num_chunks if table.num_columns else 0
    if chunks > 1 and table.num_rows < SMALL_CHUNK_ROWS * chunks:
        return table.combine_chunks()
    return table


def _set_over_connect(session: Any, key: str, value: str) -> None:
    """One setting of a Connect session; one the server keeps for itself (a static or core
    setting: the builder passed those over silently) is a WARNING, not a failed start."""
    try:
        session.conf.set(key, value)
    except Exception as exc:
        if "CANNOT_MODIFY" not in str(exc):
            raise
        log.warning("spark_conf %s cannot be set over Spark Connect (the server's): ignored", key)


# How long stop() waits for the session's own stop (its JVM's shutdown), after the worker's
# shutdown_grace (docs/getting-started.md adds the parts of a stop up).
STOP_TIMEOUT = 8.0


def _target_of(session: Any) -> str:
    """An adopted classic session's master as a Spark target (a cluster one when it is none we
    know: its batches are then capped below the task-size limit, as a cluster's must be)."""
    try:
        master = str(session.sparkContext.master)
        SparkTarget.parse(master)
    except Exception:
        return "spark://adopted:7077"
    return master


def _stop_session(session: Any) -> None:
    """``session.stop()``, saying in one line when Spark's JVM was gone already: a supervisor
    that signals the daemon's whole process group (systemd's default) stops the JVM as the daemon
    stops, and the batches it had not written are read again from their checkpoints."""
    try:
        session.stop()
    except Exception as exc:
        if isinstance(exc, OSError) or type(exc).__name__ == "Py4JNetworkError":
            log.info("Spark's JVM was already gone when its session was stopped (%s)", exc)
        else:
            log.warning("stopping the Spark session failed: %r", exc)


class SparkSessionHolder:
    """The sink's SparkSession, built on first use; also builds the batch DataFrames (decoding
    the payload when a value schema is set) and cancels writes by job tag."""

    def __init__(
        self,
        target: SparkTarget | str = "local[2]",
        *,
        app_name: str = "kclpy-spark",
        conf: Mapping[str, str] | None = None,
        value_schema: str | None = None,
        keep_raw_data: bool = False,
        connect_max_retries: int = 3,
        jvm_garbage: JvmGarbage | None = None,
    ) -> None:
        """``jvm_garbage``: when Python's cycles are collected (default: ``JvmGarbage()``;
        never over Spark Connect, which has no JVM here)."""
        self.target = SparkTarget.parse(target) if isinstance(target, str) else target
        self._app_name = app_name
        self._conf = dict(conf or {})
        self._value_schema = value_schema
        self._keep_raw = keep_raw_data
        self._connect_max_retries = connect_max_retries
        self._session: Any = None
        self._owned = True
        self._columns_checked = False
        self._value_fields: list[str] | None = None
        self._lock = threading.Lock()
        # py4j objects live in reference cycles: bound what dead batches pin in the driver JVM.
        # (Spark Connect has no JVM here, and its client objects are freed as they die.)
        local_jvm = self.target.kind is not TargetKind.CONNECT
        self.jvm_garbage = (jvm_garbage or JvmGarbage()) if local_jvm else None
        # The driver's heap for the metrics, read in the writer threads (never by a scrape).
        self.heap = HeapSampler(self._read_heap) if local_jvm else None

    @classmethod
    def adopt(cls, session: Any, **kwargs: Any) -> SparkSessionHolder:
        """Use an existing session (not stopped by ``stop()``)."""
        remote = type(session).__module__.startswith("pyspark.sql.connect")
        target = "sc://adopted:15002" if remote else _target_of(session)
        holder = cls(target, **kwargs)
        holder._session = session
        holder._owned = False
        if not remote:
            pass_plain_arguments()
        return holder

    # --- the session -----------------------------------------------------------------------------

    def session(self) -> Any:
        with self._lock:
            if self._session is None:
                self._session = self._build()
            return self._session

    def _build(self) -> Any:
        t = self.target
        for name, value in python_defaults(t).items():
            os.environ.setdefault(name, value)
        from pyspark.sql import SparkSession

        if t.kind is TargetKind.CONNECT:
            # Settings given to the builder are sent by getOrCreate() itself, under Spark's own
            # retry policy (15 tries, about 10 minutes against a server that is down): the short
            # policy goes first, then the settings.
            session = SparkSession.builder.remote(t.master).getOrCreate()
            self._short_connect_retries(session)
            for key, value in {**CONNECT_DEFAULTS, **SQL_DEFAULTS, **self._conf}.items():
                _set_over_connect(session, key, value)
            log.info("Spark Connect session to %s", t.master)
            return session
        find_java()
        pass_plain_arguments()  # every call to the JVM from here on: less of the driver's CPU
        if t.loopback:
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = SparkSession.builder.master(t.master).appName(self._app_name)
        conf = classic_conf(t, self._conf)
        for key, value in conf.items():
            builder = builder.config(key, value)
        level, fmt = configured()
        local = t.kind is TargetKind.LOCAL
        java_options = conf.get("spark.driver.extraJavaOptions", "")
        with jvm_logging(level, fmt, local=local, java_options=java_options):
            session = builder.getOrCreate()
        session.sparkContext.setLogLevel(self._conf.get("kclpy.logLevel", spark_level(level)))
        log.info("Spark session on %s (Spark %s)", t.master, session.version)
        return session

    def _short_connect_retries(self, session: Any) -> None:
        try:
            from pyspark.sql.connect.client.retries import DefaultPolicy

            policy = DefaultPolicy(
                max_retries=self._connect_max_retries, initial_backoff=200, max_backoff=2000
            )
            session.client.set_retry_policies([policy])
        except Exception:  # an internal API: if it moved, keep Spark's default policy
            log.warning("could not shorten the Spark Connect retry policy", exc_info=True)

    def _read_heap(self) -> HeapFigures:
        return read_heap(self.session().sparkContext._jvm)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the session this holder started, waiting at most ``timeout`` seconds (a JVM that
        answers no more must not hold the process past its shutdown grace)."""
        with self._lock:
            session, self._session = self._session, None
        if session is None or not self._owned:
            return
        stopping = threading.Thread(
            target=_stop_session, args=(session,), name="kclpy-spark-stop", daemon=True
        )
        stopping.start()
        stopping.join(timeout)
        if stopping.is_alive():
            log.warning("the Spark session did not stop within %.0fs; leaving it", timeout)

    def max_batch_bytes(self) -> int | None:
        """The largest batch (Arrow bytes) that stays under the task-size limit; None if none."""
        if self.target.kind is TargetKind.LOCAL:
            return None
        try:
            if self.target.kind is TargetKind.CONNECT:  # a batch is one gRPC message (bytes)
                raw = self._conf.get("spark.connect.grpc.maxInboundMessageSize")
                limit = int(raw) if raw else DEFAULT_RPC_MAX_MIB * MIB
            else:  # a task is one RPC message (MiB)
                raw = self._conf.get("spark.rpc.message.maxSize", str(DEFAULT_RPC_MAX_MIB))
                limit = int(str(raw).lower().removesuffix("m")) * MIB
        except ValueError:
            limit = DEFAULT_RPC_MAX_MIB * MIB
        return int(limit * TASK_SIZE_SHARE)

    def check_value_schema(self) -> None:
        """Raise ConfigError (one line) now if ``value_schema`` is not a DDL schema Spark can
        parse JSON into, instead of at the first write."""
        if not self._value_schema:
            return
        from kclpy_spark.spark.pieces import SCHEMA

        try:
            self.to_df(SCHEMA.empty_table()).schema  # noqa: B018 - forces the analysis
        except ConfigError:
            raise
        except Exception as exc:
            from kclpy_spark.spark.values import schema_error

            raise schema_error("config 'value_schema'", self._value_schema, exc) from None

    # --- DataFrames and cancellation -------------------------------------------------------------

    def to_df(self, table: Any) -> Any:
        """A DataFrame of an Arrow table; with a value schema, ``data`` is parsed as JSON into
        the schema's columns (next to the other columns; ``data`` kept if asked)."""
        if self.jvm_garbage is not None:
            self.jvm_garbage.before_frame(int(table.nbytes))
        if self.heap is not None:
            self.heap.maybe_read()
        frame = self.session().createDataFrame(_fewer_chunks(table))
        return self.parse(frame, table.column_names)

    def parse(self, df: Any, columns: list[str] | None = None) -> Any:
        """``df`` (the record columns, maybe more: ``columns``, or asked of ``df``) with ``data``
        parsed into the value schema; unchanged without one."""
        if not self._value_schema:
            return df
        from kclpy_spark.spark.values import value_fields, with_values

        if self._value_fields is None:  # once: over Connect, an analysis is a round trip
            self._value_fields = value_fields(df, self._value_schema)
        out = with_values(df, self._value_schema, keep_raw_data=self._keep_raw, columns=columns,
                          fields=self._value_fields,
                          check_clash=not self._columns_checked)  # fmt: skip
        self._columns_checked = True
        return out

    @contextlib.contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        """Tag the Spark jobs this thread starts inside the block (so ``interrupt`` can cancel
        them). Classic: SparkContext job tags, with interrupt-on-cancel (the session-level
        ``interruptTag`` did not see DataFrame actions here: it returned [] and the job ran on);
        Connect: the session's operation tags."""
        session = self.session()
        if self.target.kind is TargetKind.CONNECT:
            session.addTag(tag)
        else:
            sc = session.sparkContext
            sc.addJobTag(tag)
            sc.setInterruptOnCancel(True)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                if self.target.kind is TargetKind.CONNECT:
                    session.removeTag(tag)
                else:
                    session.sparkContext.removeJobTag(tag)

    def interrupt(self, tag: str) -> None:
        session = self._session
        if session is None:
            return
        try:
            if self.target.kind is TargetKind.CONNECT:
                session.interruptTag(tag)
            else:
                session.sparkContext.cancelJobsWithTag(tag)
        except Exception:
            log.warning("interrupting Spark jobs tagged %s failed", tag, exc_info=True)
