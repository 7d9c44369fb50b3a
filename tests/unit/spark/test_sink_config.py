"""Sink settings from TOML, Spark targets, the Java check, batch caps, and loading sinks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError
from kclpy_spark.config import WorkerConfig
from kclpy_spark.spark.session import (
    MIB,
    SparkSessionHolder,
    SparkTarget,
    TargetKind,
    find_java,
    python_defaults,
)
from kclpy_spark.spark.sink_batch import FunctionSink
from kclpy_spark.spark.sink_config import (
    SinkConfig,
    check_installed,
    load_sink_config,
    sink_config,
    sink_config_from_mapping,
)
from kclpy_spark.spark.sink_setup import load_sink, processor_factory_from_sink_config
from kclpy_spark.spark.sinks import DeltaSink, ParquetSink
from kclpy_spark.spark.timed_write import HUNG_GRACE


def test_defaults_and_derived_values() -> None:
    cfg = sink_config("parquet:/data/out")
    assert (cfg.sink_kind, cfg.sink_path, cfg.spark_target) == ("parquet", "/data/out", "local[2]")
    assert cfg.dead_letter_path is None and cfg.batching.scope == "worker"
    dlq = sink_config("pkg.mod:fn", failure_policy="dead-letter:/dlq")
    assert dlq.sink_kind == "function" and dlq.dead_letter_path == "/dlq"
    # A foreachBatch function gets one lease per batch: its batch_id then names one lease's
    # range, stable whoever re-forms it (issue 14, finding 4).
    assert dlq.batching.scope == "lease" and dlq.batching.regroup_wait == 30.0
    assert cfg.batching.regroup_wait == 0.0  # built-in sinks never wait for a whole batch
    # Built directly (not from TOML), a SinkConfig gets the same defaults for its sink's kind.
    assert SinkConfig("pkg.mod:fn").batching.scope == "lease"
    assert SinkConfig("delta:/t").batching == sink_config("delta:/t").batching
    assert sink_config("pkg.mod:fn", scope="worker").batching.scope == "worker"
    assert sink_config("delta:s3://b/t").sink_path == "s3://b/t"
    settings = sink_config("parquet:/x", max_bytes=200 * MIB).batcher_settings(96 * MIB)
    assert settings.max_bytes == 96 * MIB and settings.buffer_limit == 192 * MIB


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"sink": "nonsense"}, "sink"),
        ({"sink": "parquet:"}, "sink"),
        ({"spark_target": "mesos-ish://x"}, "spark_target"),
        ({"scope": "shard"}, "scope"),
        ({"failure_policy": "drop"}, "failure_policy"),
        ({"failure_policy": "dead-letter:"}, "failure_policy"),
        ({"max_records": 0}, "max_records"),
        ({"writers": 0}, "writers"),
        ({"max_wait": 0.0}, "max_wait"),
        ({"write_timeout": -1.0}, "write_timeout"),
        ({"buffer_bytes": -1}, "buffer_bytes"),
        ({"regroup_wait": -1.0}, "regroup_wait"),
        # #49 item 9: inf held records unwritten for ever; 20,000 writers exhausted the process.
        ({"max_wait": float("inf")}, "max_wait"),
        ({"max_wait": float("nan")}, "max_wait"),
        ({"max_wait": 3601.0}, "max_wait"),
        ({"retry_max_delay": float("inf")}, "retry_max_delay"),
        ({"write_timeout": float("inf")}, "write_timeout"),
        ({"regroup_wait": float("nan")}, "regroup_wait"),
        ({"commit_retry_delay": float("inf")}, "commit_retry_delay"),
        ({"writers": 20_000}, "writers"),
        ({"writers": 100_000_000}, "writers"),
        ({"spark_conf": {"spark.master": "local[4]"}}, "spark_target"),  # bypassed its check
        # A review's finding: each a traceback from the sink's constructor at start-up.
        ({"sink": "parquet:s3a://bucket/out"}, "'sink'.*local or mounted folder"),
        ({"failure_policy": "dead-letter:s3://bucket/dl"}, "failure_policy.*local or mounted"),
    ],
)
def test_bad_values_name_their_key(changes: dict[str, Any], key: str) -> None:
    values = {"sink": "parquet:/x", **changes}
    with pytest.raises(ConfigError, match=key):
        sink_config_from_mapping(values)


def test_a_function_in_worker_scope_is_held_to_what_a_lease_table_item_holds() -> None:
    """Its pieces' pending checkpoints name every piece of their batches in flight."""
    fn = {"sink": "app:write", "scope": "worker", "batches_in_flight": 2}
    with pytest.raises(ConfigError, match="'max_leases' x 'batches_in_flight'"):
        sink_config_from_mapping({**fn, "max_leases": 300})
    assert sink_config_from_mapping({**fn, "max_leases": 250}).batching.max_leases == 250
    parquet = {**fn, "sink": "parquet:/x", "max_leases": 300}  # names its own piece only
    assert sink_config_from_mapping(parquet).batching.max_leases == 300


