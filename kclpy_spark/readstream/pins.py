"""Where the ``kinesis-kcl`` source keeps each range's pin (what its first read found), so a
replayed batch reads exactly the same records (offsets.py says why).

``PinStore`` is the port; ``DirectoryPins`` keeps one small JSON file per (run, batch, shard)
in a folder every executor and the driver see (one machine, or a shared mount). The first pin of
a range wins: it is written to a file of its own and linked into place, which fails if a pin is
already there (two attempts of one task, a speculative copy), and the loser reads the winner's.
Pins older than the batch before the last planned one are never read again: ``forget_before``
deletes them, so the folder holds a bounded number of files whatever the query's age.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Protocol

from checkpoint.base.errors import ConfigError
from kclpy_spark.readstream.offsets import Pin

log = logging.getLogger(__name__)


class PinStore(Protocol):
    def get(self, run: str, batch: int, shard_id: str) -> Pin | None:
        """The pin of a range, if its first read stored one."""
        ...

    def put_first(self, run: str, batch: int, shard_id: str, pin: Pin) -> Pin:
        """Store ``pin`` unless the range has one: returns the pin that is stored (the winner)."""
        ...

    def forget_before(self, run: str, batch: int) -> int:
        """Delete the pins of the run's batches before ``batch``; how many batches went."""
        ...

    def mark_planned(self, run: str, batch: int) -> None:
        """Note that the batch's partitions were planned (its tasks may pin)."""
        ...

    def planned(self, run: str, batch: int) -> bool:
        """Whether the batch was planned with this store (its missing pins: tasks not run)."""
        ...

    def mark_skipped(self, run: str, batch: int, shard_id: str) -> None:
        """Note that the batch leaves the shard out (a replay whose lease had moved): for good,
        whatever a later replay finds."""
        ...

    def skipped(self, run: str, batch: int) -> set[str]:
        """The shards the batch leaves out."""
        ...


class DirectoryPins:
    def __init__(self, root: str | Path) -> None:
        self._root = Path(root)

    def _batch_dir(self, run: str, batch: int) -> Path:
        return self._root / run / f"batch-{batch:012d}"

    def get(self, run: str, batch: int, shard_id: str) -> Pin | None:
        path = self._batch_dir(run, batch) / f"{shard_id}.json"
        try:
            return Pin.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None

    def put_first(self, run: str, batch: int, shard_id: str, pin: Pin) -> Pin:
        folder = self._batch_dir(run, batch)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{shard_id}.json"
        draft = folder / f".{shard_id}.{uuid.uuid4().hex}.tmp"
        with open(draft, "w") as fh:
            json.dump(pin.to_json(), fh)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(draft, final)  # atomic, and fails when a pin is there
            return pin
        except FileExistsError:
            stored = self.get(run, batch, shard_id)
            if stored is None:  # pragma: no cover - a pin is never deleted while its batch runs
                raise
            return stored
        finally:
            draft.unlink(missing_ok=True)

    def mark_planned(self, run: str, batch: int) -> None:
        folder = self._batch_dir(run, batch)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".planned").touch()

    def planned(self, run: str, batch: int) -> bool:
        return (self._batch_dir(run, batch) / ".planned").exists()

    def mark_skipped(self, run: str, batch: int, shard_id: str) -> None:
        folder = self._batch_dir(run, batch)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f".skip-{shard_id}").touch()

    def skipped(self, run: str, batch: int) -> set[str]:
        folder = self._batch_dir(run, batch)
        if not folder.is_dir():
            return set()
        return {p.name.removeprefix(".skip-") for p in folder.glob(".skip-*")}

    def check(self) -> None:
        """One line unless the folder takes pins: writable, and with hard links (the first pin
        wins by a link; object-store mounts often have none)."""
        probe = self._root / f".probe-{uuid.uuid4().hex}"
        try:
            self._root.mkdir(parents=True, exist_ok=True)
            probe.write_text("{}")
            os.link(probe, probe.with_suffix(".link"))
        except OSError as exc:
            raise ConfigError(
                f"kinesis-kcl: option pinLocation {str(self._root)!r} cannot hold pins "
                f"({exc.strerror or exc}): a folder on a file system with hard links that the "
                "driver and every executor see"
            ) from None
        finally:
            for path in (probe, probe.with_suffix(".link")):
                with contextlib.suppress(OSError):
                    path.unlink()

    def forget_before(self, run: str, batch: int) -> int:
        gone = 0
        folder = self._root / run
        if not folder.is_dir():
            return 0
        for child in folder.iterdir():
            number = child.name.removeprefix("batch-")
            whole = number.removeprefix("-").isdigit()  # batch -1: a leased query's first plan
            if child.name.startswith("batch-") and whole and int(number) < batch:
                try:
                    shutil.rmtree(child)
                    gone += 1
                except FileNotFoundError:
                    pass
                except OSError as exc:  # a late task's file, an NFS .nfs file: next batch
                    log.warning("kinesis-kcl: could not delete the pins of %s: %s", child, exc)
        return gone
