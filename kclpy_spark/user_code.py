"""Importing the user's code named in a config (``processor = "myproc:Counter"``, a sink function):
the working directory is importable (after the interpreter's own paths), and a module that cannot
be imported gets one line that says where it was looked for."""

from __future__ import annotations

import importlib
import os
import site
import sys
from types import ModuleType

from checkpoint.base.errors import ConfigError


def working_directory_importable() -> str:
    """Make the working directory importable after the standard library and before the installed
    packages (``python -m`` puts it first, as ``""``): a file there named like a standard
    module, ``sqlite3.py`` say, must not shadow the module the worker imports later, and the
    user's ``six.py`` still wins over an installed ``six``. Other entries keep their order.
    Idempotent."""
    cwd = os.getcwd()
    importable_after_the_standard_library(cwd, also_remove="")
    return cwd


def importable_after_the_standard_library(folder: str, *, also_remove: str | None = None) -> None:
    """Put ``folder`` on ``sys.path`` after the standard library and before the installed
    packages (moved there if it was elsewhere; ``also_remove``: another entry to drop)."""
    rest = [p for p in sys.path if p not in (also_remove, folder)]
    packages = {*site.getsitepackages(), site.getusersitepackages()}
    at = next(
        (i for i, p in enumerate(rest) if p in packages or "-packages" in os.path.basename(p)),
        len(rest),
    )
    sys.path[:] = [*rest[:at], folder, *rest[at:]]


def import_user_module(module_name: str, what: str) -> ModuleType:
    """Import ``module_name`` for ``what`` (e.g. "processor"); ConfigError if it cannot be."""
    cwd = working_directory_importable()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.split(".")[0] == exc.name.split(".")[0]:
            raise ConfigError(
                f"cannot import {what} module {module_name!r}: no module named {exc.name!r} in "
                f"the working directory {cwd} or the installed packages (run from the folder "
                "that holds it, or add that folder to PYTHONPATH)"
            ) from None
        raise ConfigError(f"cannot import {what} module {module_name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:  # whatever the module raised (sys.exit(0) too)
        raise ConfigError(f"cannot import {what} module {module_name!r}: {exc!r}") from None