def test_types_are_checked_and_unknown_keys_refused() -> None:
    with pytest.raises(ConfigError, match="max_records"):
        sink_config_from_mapping({"sink": "parquet:/x", "max_records": "10"})
    with pytest.raises(ConfigError, match="unknown sink config key"):
        sink_config_from_mapping({"sink": "parquet:/x", "max_record": 10})
    with pytest.raises(ConfigError, match="'sink' is required"):
        sink_config_from_mapping({"max_records": 10})
    cfg = sink_config_from_mapping({"sink": "parquet:/x", "max_wait": 2, "spark_conf": {"a": 1}})
    assert cfg.batching.max_wait == 2.0 and cfg.spark_conf == {"a": "1"}


def test_the_sink_table_is_read_from_the_worker_toml(tmp_path: Path) -> None:
    top = tmp_path / "top.toml"
    top.write_text(
        'stream_name = "s"\n[sink]\nsink = "delta:/t"\nmax_records = 5000\nscope = "lease"\n'
        '[sink.spark_conf]\n"spark.executor.memory" = "2g"\n'
    )
    cfg = load_sink_config(top)
    assert cfg is not None and cfg.sink_kind == "delta" and cfg.batching.max_records == 5000
    assert cfg.batching.scope == "lease" and cfg.spark_conf == {"spark.executor.memory": "2g"}
    # Unquoted, TOML makes nested tables of the dotted name: it became one setting "spark".
    dotted = tmp_path / "dotted.toml"
    dotted.write_text(
        '[sink]\nsink = "m:f"\n[sink.spark_conf]\nspark.executor.memory = "2g"\n'
        "spark.sql.adaptive.enabled = false\n"
        '"spark.jars.packages" = ["a:b:1", "c:d:2"]\n'  # a list: Spark's comma-separated one
    )
    dotted_cfg = load_sink_config(dotted)
    assert dotted_cfg is not None and dotted_cfg.spark_conf == {
        "spark.executor.memory": "2g", "spark.sql.adaptive.enabled": "false",
        "spark.jars.packages": "a:b:1,c:d:2",
    }  # fmt: skip
    unquoted_master = tmp_path / "master.toml"
    unquoted_master.write_text('[sink]\nsink = "m:f"\n[sink.spark_conf]\nspark.master = "x"\n')
    with pytest.raises(ConfigError, match="spark_target"):  # its check was bypassed too
        load_sink_config(unquoted_master)
    nested = tmp_path / "nested.toml"
    nested.write_text('[kclpy_spark]\nstream_name = "s"\n[kclpy_spark.sink]\nsink = "m:f"\n')
    nested_cfg = load_sink_config(nested)
    assert nested_cfg is not None and nested_cfg.sink == "m:f"
    plain = tmp_path / "plain.toml"
    plain.write_text('stream_name = "s"\n')
    assert load_sink_config(plain) is None
    with pytest.raises(ConfigError, match="does not exist"):
        load_sink_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("text", "kind", "loopback"),
    [
        ("local", TargetKind.LOCAL, True),
        ("local[2]", TargetKind.LOCAL, True),
        ("local[*]", TargetKind.LOCAL, True),
        ("local-cluster[1,1,1024]", TargetKind.CLUSTER, True),
        ("spark://127.0.0.1:7077", TargetKind.CLUSTER, True),
        ("spark://master-a:7077,master-b:7077", TargetKind.CLUSTER, False),
        ("yarn", TargetKind.CLUSTER, False),
        ("k8s://https://api:6443", TargetKind.CLUSTER, False),
        ("sc://127.0.0.1:15002", TargetKind.CONNECT, False),
    ],
)
def test_spark_targets(text: str, kind: TargetKind, loopback: bool) -> None:
    target = SparkTarget.parse(text)
    assert (target.kind, target.loopback, target.master) == (kind, loopback, text)
    # The executors get this interpreter's path only where they run on this machine (on yarn,
    # k8s or a remote cluster that path was named to executors that do not have it).
    executors = python_defaults(target).get("PYSPARK_PYTHON")
    assert executors == (sys.executable if loopback else None)


