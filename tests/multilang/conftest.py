"""Fixtures for the MultiLang tests: amazon_kclpy's own Python package, installed without jars."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="session")
def amazon_kclpy() -> ModuleType:
    """amazon_kclpy 3.2.0, installed into this venv from its source package on first use.

    Fails (never skips) when it cannot be installed: these tests exist to check compatibility
    with amazon_kclpy's real classes, so without them nothing was checked.
    """
    from install_amazon_kclpy import InstallError, install

    try:
        install()
    except InstallError as exc:
        pytest.fail(
            "amazon-kclpy's Python package could not be installed for the tests that run "
            "amazon_kclpy's own classes (python tests/multilang/install_amazon_kclpy.py needs "
            f"network access to PyPI once; then it is cached in .cache/amazon-kclpy): {exc}",
            pytrace=False,
        )
    importlib.invalidate_caches()
    return importlib.import_module("amazon_kclpy")


@pytest.fixture
def stream_name(unique_name: str, kinesis_client: Any, dynamodb_client: Any) -> Iterator[str]:
    """A unique name for a stream and its lease table; both are deleted after the test, since the
    shared LocalStack has an account-wide shard limit."""
    yield unique_name
    with contextlib.suppress(Exception):
        kinesis_client.delete_stream(StreamName=unique_name, EnforceConsumerDeletion=True)
    with contextlib.suppress(Exception):
        dynamodb_client.delete_table(TableName=unique_name)
