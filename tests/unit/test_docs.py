"""#45: the documentation is built and kept true by the suite: the site builds with warnings as
errors, the configuration reference is the one the code generates (every key, with its type,
default and bounds, described), and README stays a short front page whose links resolve."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from checkpoint.base.errors import ConfigError
from kclpy_spark import config_reference as reference
from kclpy_spark.config import WorkerConfig
from kclpy_spark.multilang.kcl_keys import SPECIAL
from kclpy_spark.spark.settings import BatcherSettings
from kclpy_spark.spark.sink_config import SinkConfig, SinkSpec

REPO = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_the_generated_one() -> None:
    page = (REPO / "docs/configuration.md").read_text()
    assert page == reference.render(), (
        "docs/configuration.md is stale: python -m kclpy_spark.config_reference > "
        "docs/configuration.md"
    )


def test_every_key_has_a_row_with_its_default() -> None:
    page = reference.render()
    for cls in (WorkerConfig, SinkConfig, BatcherSettings, SinkSpec):
        for f in dataclasses.fields(cls):
            if f.name != "batching":
                assert f"| `{f.name}` |" in page, (cls.__name__, f.name)
    row = next(line for line in page.splitlines() if line.startswith("| `failover_time` |"))
    assert "| 10 |" in row and "0.5..3600 s" in row and "`failoverTimeMillis`" in row
    row = next(line for line in page.splitlines() if line.startswith("| `batches_in_flight` |"))
    assert "2 (a function: 1)" in row  # a config file's default, by sink kind
    for keys in reference.SPECIAL_KEYS.values():
        assert all(key in SPECIAL for key in keys.split(", ")), keys


def test_every_flag_of_run_that_names_a_key_is_in_its_row() -> None:
    """The flags come from ``kclpy-spark run``'s parser itself: ``--until-caught-up``, added to
    the subcommand apart from the shared worker flags, was once missing from its row."""
    page = reference.render()
    keys = {f.name for f in dataclasses.fields(WorkerConfig)}
    flags = [flag for flag in reference._flags() if flag[2:].replace("-", "_") in keys]
    assert "--until-caught-up" in flags and "--stream-name" in flags
    for flag in flags:
        key = flag[2:].replace("-", "_")
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
        assert f"`{flag}`" in row, (flag, row)


def test_a_key_without_a_comment_stops_the_reference() -> None:
    @dataclasses.dataclass(frozen=True)
    class Settings:
        # Described.
        said: int = 1
        unsaid: int = 2

    assert reference.descriptions(Settings) == {"said": "Described.", "unsaid": ""}
    with pytest.raises(ConfigError, match="unsaid has no comment"):
        reference._table(Settings, ["said", "unsaid"], defaults={}, worker=False)


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site/configuration/index.html").exists()


def test_readme_is_a_short_front_page_whose_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)", text)
    assert links, "README links to the docs"
    for link in links:
        assert (REPO / link).exists(), link


def _test_names() -> tuple[set[str], set[str]]:
    """Every test function's name and every test module's file name under tests/."""
    functions: set[str] = set()
    files: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        files.add(path.name)
        functions.update(re.findall(r"def (test_\w+)", path.read_text()))
    return functions, files


def test_every_test_a_document_names_exists() -> None:
    """A guarantee names the test that shows it (README, docs/, ARCHITECTURE, BENCHMARKS,
    CHANGELOG): a test renamed or removed must take its mentions with it."""
    functions, files = _test_names()
    known = functions | {name.removesuffix(".py") for name in files}  # a module named bare too
    pages = [
        REPO / name for name in ("README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "CHANGELOG.md")
    ]
    pages += sorted((REPO / "docs").rglob("*.md"))
    missing = []
    for page in pages:
        text = page.read_text()
        paths = re.findall(r"tests/[\w/]+\.py", text)
        missing += [f"{page.name}: {p}" for p in paths if not (REPO / p).exists()]
        for name, module in re.findall(r"\b(test_\w+)(\.py)?", text):
            if (name + module not in files) if module else (name not in known):
                missing.append(f"{page.name}: {name}{module}")
    assert missing == []