@pytest.mark.parametrize("text", ["", "local[two]", "sc://", "http://x", "spark"])
def test_bad_spark_targets(text: str) -> None:
    with pytest.raises(ConfigError, match="spark_target"):
        SparkTarget.parse(text)


def test_batches_are_capped_below_the_task_and_message_limits() -> None:
    assert SparkSessionHolder("local[2]").max_batch_bytes() is None
    assert SparkSessionHolder("spark://127.0.0.1:7077").max_batch_bytes() == 96 * MIB
    bigger = SparkSessionHolder("yarn", conf={"spark.rpc.message.maxSize": "256"})
    assert bigger.max_batch_bytes() == 192 * MIB
    assert SparkSessionHolder("sc://h:15002").max_batch_bytes() == 96 * MIB


def fake_java(home: Path, version: str) -> None:
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2024-01-16' >&2\n")
    java.chmod(0o755)


def test_a_missing_or_old_java_is_a_clear_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"needs Java 17\+.*sc://"):
        find_java()
    fake_java(tmp_path / "jdk8", "1.8.0_392")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk8"))
    with pytest.raises(ConfigError, match="Java 8"):
        find_java()
    fake_java(tmp_path / "jdk21", "21.0.2")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk21"))
    assert find_java() == str(tmp_path / "jdk21" / "bin" / "java")
    # The daemon's entry point reports it before any worker starts.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="Java"):
        processor_factory_from_sink_config(
            sink_config(f"parquet:{tmp_path}/out"), WorkerConfig(stream_name="s")
        )


def test_a_parquet_sink_keeps_the_staging_folder_of_a_write_its_timeout_allows(
    tmp_path: Path,
) -> None:
    """Staging folders older than a fixed hour were removed as a dead writer's, though a write
    may run up to its write_timeout (up to a day): a cleanup, this worker's or another's, could
    remove the folder of a write under way."""
    sink = load_sink(sink_config(f"parquet:{tmp_path}", write_timeout=7200.0))
    assert isinstance(sink, ParquetSink)
    live = tmp_path / "_staging" / "0000000000000001-live"
    live.mkdir(parents=True)
    written = live.stat().st_mtime
    assert sink.clean_staging(now=written + 3 * 3600) == []  # 3 h: a 2 h write may still run
    assert sink.clean_staging(now=written + 2 * 7200 + HUNG_GRACE + 1) == [live]
    default = load_sink(sink_config(f"parquet:{tmp_path}"))  # write_timeout 600 s: an hour
    assert isinstance(default, ParquetSink) and default._stale_staging == 3600.0


def test_sinks_are_loaded_by_name(tmp_path: Path) -> None:
    assert isinstance(load_sink(sink_config(f"parquet:{tmp_path}")), ParquetSink)
    assert isinstance(load_sink(sink_config(f"delta:{tmp_path}")), DeltaSink)
    function = load_sink(sink_config("operator:add"))  # any fn(df, batch_id) callable
    assert isinstance(function, FunctionSink)
    # Functions that cannot take (df, batch_id) are refused at start-up, not at the first batch.
    for wrong in ("json:dumps", "os:getcwd", "math:sqrt"):
        with pytest.raises(ConfigError, match="foreachBatch"):
            load_sink(sink_config(wrong))
    with pytest.raises(ConfigError, match="cannot import"):
        load_sink(sink_config("no_such_module_x:fn"))
    with pytest.raises(ConfigError, match="has no"):
        load_sink(sink_config("json:no_such_fn"))


def test_the_sink_modules_do_not_import_pyspark() -> None:
    code = (
        "import sys, kclpy_spark.spark.sink_setup, kclpy_spark.spark.sink_processor;"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("sinks", "given", "writers", "in_flight"),
    [
        # Two writers for every sink (bench/results/history.md "Two writers by default").
        (["parquet:/a"], {}, 2, 2),
        (["delta:/a"], {}, 2, 2),  # DeltaSink keeps a lease's batches in order itself
        (["parquet:/a", "delta:/b"], {}, 2, 2),
        # A function gets a lease's batches one after another (other leases use writer two).
        (["pkg.mod:fn"], {}, 2, 1),
        (["parquet:/a", "pkg.mod:fn"], {}, 2, 1),
        # What the config says wins.
        (["parquet:/a"], {"writers": 1}, 1, 2),
        (["pkg.mod:fn"], {"batches_in_flight": 2}, 2, 2),
        (["pkg.mod:fn"], {"writers": 3, "batches_in_flight": 3}, 3, 3),
    ],
)
def test_writer_defaults_follow_the_sinks(
    sinks: list[str], given: dict[str, Any], writers: int, in_flight: int
) -> None:
    if len(sinks) == 1:
        cfg = sink_config(sinks[0], **given)
    else:
        cfg = sink_config_from_mapping(given, sinks=[{"sink": s} for s in sinks])
    assert (cfg.batching.writers, cfg.batching.batches_in_flight) == (writers, in_flight)
    if not given:  # built directly, a SinkConfig gets the same defaults
        assert SinkConfig(sinks[0]).batching == sink_config(sinks[0]).batching


