"""The configuration reference (docs/configuration.md), generated from the config classes.

Every key of ``WorkerConfig`` (the worker: top level of the TOML file, ``KCLPY_SPARK_<KEY>``,
some as flags), ``SinkConfig`` and ``BatcherSettings`` (the ``[sink]`` table) and ``SinkSpec``
(a ``[[sinks]]`` entry), with its type, its default as a config file gets it, its bounds and its
amazon-kclpy ``.properties`` name. A key's description is the comment written above (or beside)
its field in the class: a key without one is an error here, so a new key cannot go undocumented
(tests/unit/test_docs.py regenerates the page and compares).

``python -m kclpy_spark.config_reference > docs/configuration.md`` writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import textwrap
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.config import WorkerConfig
from kclpy_spark.config_checks import CHOICES, INT_BOUNDS, READ_RATE_BOUNDS, bounds_text
from kclpy_spark.config_rules import DURATIONS
from kclpy_spark.multilang.kcl_keys import FIELDS as KCL_FIELDS
from kclpy_spark.multilang.kcl_keys import SPECIAL as KCL_SPECIAL
from kclpy_spark.spark.settings import MAX_SECONDS, MAX_STATE_PIECES, MAX_WRITERS, BatcherSettings
from kclpy_spark.spark.sink_config import SinkConfig, SinkSpec, sink_config_from_mapping

# .properties keys read with rules of their own (kcl_keys.SPECIAL), by the key they set.
SPECIAL_KEYS = {
    "stream_name": "streamName",
    "stream_arn": "streamArn",
    "initial_position": "initialPositionInStream, initialPositionInStreamExtended",
    "endpoint_url": "kinesisEndpoint, dynamoDBEndpoint",
    "retrieval_mode": "retrievalMode",
    "consumer_name": "consumerName",
}
FIELD = re.compile(r"^    (\w+): [^=]+(?:= (.*?))?(?:\s+# (.*))?$")


def descriptions(cls: type) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it and a ``#`` beside it."""
    found: dict[str, str] = {}
    above: list[str] = []
    for line in textwrap.dedent(inspect.getsource(cls)).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").rstrip())
            continue
        match = FIELD.match(line)
        if match and match.group(1) in {f.name for f in dataclasses.fields(cls)}:
            beside = match.group(3) or ""
            found[match.group(1)] = " ".join([*above, beside]).strip()
        above = []
    return found


def _default(cls: type, name: str, defaults: dict[str, Any]) -> str:
    if name in defaults:
        return str(defaults[name])
    f = {x.name: x for x in dataclasses.fields(cls)}[name]
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = None if name in {"worker_id", "initial_position"} else f.default_factory()
    else:
        return "(required)"
    return DYNAMIC[name] if value is None and name in DYNAMIC else _shown(value)


DYNAMIC = {
    "worker_id": "host:pid:random",
    "initial_position": '"LATEST"',
    "region": "the stream ARN's, `AWS_REGION`, the SDK's; us-east-1 with `endpoint_url`",
    "profile": "`AWS_PROFILE`, else the default profile",
    "consumer_name": "the application name",
}


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value else '""'
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:_}".replace("_", ",") if value < 2**31 - 1 else "unlimited"
    if isinstance(value, tuple | list | dict) and not value:
        return "none"
    return f"`{value!r}`"


def _bounds(cls: type, name: str) -> str:
    if cls is not WorkerConfig:
        return _sink_bounds(name)
    if name in DURATIONS:
        shortest, longest, _ = DURATIONS[name]
        return f"{shortest:g}..{longest:g} s"
    if name in INT_BOUNDS:
        low, high, _ = INT_BOUNDS[name]
        return bounds_text(low, high)
    if name == "max_read_bytes_per_second":
        return f"0 or {READ_RATE_BOUNDS[0]}..{READ_RATE_BOUNDS[1]}"
    if name in CHOICES:
        return " \\| ".join(f"`{c}`" for c in CHOICES[name])
    return ""


def _sink_bounds(name: str) -> str:
    if name in {"max_wait", "write_timeout"}:  # a sink batches; a write waits a while
        return f"> 0, <= {MAX_SECONDS[name]:g} s"
    if name == "retry_max_delay":
        return f"0..{MAX_SECONDS[name]:g} s, >= retry_base_delay"
    if name in MAX_SECONDS:
        return f"0..{MAX_SECONDS[name]:g} s"
    if name == "buffer_bytes":
        return ">= 0"
    if name == "writers":
        return f"1..{MAX_WRITERS}"
    if name in {"max_leases", "batches_in_flight"}:
        most = MAX_STATE_PIECES
        return f">= 1; a function in worker scope: max_leases x batches_in_flight <= {most}"
    if name in {"max_records", "max_bytes", "max_attempts"}:
        return ">= 1"
    if name == "delta_txn_retention_days":
        return "1..36500, >= 2 x write_timeout"
    if name == "read_on":
        return "`driver` \\| `executors`"
    if name == "scope":
        return "`worker` \\| `lease`"
    return ""


