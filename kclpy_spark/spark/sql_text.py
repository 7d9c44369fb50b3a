"""Values written into Spark SQL text. A DataFrame built from one SQL expression is one call to
the driver's JVM, where the same expression built from Column functions is a call or more per
function and literal (each tens of microseconds of the driver's Python, on every batch)."""

from __future__ import annotations


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal (a backslash escapes in Spark SQL's literals)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_name(name: str) -> str:
    """``name`` as a Spark SQL identifier: in backticks, a backtick in it doubled."""
    return "`" + name.replace("`", "``") + "`"
