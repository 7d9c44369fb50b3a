"""``values.with_values`` on real local Spark, beyond the JSON cases the sink tests cover: field
names SQL would read otherwise, and a number of calls to the driver's JVM per batch that does not
grow by more than one per field (each call is tens of microseconds of the driver's Python)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from jvm_calls import jvm_calls

from kclpy_spark.spark.range_tasks import OUTPUT_SCHEMA, READ_COLUMNS
from kclpy_spark.spark.values import value_fields, with_values


def records(spark: Any, payloads: list[bytes]) -> Any:
    """The record columns as a read on the executors gives them (its own columns left out)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    columns = pa.schema([f for f in OUTPUT_SCHEMA if f.name not in READ_COLUMNS])
    rows = [("s", "sh", str(i), 0, "pk", None, p) for i, p in enumerate(payloads)]
    return spark.createDataFrame(rows, from_arrow_schema(columns))


def test_field_names_with_backticks_dots_and_spaces_are_parsed_and_checked(spark: Any) -> None:
    schema = "`we``ird.f` INT, `sp ace` STRING"
    df = records(spark, [b'{"we`ird.f": 3, "sp ace": "x"}', b'{"we`ird.f": 4}'])
    out = with_values(df, schema)
    assert out.columns[-3:] == ["we`ird.f", "sp ace", "unparsed_data"]
    got = sorted((r["we`ird.f"], r["sp ace"], r["unparsed_data"]) for r in out.collect())
    assert got == [(3, "x", None), (4, None, bytearray(b'{"we`ird.f": 4}'))]  # a key missing


def test_a_field_named_as_a_record_column_in_another_case_is_refused(spark: Any) -> None:
    """Spark resolves names whatever their case: a field ``Stream`` passed the exact-name check,
    then every write failed with COLUMN_ALREADY_EXISTS (each lease parked)."""
    import pytest

    from checkpoint.base.errors import ConfigError

    df = records(spark, [b'{"Stream": "a", "id": 1}'])
    with pytest.raises(ConfigError, match="clash with the record columns: \\['stream'\\]"):
        with_values(df, "Stream STRING, id BIGINT")
    spark.conf.set("spark.sql.caseSensitive", "true")
    try:
        out = with_values(df, "Stream STRING, id BIGINT")
        assert [r["Stream"] for r in out.collect()] == ["a"]
    finally:
        spark.conf.set("spark.sql.caseSensitive", "false")


def test_a_batchs_calls_to_the_jvm_grow_by_one_a_field_at_most(spark: Any) -> None:
    df = records(spark, [b'{"a": 1}'])
    columns = df.columns

    def calls(schema: str) -> int:
        fields = value_fields(df, schema)
        with_values(df, schema, columns=columns, fields=fields, check_clash=False)  # warm
        with jvm_calls(spark) as count:
            with_values(df, schema, columns=columns, fields=fields, check_clash=False)
        return count[0]

    one = calls("a INT")
    six = calls("a INT, b INT, c INT, d INT, e INT, f INT")
    assert one <= 36 and six - one <= 5  # Column functions: ~190 calls for three fields
