"""Start-up checks of the places a sink writes to, so a bad path is one line at start-up instead
of a Spark stack trace at the first write, and a sink never takes over what is not its own:

* the folder must be creatable and writable (a probe file is written and removed);
* ``parquet:`` refuses a Delta table, and a folder holding other files than its own pieces (a
  reader of the sink's folder would read them as records);
* ``delta:`` refuses a folder that holds files but no ``_delta_log``: creating a table there would
  leave those files outside it, and a VACUUM would delete them.

Paths with a scheme other than ``file://`` (s3://, abfss://...) are not checked here: the write
itself reports them.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from checkpoint.base.errors import ConfigError

# What a Parquet sink folder may hold besides its pieces (kcl_piece=...).
_PARQUET_OWN = ("kcl_piece=", "_staging", "_SUCCESS", ".")


# A URL's scheme (two letters at least: ``C:`` is a Windows drive).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")


def local_path(path: str) -> Path | None:
    """The local path of ``path``, or None for a URL of another file system (``s3a://...``, and
    Hadoop's one-slash forms, ``dbfs:/mnt/x``, ``hdfs:/x``) or a ``file:`` URL with no path. A
    ``file:`` URL is read as Spark (Hadoop) and Delta read it: ``file:/x``, ``file:///x`` and
    ``file://localhost/x`` are all ``/x`` (``file:/x`` was checked at ``./file:/x`` while Spark
    wrote to ``/x``)."""
    if path.startswith("file:"):
        url = urlsplit(path)
        return Path(url.path) if url.netloc in ("", "localhost") and url.path else None
    return None if "://" in path or _SCHEME.match(path) else Path(path)


def local_only(path: str, what: str) -> str | None:
    """Why ``path`` cannot be ``what`` (a folder this process writes and renames in), or None."""
    if local_path(path) is not None:
        return None
    return (
        f"{what} must be a local or mounted folder (on a cluster, one every executor sees), "
        f"got {path!r}"
    )


def check_writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".kclpy-spark-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{what}: cannot write to {str(folder)!r}: {exc.strerror or exc}"
        ) from None


def check_sink_path(kind: str, path: str) -> None:
    """Raise ConfigError naming the problem with a ``parquet:`` or ``delta:`` sink's folder."""
    folder = local_path(path)
    if folder is None:
        return
    what = f"config 'sink' {kind}:{path}"
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{what}: {str(folder)!r} is a file, not a folder")
    entries = sorted(os.listdir(folder)) if folder.is_dir() else []
    delta = "_delta_log" in entries
    if kind == "parquet":
        if delta:
            raise ConfigError(f'{what}: the folder is a Delta table; use sink = "delta:{path}"')
        foreign = [e for e in entries if not e.startswith(_PARQUET_OWN)]
        if foreign:
            raise ConfigError(
                f"{what}: the folder holds files that are not this sink's pieces "
                f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); readers of the "
                "sink would read them as records: use an empty folder"
            )
    elif kind == "delta" and entries and not delta:
        visible = [e for e in entries if not e.startswith(".")]
        if visible:
            raise ConfigError(
                f"{what}: the folder holds files but no _delta_log ({', '.join(visible[:5])}); "
                "a Delta table created there would leave them outside it (a VACUUM deletes "
                "them): use an empty folder or an existing Delta table"
            )
    check_writable(folder, what)