def test_several_sinks_are_read_from_sinks_entries(tmp_path: Path) -> None:
    path = tmp_path / "several.toml"
    path.write_text(
        'stream_name = "s"\n'
        '[sink]\nmax_records = 500\nmax_attempts = 4\nfailure_policy = "dead-letter:/dl"\n'
        '[[sinks]]\nsink = "parquet:/out"\n'
        '[[sinks]]\nsink = "alerts.mod:send"\nfailure_policy = "park"\nwrite_timeout = 20\n'
        '[[sinks]]\nsink = "alerts.mod:send"\nname = "copy"\nmax_attempts = 2\n'
    )
    cfg = load_sink_config(path)
    assert cfg is not None and cfg.sink == "" and cfg.batching.max_records == 500
    assert [(s.name, s.kind, s.path) for s in cfg.specs] == [
        ("parquet", "parquet", "/out"),
        ("send", "function", ""),
        ("copy", "function", ""),
    ]
    # the [sink] table's policy keys are each entry's defaults
    assert [s.dead_letter_path for s in cfg.specs] == ["/dl", None, "/dl"]
    assert [s.max_attempts for s in cfg.specs] == [4, 4, 2]
    assert [s.write_timeout for s in cfg.specs] == [None, 20.0, None]
    # one foreachBatch function among the sinks: batches are per lease (stable batch_id)
    assert cfg.batching.scope == "lease" and cfg.batching.regroup_wait == 30.0
    builtin = sink_config_from_mapping({}, sinks=[{"sink": "parquet:/a"}, {"sink": "delta:/b"}])
    assert builtin.batching.scope == "worker" and builtin.batching.regroup_wait == 0.0
    # a single [sink] keeps one spec named "sink", with the table's policy
    single = sink_config("parquet:/x", failure_policy="dead-letter:/d")
    assert [(s.name, s.dead_letter_path) for s in single.specs] == [("sink", "/d")]


