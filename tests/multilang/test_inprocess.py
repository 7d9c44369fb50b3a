"""The in-process adapter with amazon_kclpy's own v1, v2 and v3 base classes, a real Checkpointer
(memory lease table), and how the runner finds and loads the application's class."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from multilang_helpers import (
    KCLPY_APP,
    HeldShard,
    held_shard,
    read_events,
    read_records,
    records,
    seq,
)

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import SHARD_END, ExtendedSequenceNumber
from kclpy_spark.multilang.inprocess import KclpyProcessorAdapter
from kclpy_spark.multilang.properties import config_from_properties
from kclpy_spark.multilang.runner import (
    PropertiesConfig,
    build_factory,
    load_processor_class,
    processor_class_name,
)
from kclpy_spark.multilang.subprocess_processor import SubprocessProcessor
from kclpy_spark.processor import (
    CheckpointError,
    InitializeInput,
    LeaseLostInput,
    ProcessRecordsInput,
    ShardEndedInput,
    ShutdownRequestedInput,
)


def initialize(adapter: KclpyProcessorAdapter, shard: HeldShard) -> None:
    checkpoint = shard.stored()
    adapter.initialize(
        InitializeInput(shard.shard_id, checkpoint.sequence_number, checkpoint.sub_sequence_number)
    )


def deliver(adapter: KclpyProcessorAdapter, shard: HeldShard, start: int, n: int) -> None:
    batch = records(start, n)
    shard.deliver(batch)
    adapter.process_records(ProcessRecordsInput(batch, 0, shard.checkpointer))


def test_the_v3_app_runs_in_process(
    amazon_kclpy: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KCLPY_SPARK_SAMPLE_OUTPUT", str(tmp_path))
    cls = load_processor_class(f"{KCLPY_APP}:RecordProcessor", tmp_path)
    monkeypatch.setattr(sys.modules[cls.__module__], "OUTPUT", str(tmp_path))
    shard = held_shard()
    adapter = KclpyProcessorAdapter(cls())
    assert adapter.kclpy_version == 3
    initialize(adapter, shard)
    deliver(adapter, shard, 1, 3)
    assert shard.stored() == ExtendedSequenceNumber(seq(3))
    shard.holder.drop(shard.shard_id)  # lost: the app's checkpoint gets ShutdownException
    deliver(adapter, shard, 4, 1)
    assert [r["data"] for r in read_records(tmp_path)] == ["r1", "r2", "r3", "r4"]
    [error] = [e for e in read_events(tmp_path) if e["event"] == "checkpoint_error"]
    # The app caught it with `except kcl.CheckpointError`: amazon_kclpy's own class.
    assert error["cls"] == "amazon_kclpy.checkpoint_error.CheckpointError"
    assert error["value"] == "ShutdownException"
    assert [r["pid"] for r in read_records(tmp_path)] == [os.getpid()] * 4


def _v2_and_v1_classes(calls: list[tuple[Any, ...]]) -> tuple[type, type]:
    from amazon_kclpy import kcl
    from amazon_kclpy.v2 import processor as v2

    def attempt(checkpointer: Any) -> str | None:
        try:
            checkpointer.checkpoint()
        except kcl.CheckpointError as exc:
            return f"{type(exc).__module__}:{exc.value}"
        return None

    class V2(v2.RecordProcessorBase):  # type: ignore[misc]
        def initialize(self, initialize_input: Any) -> None:
            calls.append(("initialize", initialize_input.shard_id))

        def process_records(self, process_records_input: Any) -> None:
            data = [r.binary_data for r in process_records_input.records]
            calls.append(("process_records", data, attempt(process_records_input.checkpointer)))

        def shutdown(self, shutdown_input: Any) -> None:
            calls.append(("shutdown", shutdown_input.reason, attempt(shutdown_input.checkpointer)))

    class V1(kcl.RecordProcessorBase):  # type: ignore[misc]
        def initialize(self, shard_id: str) -> None:
            calls.append(("initialize", shard_id))

        def process_records(self, records: list[Any], checkpointer: Any) -> None:
            calls.append(("process_records", [r["partitionKey"] for r in records],
                          attempt(checkpointer)))  # fmt: skip

        def shutdown(self, checkpointer: Any, reason: str) -> None:
            calls.append(("shutdown", reason, attempt(checkpointer)))

        def shutdown_requested(self, checkpointer: Any) -> None:
            calls.append(("shutdown_requested", attempt(checkpointer)))

    return V2, V1


@pytest.mark.parametrize("version", [2, 1])
def test_v2_and_v1_map_like_amazon_kclpys_adapters(amazon_kclpy: ModuleType, version: int) -> None:
    calls: list[tuple[Any, ...]] = []
    v2_class, v1_class = _v2_and_v1_classes(calls)
    adapter = KclpyProcessorAdapter((v2_class if version == 2 else v1_class)())
    shard = held_shard()
    initialize(adapter, shard)
    deliver(adapter, shard, 1, 2)
    shard.checkpointer.mark_shard_end()
    adapter.shard_ended(ShardEndedInput(shard.checkpointer))
    assert shard.stored() == SHARD_END
    adapter.lease_lost(LeaseLostInput())
    first = "shardId-000000000000"
    batch = [b"r1", b"r2"] if version == 2 else ["pk-1", "pk-2"]
    # ZOMBIE gets amazon_kclpy's LeaseLostCheckpointer, which always raises its CheckpointError.
    assert calls == [
        ("initialize", first),
        ("process_records", batch, None),
        ("shutdown", "TERMINATE", None),
        ("shutdown", "ZOMBIE",
         "amazon_kclpy.checkpoint_error:Checkpointing is not allowed when the lease is lost"),
    ]  # fmt: skip


def test_shutdown_requested_then_the_workers_lease_lost_reach_the_app(
    amazon_kclpy: ModuleType,
) -> None:
    """The worker follows shutdown_requested with lease_lost for every processor (consumer
    tests); the adapter passes each on once (it used to add its own lease_lost)."""
    calls: list[tuple[Any, ...]] = []
    _, v1_class = _v2_and_v1_classes(calls)
    adapter = KclpyProcessorAdapter(v1_class())
    shard = held_shard()
    initialize(adapter, shard)
    deliver(adapter, shard, 1, 1)
    adapter.shutdown_requested(ShutdownRequestedInput(shard.checkpointer))
    assert calls[-1][0] == "shutdown_requested"
    adapter.lease_lost(LeaseLostInput())
    assert [c[0] for c in calls][-2:] == ["shutdown_requested", "shutdown"]
    assert calls[-1][1] == "ZOMBIE"


class Failing:
    version = 3

    def initialize(self, initialize_input: Any) -> None:
        pass

    def process_records(self, process_records_input: Any) -> None:
        raise ValueError("bad record")


def test_exceptions_are_logged_and_passed_over_like_amazon_kclpy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shard = held_shard()
    adapter = KclpyProcessorAdapter(Failing())
    initialize(adapter, shard)
    deliver(adapter, shard, 1, 1)  # no exception: amazon-kclpy reports the call done
    assert any(
        "shardId-000000000000" in r.getMessage() and r.levelno == logging.ERROR
        for r in caplog.records
    )
    strict = KclpyProcessorAdapter(Failing(), retry_failed_batches=True)
    initialize(strict, shard)
    with pytest.raises(ValueError, match="bad record"):
        deliver(strict, shard, 1, 1)


def test_without_amazon_kclpy_errors_are_our_checkpoint_error() -> None:
    class Plain:
        version = 3

        def process_records(self, process_records_input: Any) -> None:
            process_records_input.checkpointer.checkpoint("not-a-number")

    shard = held_shard()
    adapter = KclpyProcessorAdapter(Plain(), retry_failed_batches=True)
    adapter._error_class = None  # as when amazon_kclpy is not importable
    with pytest.raises(CheckpointError) as info:
        deliver(adapter, shard, 1, 1)
    assert info.value.value == "IllegalArgumentException"


def test_a_checkpoint_given_an_int_is_taken_as_its_digits(amazon_kclpy: ModuleType) -> None:
    """As the subprocess path and the Java daemon read the app's JSON: an app that keeps its
    sequence numbers as ints (the kclpy samples do) checkpoints with one."""

    class IntCheckpoints:
        version = 3

        def process_records(self, process_records_input: Any) -> None:
            last = process_records_input.records[-1]
            process_records_input.checkpointer.checkpoint(int(last.sequence_number))

    shard = held_shard()
    deliver(KclpyProcessorAdapter(IntCheckpoints()), shard, 1, 3)
    assert shard.stored() == ExtendedSequenceNumber(seq(3))


def test_not_a_kclpy_processor() -> None:
    with pytest.raises(ConfigError, match="'version' attribute is None"):
        KclpyProcessorAdapter(object())


# --- finding the class ---------------------------------------------------------------------------


def test_the_class_is_found_in_the_script() -> None:
    assert processor_class_name(KCLPY_APP) == "RecordProcessor"


def test_scripts_without_kclprocess(tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text("class A:\n    pass\n\nprint(A())\n")
    assert processor_class_name(other) is None
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    assert processor_class_name(broken) is None


def _config(tmp_path: Path, executable: str) -> PropertiesConfig:
    raw = {"executableName": executable, "streamName": "s", "applicationName": "app",
           "retrievalMode": "POLLING"}  # fmt: skip
    worker, settings = config_from_properties(raw, folder=tmp_path)
    return PropertiesConfig(worker, settings, tmp_path / "app.properties", raw)


def test_build_factory_chooses_the_path(amazon_kclpy: ModuleType, tmp_path: Path) -> None:
    config = _config(tmp_path, f"python3 {KCLPY_APP}")
    factory, description = build_factory(config)
    assert isinstance(factory(), SubprocessProcessor)
    assert description.startswith("subprocess path")
    factory, description = build_factory(config, in_process=True)
    made = factory()
    assert isinstance(made, KclpyProcessorAdapter)
    assert type(made.processor).__name__ == "RecordProcessor"
    assert "in-process path" in description and "version 3" in description
    (tmp_path / "myapp.py").write_text(KCLPY_APP.read_text())
    factory, _ = build_factory(config, processor="myapp:RecordProcessor")
    assert type(factory()).__name__ == "KclpyProcessorAdapter"
    with pytest.raises(ConfigError, match="only used with the in-process path"):
        build_factory(config, in_process=False, processor="myapp:RecordProcessor")


@pytest.mark.parametrize("in_process", [False, True])
def test_both_paths_ask_for_empty_record_lists_when_the_file_does(
    amazon_kclpy: ModuleType, tmp_path: Path, in_process: bool
) -> None:
    """callProcessRecordsEvenForEmptyRecordList = true was warned about and not honoured: an
    app that flushes or checkpoints on a timer from processRecords never ran it on a quiet
    shard."""
    raw = {"executableName": f"python3 {KCLPY_APP}", "streamName": "s", "applicationName": "app",
           "callProcessRecordsEvenForEmptyRecordList": "true"}  # fmt: skip
    worker, settings = config_from_properties(raw, folder=tmp_path)
    factory, description = build_factory(
        PropertiesConfig(worker, settings, tmp_path / "app.properties", raw), in_process=in_process
    )
    assert factory().call_process_records_even_for_empty_record_list is True
    assert "after empty reads too" in description
    factory, _ = build_factory(_config(tmp_path, f"python3 {KCLPY_APP}"), in_process=in_process)
    assert factory().call_process_records_even_for_empty_record_list is False


def test_the_in_process_path_says_it_does_not_apply_timeout_in_seconds(
    amazon_kclpy: ModuleType, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The subprocess path ends a child whose call outlives timeoutInSeconds; a thread cannot
    be ended so: the key was ignored without a word, a hung call holding its lease."""
    raw = {"executableName": f"python3 {KCLPY_APP}", "streamName": "s", "timeoutInSeconds": "5",
           "applicationName": "app", "retrievalMode": "POLLING"}  # fmt: skip
    worker, settings = config_from_properties(raw, folder=tmp_path)
    config = PropertiesConfig(worker, settings, tmp_path / "app.properties", raw)
    with caplog.at_level(logging.WARNING, logger="kclpy_spark.multilang.runner"):
        build_factory(config, in_process=True)
    assert any("timeoutInSeconds = 5 is not applied" in m for m in caplog.messages)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nomodule_here_xyz:Thing", "cannot import 'nomodule_here_xyz'"),
        ("json:Nope", "'json' has no 'Nope'"),
        ("json:dumps", "is not a record processor class"),
        ("Classless", "must look like 'module:Class'"),
    ],
)
def test_load_processor_class_errors(tmp_path: Path, target: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_processor_class(target, tmp_path)


def test_the_script_is_found_in_the_properties_folder_from_anywhere(
    amazon_kclpy: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``executableName = python3 app.py`` runs in the .properties file's folder: the in-process
    path looked for app.py in the daemon's own working folder instead."""
    (tmp_path / "app.py").write_text(KCLPY_APP.read_text())
    monkeypatch.chdir("/")
    factory, description = build_factory(_config(tmp_path, "python3 app.py"), in_process=True)
    assert type(factory()).__name__ == "KclpyProcessorAdapter"
    assert str(tmp_path / "app.py") in description


UNGUARDED = """\
from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor


class Unguarded(processor.RecordProcessorBase):
    def initialize(self, initialize_input):
        pass

    def process_records(self, process_records_input):
        pass

    def lease_lost(self, lease_lost_input):
        pass

    def shard_ended(self, shard_ended_input):
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input):
        pass


kcl.KCLProcess(Unguarded()).run()
"""


def test_a_script_that_runs_kclprocess_at_import_is_not_run(
    amazon_kclpy: ModuleType, tmp_path: Path
) -> None:
    """Without ``if __name__ == "__main__":`` the import ran the MultiLang loop on the daemon's
    own stdin (a hang at start-up)."""
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    factory, _ = build_factory(_config(tmp_path, "python3 unguarded.py"), in_process=True)
    made = factory()
    assert isinstance(made, KclpyProcessorAdapter)
    assert type(made.processor).__name__ == "Unguarded"
    from amazon_kclpy import kcl

    assert kcl.KCLProcess.run.__name__ == "run"  # put back after the import


def test_a_processor_class_that_needs_arguments_is_one_line_at_start(
    amazon_kclpy: ModuleType, tmp_path: Path
) -> None:
    """It passed start-up, then failed on every lease until each was parked."""
    script = UNGUARDED.replace("    def initialize(", "    def __init__(self, path):\n"
                               "        self.path = path\n\n    def initialize(")  # fmt: skip
    (tmp_path / "needs_args.py").write_text(script.replace("Unguarded()", "Unguarded('out')"))
    with pytest.raises(ConfigError, match="cannot be made without arguments"):
        build_factory(_config(tmp_path, "python3 needs_args.py"), in_process=True)


def test_in_process_without_a_python_script(tmp_path: Path) -> None:
    config = _config(tmp_path, "/bin/cat")
    with pytest.raises(ConfigError, match="no processor class found"):
        build_factory(config, in_process=True)


def test_an_amazon_kclpy_class_named_as_the_daemon_s_processor_runs_behind_the_adapter(
    amazon_kclpy: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``processor = "app:Cls"`` with a class on amazon_kclpy's v3 base ran as one of ours: its
    ``except kcl.CheckpointError`` caught nothing, so a throttled checkpoint failed the batch."""
    from kclpy_spark.runtime.daemon import load_processor_factory

    (tmp_path / "kclpy_daemon_app.py").write_text(
        "from amazon_kclpy import kcl\n"
        "from amazon_kclpy.v3 import processor\n\n"
        "class App(processor.RecordProcessorBase):\n"
        "    caught = []\n"
        "    def initialize(self, initialize_input): pass\n"
        "    def process_records(self, process_records_input):\n"
        "        try:\n"
        "            process_records_input.checkpointer.checkpoint('not-a-number')\n"
        "        except kcl.CheckpointError as e:\n"
        "            App.caught.append(e.value)\n"
        "    def lease_lost(self, lease_lost_input): pass\n"
        "    def shard_ended(self, shard_ended_input): pass\n"
        "    def shutdown_requested(self, shutdown_requested_input): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    processor = load_processor_factory("kclpy_daemon_app:App")()
    assert isinstance(processor, KclpyProcessorAdapter) and processor.kclpy_version == 3
    shard = held_shard()
    initialize(processor, shard)
    deliver(processor, shard, 1, 1)
    assert sys.modules["kclpy_daemon_app"].App.caught == ["IllegalArgumentException"]


def test_an_amazon_kclpy_class_as_the_daemons_processor_lets_a_failed_batch_reach_the_worker(
    amazon_kclpy: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As it did running as one of ours: the batch is offered again, then the lease parked (the
    adapter's amazon-kclpy default logs it and moves on, so the next checkpoint passed over the
    failed records). A class of ours that only has a ``version`` attribute is left alone."""
    from kclpy_spark.runtime.daemon import load_processor_factory

    (tmp_path / "kclpy_raiser_app.py").write_text(
        "from amazon_kclpy.v3 import processor\n\n"
        "class App(processor.RecordProcessorBase):\n"
        "    def initialize(self, initialize_input): pass\n"
        "    def process_records(self, process_records_input): raise ValueError('poison')\n"
        "    def lease_lost(self, lease_lost_input): pass\n"
        "    def shard_ended(self, shard_ended_input): pass\n"
        "    def shutdown_requested(self, shutdown_requested_input): pass\n\n"
        "class Ours:\n"
        "    version = 1\n"
        "    def initialize(self, initialize_input): pass\n"
        "    def process_records(self, process_records_input): pass\n"
        "    def lease_lost(self, lease_lost_input): pass\n"
        "    def shard_ended(self, shard_ended_input): pass\n"
        "    def shutdown_requested(self, shutdown_requested_input): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    processor = load_processor_factory("kclpy_raiser_app:App")()
    shard = held_shard()
    initialize(processor, shard)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="poison"):
        deliver(processor, shard, 1, 1)  # type: ignore[arg-type]
    ours = load_processor_factory("kclpy_raiser_app:Ours")()
    assert not isinstance(ours, KclpyProcessorAdapter)


@pytest.mark.parametrize("version", [1, 3])
def test_the_app_gets_a_list_of_its_own_to_empty(version: int) -> None:
    """An amazon-kclpy app may consume its list (``records.pop(0)`` until empty): it was the
    consumer's own, whose last record the consumer reads after the call (IndexError: the lease
    parked at every tenure), and a failed batch emptied so had nothing left to offer again."""

    class Pops:
        def __init__(self) -> None:
            self.version = version
            self.seen: list[str] = []

        def _take(self, records: list[Any]) -> None:
            while records:
                self.seen.append(records.pop(0).sequence_number)

        def process_records(self, *args: Any) -> None:
            self._take(args[0] if version == 1 else args[0].records)

    shard = held_shard()
    app = Pops()
    batch = records(1, 3)
    shard.deliver(batch)
    KclpyProcessorAdapter(app).process_records(ProcessRecordsInput(batch, 0, shard.checkpointer))
    assert app.seen == [seq(1), seq(2), seq(3)] and len(batch) == 3


def test_a_kclpy_spark_processor_named_in_process_runs_as_the_daemon_runs_it(
    tmp_path: Path,
) -> None:
    """``--in-process mod:Class`` with one of our RecordProcessors: it went behind the
    amazon_kclpy adapter, which never awaited an ``async def`` method (its records never
    processed) while its default ``shard_ended`` checkpointed SHARD_END."""
    (tmp_path / "ours_async.py").write_text(
        "from kclpy_spark import RecordProcessor\n"
        "class Mine(RecordProcessor):\n"
        "    async def process_records(self, process_records_input):\n"
        "        process_records_input.checkpointer.checkpoint()\n"
    )
    config = _config(tmp_path, f"python3 {KCLPY_APP}")
    factory, description = build_factory(config, processor="ours_async:Mine")
    made = factory()
    assert type(made).__name__ == "Mine" and "a RecordProcessor" in description


def test_the_apps_folder_goes_after_the_standard_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It went first on ``sys.path``: a file there named like a standard module shadowed the
    module the worker imported later."""
    import sysconfig

    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "app.py").write_text(
        "class Proc:\n    version = 3\n    def process_records(self, records_input): pass\n"
    )
    load_processor_class("app.py:Proc", tmp_path)
    stdlib = sysconfig.get_paths()["stdlib"]
    assert sys.path.index(str(tmp_path)) > sys.path.index(stdlib)
