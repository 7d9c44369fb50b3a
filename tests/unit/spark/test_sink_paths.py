"""Start-up checks of a sink's folder (issue 15): unwritable, a foreign table, foreign files."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint.base.errors import ConfigError
from kclpy_spark.spark.paths import check_sink_path
from kclpy_spark.spark.session import SparkTarget


def test_an_empty_or_own_folder_is_fine_and_created(tmp_path: Path) -> None:
    check_sink_path("parquet", str(tmp_path / "new" / "out"))
    assert (tmp_path / "new" / "out").is_dir()
    own = tmp_path / "own"
    (own / "kcl_piece=p1").mkdir(parents=True)
    (own / "_staging").mkdir()
    check_sink_path("parquet", str(own))
    table = tmp_path / "table"
    (table / "_delta_log").mkdir(parents=True)
    (table / "part-0.parquet").write_bytes(b"x")
    check_sink_path("delta", str(table))
    check_sink_path("delta", "s3://bucket/table")  # remote: the write reports problems


def test_a_path_that_cannot_be_a_folder_is_one_line_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_sink_path("parquet", str(tmp_path / "file"))
    with pytest.raises(ConfigError, match="cannot write"):
        check_sink_path("parquet", str(tmp_path / "file" / "below"))


def test_delta_over_plain_parquet_files_is_refused(tmp_path: Path) -> None:
    """It used to create _delta_log in place, leaving the files outside the table."""
    (tmp_path / "part-0.parquet").write_bytes(b"x")
    with pytest.raises(ConfigError, match="no _delta_log"):
        check_sink_path("delta", str(tmp_path))
    assert not (tmp_path / "_delta_log").exists()


def test_parquet_over_a_delta_table_or_foreign_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "delta" / "_delta_log").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is a Delta table"):
        check_sink_path("parquet", str(tmp_path / "delta"))
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "orders.csv").write_text("x")
    with pytest.raises(ConfigError, match=r"orders\.csv"):
        check_sink_path("parquet", str(tmp_path / "mixed"))


@pytest.mark.parametrize("target", ["local[0]", "local[00]", "local[-1]"])
def test_a_local_target_without_cores_is_refused(target: str) -> None:
    with pytest.raises(ConfigError, match="spark_target"):
        SparkTarget.parse(target)
