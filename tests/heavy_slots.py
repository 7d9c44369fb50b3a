"""How pytest-xdist hands test files to the suite's test processes (``--dist loadfile``: a file
runs whole in one process). At most ``slots`` CPU-heavy files run at once (each holds a lock
while it runs: ``tests/conftest.py``). With xdist's own order a process given a heavy file
while both slots were taken sat waiting for one, minutes in a run, while light files were
left; here a process that asks for work gets the first heavy file in line while fewer than
``slots`` are out, and otherwise the first light one (a heavy one once no light one is left:
it then waits on the lock, as before). Files keep the collection's order within each kind,
longest first (``LONGEST_FIRST`` in conftest; ``scripts/test.sh`` passes
``--no-loadscope-reorder``, or xdist would sort them by test count): pytest took 710-745 s
instead of 850-880 s on 2026-12-07. That order runs unit tests beside the Spark files; the two
that failed under that load had met a DynamoDB Local slowed by the Spark JVMs starting (the test
now makes its lease table before its outage, with seconds a call) or raced their own threads
(mended)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdist.scheduler import LoadFileScheduling


class HeavySlotScheduling(LoadFileScheduling):
    def __init__(
        self, config: Any, log: Any, *, is_heavy: Callable[[str], bool], slots: int
    ) -> None:
        super().__init__(config, log)
        self._is_heavy = is_heavy
        self._slots = slots

    def heavy_out(self, asking: Any) -> int:
        """The other test processes with a heavy file not finished (a process runs its files
        one after another: it holds one slot at a time). The asking process does not count: it
        asks when its last file has at most two tests to go, so a heavy file it is given next
        takes over that file's slot as it ends."""
        return sum(
            any(self._is_heavy(scope) and not all(tests.values()) for scope, tests in work.items())
            for node, work in self.assigned_work.items()
            if node is not asking
        )

    def remove_node(self, node: Any) -> str | None:
        """A test process that died: its unfinished files go back in line, not the ones it
        finished (xdist puts back all; handed out again first here, a finished file sends the
        asking process nothing, and it never asks again: the run hung)."""
        work = self.assigned_work.get(node, {})
        for scope in [scope for scope, tests in work.items() if all(tests.values())]:
            del work[scope]
        return super().remove_node(node)

    def _assign_work_unit(self, node: Any) -> None:
        want_heavy = self.heavy_out(node) < self._slots
        chosen = next(
            (scope for scope in self.workqueue if self._is_heavy(scope) == want_heavy),
            next(iter(self.workqueue)),
        )
        self.workqueue.move_to_end(chosen, last=False)  # the parent takes the first in line
        super()._assign_work_unit(node)
