"""Lease-table writes made durable together: one wait for the disk for a batch's writes instead
of one per write.

Inside ``durable_on_exit()``, a store that can (SQLite) commits this thread's writes without
waiting for its disk, each still its own transaction (won or lost at once, seen by every other
reader at once, kept if the process is killed), and joins the block; when the block ends, each
store that joined makes them durable with one sync (``DeferredSync.sync``). The caller acts on
the writes only after the block: the Spark writer's pending checkpoints, all of a batch's, are
durable before any sink writes. Stores whose every write is durable when it returns (DynamoDB,
the memory store) never join: the block costs them nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from checkpoint.base.errors import KclpySparkError

log = logging.getLogger(__name__)


class SyncError(KclpySparkError):
    """A durability block's sync failed: its writes that won are committed but maybe not on
    disk, and not made so by writing them again (after a failed sync the kernel may have
    dropped the pages it could not write, and a write-ahead log read back after a power cut
    stops at the first frame missing). Not retried: whoever would act on the writes gives up."""


class DeferredSync(Protocol):
    def sync(self) -> None:
        """Make every write this store committed so far durable (raises on failure)."""
        ...


_scope = threading.local()  # .stores: the stores this thread's open block defers, or None


@contextmanager
def durable_on_exit() -> Iterator[None]:
    """Writes of this thread inside the block are durable when it ends, synced once per store;
    a failed sync raises ``SyncError``. Nested blocks belong to the outermost. A body that
    raises is synced as well (its writes that won are committed); if that sync fails too, the
    ``SyncError`` propagates, the body's error as its cause (an interrupt or exit stays itself,
    the sync's failure logged)."""
    if getattr(_scope, "stores", None) is not None:
        yield
        return
    stores: list[DeferredSync] = []
    _scope.stores = stores
    try:
        yield
    except BaseException as failed:
        _scope.stores = None
        unsynced = _sync(stores)
        if unsynced is not None:
            if isinstance(failed, Exception):
                raise unsynced from failed
            log.error("%s (while %r ended the block)", unsynced, failed)
        raise
    _scope.stores = None
    unsynced = _sync(stores)
    if unsynced is not None:
        raise unsynced


def deferred(store: DeferredSync) -> bool:
    """Whether ``store``, about to commit a write, may leave it to this thread's block to sync
    (True: it joined the block)."""
    stores: list[DeferredSync] | None = getattr(_scope, "stores", None)
    if stores is None:
        return False
    if not any(s is store for s in stores):
        stores.append(store)
    return True


def _sync(stores: list[DeferredSync]) -> SyncError | None:
    """Sync each store; the first failure as a ``SyncError`` (the rest are not tried: the
    block's writes are not all durable either way)."""
    for store in stores:
        try:
            store.sync()
        except Exception as exc:
            error = SyncError(f"lease table writes not made durable: {exc}")
            error.__cause__ = exc
            return error
    return None
