"""Records' ``data`` parsed as JSON into the user's ``value_schema``, with nothing lost.

Spark's ``from_json`` is forgiving in two ways that lose a payload without a word: a JSON object
none (or only some) of whose keys match the schema's field names (compared exactly: ``{"ID": 4}``
does not fill ``id BIGINT``) parses as a row of nulls, and text after the first complete JSON value
(``{"id": 4} garbage``, two objects on one line) is ignored. Neither marks the record corrupt. So a
record keeps its bytes in ``unparsed_data`` unless it is exactly one JSON object that parsed into
the schema and names every top-level field of it (an explicit ``null`` names a field; a missing key
does not).

"Exactly one value" is checked by a second parse of the text wrapped as ``[<data>, {END: ""}]``
into ``ARRAY<MAP<STRING,STRING>>``: trailing text makes the wrapped text invalid or moves the end
marker out of second place, and the first element's map keys are the object's own keys (duplicate
keys are kept, never an error). Both parses run in Spark (on the executors on a cluster).

pyspark is imported inside the functions, never at module import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.spark.sql_text import sql_name, sql_string

# Spark's column for records PERMISSIVE mode could not parse (dropped from the output).
CORRUPT = "_kclpy_spark_corrupt_record"
# The wrapped parse's end marker: a key no schema field can clash with (a top-level column of
# ours never contains ':').
END = "kclpy-spark:end"
WRAPPED_TYPE = "ARRAY<MAP<STRING,STRING>>"


def with_values(
    df: Any,
    value_schema: str,
    *,
    keep_raw_data: bool = False,
    columns: Sequence[str] | None = None,
    fields: Sequence[str] | None = None,
    check_clash: bool = True,
) -> Any:
    """``df`` (the record columns, maybe more: ``columns``, else asked of ``df``) with ``data``
    parsed into ``value_schema``'s columns after the others and ``unparsed_data`` (``data``
    itself kept with ``keep_raw_data``): the daemon's sinks' DataFrame, and what a
    ``kinesis-kcl`` stream gives with ``with_values(df, "id BIGINT, name STRING")``. A schema
    Spark cannot parse, or a field named as a record column, is one line (ConfigError)."""
    keep = [c for c in (columns or df.columns) if c != "data" or keep_raw_data]
    if fields is None:
        try:
            fields = value_fields(df, value_schema)
        except Exception as exc:
            raise schema_error("value_schema", value_schema, exc) from None
    # Records that are not exactly one JSON object naming every field of the schema (or not
    # UTF-8 at all) are not lost: their bytes go to ``unparsed_data``.
    out = parse_values(df, value_schema, fields, keep)
    if check_clash:  # over Connect, .columns is a round trip
        clash = _clashing(out.columns, _case_sensitive(df))
        if clash:
            raise ConfigError(f"value_schema fields clash with the record columns: {clash}")
    return out


def _clashing(columns: Sequence[str], case_sensitive: bool) -> list[str]:
    """Names given to more than one column, as Spark resolves them (by default whatever their
    case: a field ``Stream`` passed a check by exact names, then every write failed with
    COLUMN_ALREADY_EXISTS)."""
    names = list(columns) if case_sensitive else [c.lower() for c in columns]
    return sorted({c for c in names if names.count(c) > 1})


def _case_sensitive(df: Any) -> bool:
    session = getattr(df, "sparkSession", None)
    return session is not None and spark_flag(session, "spark.sql.caseSensitive")


def spark_flag(session: Any, key: str) -> bool:
    """Whether the boolean Spark setting ``key`` is on (off, Spark's default for the ones asked
    here, when the session cannot say)."""
    try:
        return str(session.conf.get(key, "false")).strip().lower() == "true"
    except Exception:  # a session that cannot say
        return False


def schema_error(name: str, value_schema: str, exc: BaseException) -> ConfigError:
    """One line: ``value_schema`` (named ``name``) is not a schema Spark parses JSON into."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return ConfigError(
        f"{name} {value_schema!r} is not a Spark DDL schema (e.g. 'id BIGINT, name STRING'): "
        f"{first}"
    )


def value_fields(df: Any, value_schema: str) -> list[str]:
    """The top-level field names of ``value_schema`` (Spark's own DDL parser, via an analysis of
    ``df``, whose ``data`` column is binary). Raises what Spark raises for a bad schema."""
    from pyspark.sql import functions as F

    probe = df.select(F.from_json(F.col("data").cast("string"), value_schema).alias("v"))
    return list(probe.schema["v"].dataType.names)


def parse_values(df: Any, value_schema: str, fields: Sequence[str], keep: Sequence[str]) -> Any:
    """``df`` with ``data`` parsed into ``value_schema``'s columns after the ``keep`` columns, and
    ``unparsed_data``: the record's bytes when it did not parse exactly (see the module doc),
    else null. SQL text, two calls to the JVM and one per column: the same expressions built
    from Column functions were ~190 calls for three fields, each batch."""
    text = "CAST(data AS STRING)"
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {sql_string(CORRUPT)})"
    parsed = f"from_json({text}, {sql_string(f'{value_schema}, {CORRUPT} STRING')}, {options})"
    tail = sql_string(f'\n,{{"{END}":""}}]')
    wrapped = f"from_json(concat('[', {text}, {tail}), {sql_string(WRAPPED_TYPE)})"
    kept = [sql_name(c) for c in keep]
    # The wrapped parse once, as a column the checks then read (in one projection its text would
    # be written once per check).
    staged = df.selectExpr(
        *kept, f"{parsed} AS __value", "data AS __raw", f"{wrapped} AS __wrapped"
    )
    unparsed = (
        f"__value.{sql_name(CORRUPT)} IS NOT NULL OR NOT {exactly_filled('__wrapped', fields)}"
    )
    return staged.selectExpr(
        *kept,
        *(f"__value.{sql_name(f)} AS {sql_name(f)}" for f in fields),
        f"CASE WHEN {unparsed} THEN __raw END AS unparsed_data",
    )


def exactly_filled(wrapped: str, fields: Sequence[str]) -> str:
    """A boolean SQL expression, never null: the wrapped parse (``wrapped``, SQL) holds exactly
    the record's object and the end marker, and the object has a key for every one of
    ``fields``."""
    first = f"try_element_at({wrapped}, 1)"
    marker = f"try_element_at({wrapped}, 2)"
    exact = [f"size({wrapped}) = 2", f"{marker}[{sql_string(END)}] = ''"]
    exact += [f"map_contains_key({first}, {sql_string(name)})" for name in fields]
    return f"coalesce({' AND '.join(exact)}, false)"