@pytest.mark.parametrize(
    ("table", "entries", "message"),
    [
        ({"sink": "parquet:/a"}, [{"sink": "delta:/b"}], "name each in its"),
        ({}, [{"sink": "parquet:/a"}, {"sink": "parquet:/b"}], "distinct names"),
        ({}, [{"sink": "parquet:/a", "max_records": 5}], "the other settings go in"),
        ({}, [{"name": "x"}], "'sink' is required in"),
        ({}, [{"sink": "not a sink"}], "must be 'parquet"),
        ({}, [{"sink": "m:f", "failure_policy": "retry"}], "failure_policy"),
        ({}, [{"sink": "m:f", "max_attempts": 0}], "max_attempts"),
        ({}, [{"sink": "m:f", "write_timeout": "soon"}], "write_timeout"),
        ({}, [{"sink": "m:f", "write_timeout": float("inf")}], "write_timeout"),  # wait() raised
        ({}, [{"sink": "m:f", "write_timeout": 1e12}], "at most 86400"),
        ({}, [], "'sink' is required"),
    ],
)
def test_bad_sinks_entries_are_clear_errors(
    table: dict[str, Any], entries: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        sink_config_from_mapping(table, sinks=entries)


def test_the_factory_routes_each_batch_to_every_sink(tmp_path: Path) -> None:
    worker = WorkerConfig(stream_name="s", application_name="app")
    entries = [
        {"sink": f"parquet:{tmp_path / 'out'}"},
        {"sink": "operator:add", "failure_policy": f"dead-letter:{tmp_path / 'dl'}"},
    ]
    cfg = sink_config_from_mapping({"max_attempts": 3}, sinks=entries)
    factory = processor_factory_from_sink_config(cfg, worker, start_session=False)
    try:
        assert factory.batcher.status()["sinks"] == ["parquet", "add"]
    finally:
        factory.close()
    bad = [{"sink": "operator:add", "failure_policy": "dead-letter:/proc/no-such/dl"}]
    with pytest.raises(ConfigError, match="sink 'add'"):
        processor_factory_from_sink_config(
            sink_config_from_mapping({}, sinks=bad), worker, start_session=False
        )


@pytest.mark.parametrize(
    ("sink", "absent", "words"),
    [
        ("parquet:/tmp/out", {"pyspark"}, ["pyspark", "kclpy-spark[spark]"]),
        ("parquet:/tmp/out", {"pyarrow", "pandas"}, ["pandas, pyarrow", "kclpy-spark[spark]"]),
        ("delta:/tmp/t", {"deltalake"}, ["deltalake", "kclpy-spark[delta]"]),
        ("delta:/tmp/t", {"pyspark", "deltalake"}, ["kclpy-spark[delta,spark]"]),
    ],
)
def test_a_sink_without_its_extra_is_one_line_naming_it(
    sink: str, absent: set[str], words: list[str]
) -> None:
    cfg = sink_config_from_mapping({"sink": sink})
    with pytest.raises(ConfigError) as err:
        check_installed(cfg, lambda name: None if name in absent else object())
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


def test_an_installed_sink_passes_the_check() -> None:
    check_installed(sink_config_from_mapping({"sink": "delta:/tmp/t"}))  # this venv has them all
    check_installed(sink_config_from_mapping({"sink": "parquet:/x"}), lambda name: object())


def test_a_spark_connect_server_that_is_down_is_an_error_at_start_not_ten_minutes_of_retries(
    tmp_path: Path,
) -> None:
    """getOrCreate() sent the builder's settings under Spark's own retry policy (15 tries, about
    ten minutes); the short one was set only after it returned."""
    code = (
        "from kclpy_spark.spark.session import SparkSessionHolder\n"
        "try:\n"
        "    SparkSessionHolder('sc://127.0.0.1:9').session()\n"
        "except Exception as exc:\n"
        "    print('FAILED', type(exc).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert "FAILED SparkConnectGrpcException" in result.stdout, result.stderr[-2000:]


def test_enhanced_fan_out_with_reads_on_the_executors_is_one_line_at_start_up() -> None:
    """The executors read with GetRecords: a user who chose enhanced fan-out (dedicated
    throughput) shared each shard's read limits with every other consumer, unasked."""
    from checkpoint.base.errors import ConfigError
    from kclpy_spark.config import WorkerConfig
    from kclpy_spark.spark.sink_config import SinkConfig
    from kclpy_spark.spark.sink_setup import _executor_reads

    worker = WorkerConfig(stream_name="s", retrieval_mode="fanout", consumer_name="c")
    with pytest.raises(ConfigError, match=r'fanout.*read_on = "executors"'):
        _executor_reads(
            SinkConfig("parquet:/tmp/out", read_on="executors"), worker, None, None, probe=False
        )  # type: ignore[arg-type]
    assert _executor_reads(SinkConfig("parquet:/tmp/out"), worker, None, None, probe=False) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "pages", "budget"),
    [
        ({}, True, 100_000),  # up to a page a lease within max_bytes (test_read_rounds.py)
        ({"page_per_lease": False}, False, 100_000),
        ({"max_records": 50_000}, False, 50_000),  # a budget given is kept to
        ({"max_records": 50_000, "page_per_lease": True}, True, 50_000),
    ],
)
def test_the_executors_reads_get_a_page_a_lease_unless_max_records_or_the_key_says(
    given: dict[str, Any], pages: bool, budget: int
) -> None:
    from kclpy_spark.spark.sink_setup import _executor_reads

    cfg = sink_config("parquet:/tmp/out", read_on="executors", **given)
    worker = WorkerConfig(stream_name="s", region="us-east-1")
    holder = SimpleNamespace(session=lambda: None, jvm_garbage=None)  # no Spark asked here
    reads = _executor_reads(cfg, worker, holder, cfg.batching, probe=False)  # type: ignore[arg-type]
    assert reads is not None
    assert (reads._s.page_per_lease, reads._s.max_records) == (pages, budget)


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/data/out", "/data/out"),
        ("out", "out"),
        ("file:/data/out", "/data/out"),  # was ./file:/data/out, while Spark wrote to /data/out
        ("file:///data/out", "/data/out"),
        ("file://localhost/data/out", "/data/out"),
        ("s3a://bucket/out", None),
        ("file://otherhost/data", None),
        ("dbfs:/mnt/out", None),  # Hadoop's one-slash form: not ./dbfs:/mnt/out
        ("hdfs:/data/out", None),
        ("file:", None),  # no path: not the working folder
        ("file://", None),
        ("C:/data/out", "C:/data/out"),  # a drive letter is no scheme
    ],
)
def test_a_sink_path_is_local_where_spark_reads_it_so(path: str, local: str | None) -> None:
    from kclpy_spark.spark.paths import local_path

    assert local_path(path) == (None if local is None else Path(local))
