"""What runs per lease in the MultiLang subprocess path: ``executableName`` split like a shell
command line and resolved (against the .properties folder, then PATH), checked at start-up so a
missing program or script is one line, not a child that fails at every lease."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from checkpoint.base.errors import ConfigError
from kclpy_spark.multilang.properties import MultiLangSettings


@dataclass(frozen=True)
class ChildSpec:
    """The command to run per lease (already split and resolved), where, and its time limits."""

    command: tuple[str, ...]
    cwd: Path
    timeout: float | None = None
    shutdown_grace: float = 5.0
    env: Mapping[str, str] | None = None


def resolve_command(executable_name: str, cwd: Path) -> tuple[str, ...]:
    """``executableName`` split like a shell command line, its program resolved against ``cwd``
    (then PATH). A ``.py`` script that is not executable runs with this Python interpreter.
    Raises ConfigError if the program cannot be found or run."""
    try:
        parts = shlex.split(executable_name)
    except ValueError as exc:
        raise ConfigError(f"property 'executableName' cannot be split: {exc}") from None
    if not parts:
        raise ConfigError("property 'executableName' is empty")
    program = parts[0]
    local = cwd / program
    if os.sep in program or local.exists():
        if not local.exists():
            raise ConfigError(f"property 'executableName': {str(local)!r} does not exist")
        if not local.is_file():
            raise ConfigError(f"property 'executableName': {str(local)!r} is not a file")
        if os.access(local, os.X_OK):
            return (str(local), *parts[1:])
        if local.suffix == ".py":
            return (sys.executable, str(local), *parts[1:])
        raise ConfigError(f"property 'executableName': {str(local)!r} is not executable")
    found = shutil.which(program)
    if found is None:
        raise ConfigError(f"property 'executableName': {program!r} is not found on PATH")
    for arg in parts[1:]:
        # ``python3 app.py``: the interpreter exists, but would the child find its script?
        if arg.endswith(".py") and not arg.startswith("-") and not (cwd / arg).is_file():
            raise ConfigError(
                f"property 'executableName': the script {arg!r} does not exist in {str(cwd)!r}"
            )
    return (found, *parts[1:])


def spec_from_settings(settings: MultiLangSettings) -> ChildSpec:
    return ChildSpec(
        command=resolve_command(settings.executable_name, settings.cwd),
        cwd=settings.cwd,
        timeout=settings.timeout,
        shutdown_grace=settings.shutdown_grace,
    )