def _properties_key(name: str) -> str:
    keys = [k for k, (field, _) in KCL_FIELDS.items() if field == name]
    special = [k for k in SPECIAL_KEYS.get(name, "").split(", ") if k in KCL_SPECIAL]
    return ", ".join(f"`{k}`" for k in (*keys, *special))


def _flags() -> set[str]:
    """The flags ``kclpy-spark run`` takes, as its parser has them."""
    from kclpy_spark import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    run = sub.choices["run"]
    return {flag for action in run._actions for flag in action.option_strings}


def _table(cls: type, rows: list[str], *, defaults: dict[str, Any], worker: bool) -> list[str]:
    said = descriptions(cls)
    flags = _flags() if worker else set()
    ways_column = "flag, env, .properties | " if worker else ""
    header = ["| key | type | default | bounds | " + ways_column + "what it does |"]
    header.append("|---|---|---|---|" + ("---|" if worker else "") + "---|")
    out = header
    for f in dataclasses.fields(cls):
        if f.name not in rows:
            continue
        if not said.get(f.name):
            raise ConfigError(f"{cls.__name__}.{f.name} has no comment to describe it")
        kind = str(f.type).replace(" | None", " (optional)").replace("|", "\\|")
        cells = [f"`{f.name}`", f"`{kind}`", _default(cls, f.name, defaults), _bounds(cls, f.name)]
        if worker:
            flag = "--" + f.name.replace("_", "-")
            ways = [f"`{flag}`"] if flag in flags else []
            ways.append(f"`KCLPY_SPARK_{f.name.upper()}`" if f.name != "streams" else "")
            ways.append(_properties_key(f.name))
            cells.append("<br>".join(w for w in ways if w))
        cells.append(said[f.name].replace("|", "\\|").replace("<", "&lt;"))
        out.append("| " + " | ".join(cells) + " |")
    return out


def _sink_defaults() -> tuple[dict[str, Any], dict[str, Any]]:
    """The batching defaults a config file gets: for Parquet/Delta sinks and for a function."""
    files = sink_config_from_mapping({"sink": "parquet:/data/out"}).batching
    function = sink_config_from_mapping({"sink": "my_job:foreach_batch"}).batching
    shown: dict[str, Any] = {}
    for f in dataclasses.fields(BatcherSettings):
        a, b = getattr(files, f.name), getattr(function, f.name)
        shown[f.name] = _shown(a) if a == b else f"{_shown(a)} (a function: {_shown(b)})"
    return shown, {}


def render() -> str:
    batching, _ = _sink_defaults()
    worker_rows = [f.name for f in dataclasses.fields(WorkerConfig)]
    sink_rows = [f.name for f in dataclasses.fields(SinkConfig) if f.name != "batching"]
    batching_rows = [f.name for f in dataclasses.fields(BatcherSettings)]
    spec_rows = [f.name for f in dataclasses.fields(SinkSpec)]
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config classes by `python -m kclpy_spark.config_reference` (a test "
        "fails when this page and the code differ). Durations are seconds; sizes are bytes.",
        "",
        "## The worker",
        "",
        "Top-level keys of the TOML file (or a `[kclpy_spark]` table). Each can also be set as "
        "`KCLPY_SPARK_<KEY>` in the environment; a flag beats the variable, the variable beats "
        "the file, the file beats the default (the stream is one setting: a layer naming "
        "`stream_name`, `stream_arn` or `[[streams]]` replaces the stream of the layers below "
        "it). For an amazon-kclpy `.properties` file, the "
        "KCL's key is named where one exists; `kclpyspark.<key>` sets any key there.",
        "",
        *_table(WorkerConfig, worker_rows, defaults={}, worker=True),
        "",
        "## The Spark sink: `[sink]`",
        "",
        "A `[sink]` table makes the worker write micro-batches to Spark (the `[spark]` extra). "
        "The batching keys' defaults depend on the sink: where they differ for a function sink, "
        "both are shown.",
        "",
        *_table(SinkConfig, sink_rows, defaults={}, worker=False),
        *_table(BatcherSettings, batching_rows, defaults=batching, worker=False)[2:],
        "",
        "## Several sinks: `[[sinks]]`",
        "",
        "Each entry is one sink a batch goes to (then `sink` is left out of `[sink]`); unset "
        "`max_attempts` and `write_timeout` take the `[sink]` table's.",
        "",
        *_table(SinkSpec, spec_rows, defaults={}, worker=False),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
