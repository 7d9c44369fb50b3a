"""The shape the restructuring promised (issue 16): small modules and small functions, so each
stays readable in one sitting. Counted over the three packages, not the tests. A module past
MODULE_LINES_WARN lines is a warning that asks for a split by role (issue 46: a hard cap at that
size made files that were cut to fit, not by what they do); past MAX_MODULE_LINES it fails."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kclpy_spark", "shard_sync", "checkpoint")
MODULE_LINES_WARN = 400
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_packages_are_found() -> None:
    assert len(_modules()) > 50


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_function_sizes(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name} is over {MAX_MODULE_LINES} lines"
    if lines > MODULE_LINES_WARN:
        warnings.warn(
            f"{path.relative_to(ROOT)} has {lines} lines: split it by role (one room's question "
            "per module, ARCHITECTURE.md), not by moving code to where it fits",
            stacklevel=1,
        )
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _package_map() -> dict[str, str]:
    """ARCHITECTURE.md's package map: room (a folder, as ``kclpy_spark/spark/``) -> its row."""
    rows = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) >= 5 and cells[1].strip().startswith("`"):
            rows[cells[1].strip().split("`")[1]] = "|".join(cells[2:])
    return rows


def test_the_package_map_names_every_module() -> None:
    """A newcomer finds every module in ARCHITECTURE.md, in the row of its folder."""
    rows = _package_map()
    missing = [
        str(path.relative_to(ROOT))
        for path in _modules()
        if path.name != "__init__.py"
        and f"`{path.stem}`" not in rows.get(f"{path.parent.relative_to(ROOT)}/", "")
    ]
    assert not missing, f"modules ARCHITECTURE.md's package map does not name: {missing}"
