"""Importing the user's modules from the working directory (#49's poor list: a ``sqlite3.py``
there shadowed the standard library, because the working directory came first on sys.path)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from kclpy_spark.user_code import import_user_module, working_directory_importable


def test_the_working_directory_comes_after_the_interpreters_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sqlite3.py").write_text("raise ImportError('the shadow')\n")
    (tmp_path / "my_processor_mod.py").write_text("VALUE = 7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    working_directory_importable()
    working_directory_importable()  # idempotent
    assert sys.path.count(str(tmp_path)) == 1 and "" not in sys.path
    # after the standard library, before the installed packages
    stdlib = os.path.dirname(os.__file__)
    at = sys.path.index(str(tmp_path))
    assert sys.path.index(stdlib) < at
    assert all("-packages" not in os.path.basename(p) for p in sys.path[:at])
    spec = importlib.util.find_spec("sqlite3")
    assert spec is not None and spec.origin is not None
    assert not spec.origin.startswith(str(tmp_path))  # the standard library's
    assert import_user_module("my_processor_mod", "processor").VALUE == 7
    sys.modules.pop("my_processor_mod", None)


def test_a_module_that_calls_sys_exit_on_import_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.exit(0)`` at a processor module's top level ended the daemon with status 0."""
    from checkpoint.base.errors import ConfigError

    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ConfigError, match=r"exits_on_import.*SystemExit"):
        import_user_module("exits_on_import", "processor")


def test_a_module_in_the_working_directory_wins_over_an_installed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``six.py`` in the working directory is the user's processor module, not the installed
    ``six``: the directory comes before the installed packages."""
    (tmp_path / "six.py").write_text("class P:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "six", raising=False)
    assert hasattr(import_user_module("six", "processor"), "P")
    sys.modules.pop("six", None)
