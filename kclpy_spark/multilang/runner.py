"""Run an amazon-kclpy application from its .properties file: the MultiLangDaemon's job.

Two paths, chosen explicitly (the default is the one that behaves exactly like the daemon):

* the subprocess path (default): ``executableName`` is started once per lease and spoken to over
  the MultiLang protocol, like the Java daemon; any language, one process per shard;
* the in-process path (``in_process=True`` / ``--in-process``): the application's amazon_kclpy
  processor class runs inside the worker, no child process or JSON per batch. The class is
  ``processor`` (``module:Class``, or ``path/to/script.py:Class``), or, when not given, found in
  the executable's Python script: the class whose instance it hands to ``kcl.KCLProcess(...)``.
  The script's folder and the .properties file's folder are put on ``sys.path``.

The in-process path is not the default because it changes what the application shares: all its
shards run in one process (module-level state, files named by process id, ``sys.stdout`` are
shared), where the daemon gives each shard a process of its own.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.multilang.child import spec_from_settings
from kclpy_spark.multilang.inprocess import processor_factory
from kclpy_spark.multilang.properties import PropertiesConfig, load_properties
from kclpy_spark.multilang.subprocess_processor import SubprocessProcessor
from kclpy_spark.processor import RecordProcessor
from kclpy_spark.runtime.consumer import ProcessorFactory
from kclpy_spark.user_code import importable_after_the_standard_library

log = logging.getLogger(__name__)


def script_of(command: Sequence[str], cwd: Path) -> Path | None:
    """The Python script a command runs: its first argument ending in ``.py`` that exists, a
    relative one in ``cwd`` (where the command runs: the .properties file's folder)."""
    for part in command:
        if part.endswith(".py") and (cwd / part).is_file():
            return (cwd / part).resolve()
    return None


def processor_class_name(script: Path) -> str | None:
    """The name of the class the script passes to ``kcl.KCLProcess(Class(...))``, if any."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0]
        if (
            name == "KCLProcess"
            and isinstance(first, ast.Call)
            and isinstance(first.func, ast.Name)
            and first.func.id in classes
        ):
            return first.func.id
    return None


def _on_path(folder: Path) -> None:
    """The app's folder importable, after the standard library: a file there named like a
    standard module (``logging.py``) must not shadow the one the worker imports later."""
    if str(folder) not in sys.path:
        importable_after_the_standard_library(str(folder))


def _import_script(script: Path) -> ModuleType:
    name = script.stem
    existing = sys.modules.get(name)
    if existing is not None and Path(getattr(existing, "__file__", "") or "") == script:
        return existing
    if existing is not None or not name.isidentifier():
        name = f"kclpy_spark_app_{abs(hash(script))}"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import {str(script)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # A script that runs KCLProcess at import (no ``__main__`` guard) stops there: what it
    # defined before is enough.
    with _kcl_process_not_run(), contextlib.suppress(_WouldRun):
        spec.loader.exec_module(module)
    return module


class _WouldRun(BaseException):
    """A script being imported called ``KCLProcess.run`` (it would read the worker's stdin)."""


@contextlib.contextmanager
def _kcl_process_not_run() -> Iterator[None]:
    """While a script is imported, ``amazon_kclpy.kcl.KCLProcess.run`` stops the import
    instead of running the MultiLang loop on this process's stdin (a script that calls it at
    top level, without ``if __name__ == "__main__":``, hung the daemon's start)."""
    try:
        kcl = importlib.import_module("amazon_kclpy.kcl")
    except ImportError:
        yield
        return

    def stop(self: Any, *args: Any, **kwargs: Any) -> None:
        raise _WouldRun()

    run = kcl.KCLProcess.run
    kcl.KCLProcess.run = stop
    try:
        yield
    finally:
        kcl.KCLProcess.run = run


def load_processor_class(target: str, folder: Path) -> Any:
    """``module:Class`` or ``path/to/script.py:Class`` (relative to ``folder``) -> the class.
    Raises ConfigError with the reason when it cannot be imported or is not a processor."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"--in-process {target!r} must look like 'module:Class'")
    _on_path(folder)
    try:
        if where.endswith(".py"):
            script = (folder / where).resolve()
            _on_path(script.parent)
            module = _import_script(script)
        else:
            module = importlib.import_module(where)
    except ModuleNotFoundError as exc:
        hint = ""
        if exc.name and exc.name.split(".")[0] == "amazon_kclpy":
            hint = (
                " (install amazon-kclpy's Python package: pip install amazon-kclpy, or see "
                "tests/multilang/install_amazon_kclpy.py for an install without its jars)"
            )
        raise ConfigError(f"cannot import {where!r} for the in-process path: {exc}{hint}") from None
    except Exception as exc:
        raise ConfigError(f"cannot import {where!r} for the in-process path: {exc!r}") from None
    cls: Any = module
    for part in attr.split("."):
        cls = getattr(cls, part, None)
        if cls is None:
            raise ConfigError(f"{where!r} has no {attr!r} (--in-process {target!r})")
    if not isinstance(cls, type) or not callable(getattr(cls, "process_records", None)):
        raise ConfigError(f"{target!r} is not a record processor class")
    if getattr(cls, "version", None) not in (1, 2, 3):
        raise ConfigError(
            f"{target!r} is not an amazon_kclpy processor class (version 1, 2 or 3 expected)"
        )
    try:
        inspect.signature(cls).bind()
    except TypeError as exc:
        raise ConfigError(
            f"{target!r} cannot be made without arguments ({exc}): the in-process path makes "
            "one per lease, with none; give its arguments defaults, or run it as a subprocess"
        ) from None
    except ValueError:  # no signature to read (a class implemented in C): try it per lease
        pass
    return cls


def build_factory(
    config: PropertiesConfig,
    *,
    in_process: bool | None = None,
    processor: str | None = None,
    retry_failed_batches: bool = False,
) -> tuple[ProcessorFactory, str]:
    """The worker's processor factory for ``config`` and a description of the path chosen."""
    factory, description = _factory(config, in_process, processor, retry_failed_batches)
    if not config.multilang.empty_record_lists:
        return factory, description

    def asking_for_empty_lists() -> RecordProcessor:  # callProcessRecordsEvenForEmptyRecordList
        made = factory()
        made.call_process_records_even_for_empty_record_list = True
        return made

    return asking_for_empty_lists, f"{description}, processRecords after empty reads too"


def _factory(
    config: PropertiesConfig,
    in_process: bool | None,
    processor: str | None,
    retry_failed_batches: bool,
) -> tuple[ProcessorFactory, str]:
    if in_process is None:
        in_process = processor is not None
    settings = config.multilang
    if not in_process:
        if processor is not None:
            raise ConfigError("a processor class is only used with the in-process path")
        spec = spec_from_settings(settings)

        def subprocess_factory() -> RecordProcessor:
            return SubprocessProcessor(spec)

        return subprocess_factory, f"subprocess path: {' '.join(spec.command)}"
    if processor is None:
        command = spec_from_settings(settings).command
        script = script_of(command, settings.cwd)
        name = None if script is None else processor_class_name(script)
        if script is None or name is None:
            raise ConfigError(
                f"--in-process: no processor class found in executableName "
                f"{settings.executable_name!r} (no Python script that calls "
                "kcl.KCLProcess(SomeClass())); name it: --in-process module:Class"
            )
        processor = f"{script}:{name}"
    if settings.timeout is not None:  # a thread cannot be killed as a child is
        log.warning(
            "timeoutInSeconds = %g is not applied on the in-process path (a processor call "
            "that hangs holds its lease; processor_stall_timeout makes the worker not ready): "
            "use the subprocess path to have a hung call end the child",
            settings.timeout,
        )
    cls = load_processor_class(processor, settings.cwd)
    if issubclass(cls, RecordProcessor):  # ours, maybe async: run as the daemon runs it
        from kclpy_spark.runtime.daemon import factory_of

        return factory_of(cls, processor), f"in-process path: {processor} (a RecordProcessor)"
    factory = processor_factory(cls, retry_failed_batches=retry_failed_batches)
    return factory, f"in-process path: {processor} (amazon_kclpy version {cls.version})"


def run_properties(
    path: str | Path,
    *,
    in_process: bool | None = None,
    processor: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    retry_failed_batches: bool = False,
) -> None:
    """Run the application of ``path`` until SIGTERM/SIGINT (see the module doc for the paths).

    ``overrides``: WorkerConfig fields that win over the file (``endpoint_url``, ``worker_id``...).
    Raises ConfigError (before anything starts) for a bad file, command or class.
    """
    from kclpy_spark.runtime.daemon import run_worker

    config = load_properties(path, overrides=overrides)
    factory, description = build_factory(
        config,
        in_process=in_process,
        processor=processor,
        retry_failed_batches=retry_failed_batches,
    )
    cfg = config.worker
    log.info(
        "%s: application %s on stream %s, worker %s, %s",
        config.path,
        cfg.application_name,
        cfg.stream,
        cfg.worker_id,
        description,
    )
    asyncio.run(run_worker(cfg, factory))
