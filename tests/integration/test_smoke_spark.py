"""Smoke test of the real local SparkSession: write Parquet from Arrow and read it back."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_parquet_round_trip(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table(
        {
            "shard_id": ["shardId-000000000000"] * 3,
            "sequence_number": ["1", "2", "3"],
            "data": [b"a", b"\x00\xff", b"c"],
        }
    )
    out = str(tmp_path / "out")
    spark.createDataFrame(table).write.mode("append").parquet(out)
    back = spark.read.parquet(out).orderBy("sequence_number").collect()
    assert [r["sequence_number"] for r in back] == ["1", "2", "3"]
    assert [bytes(r["data"]) for r in back] == [b"a", b"\x00\xff", b"c"]
