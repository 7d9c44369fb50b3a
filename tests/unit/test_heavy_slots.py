"""The suite's own xdist scheduling (tests/heavy_slots.py): which file a test process that asks
for work is given, with fake processes (xdist's controller is not started)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from heavy_slots import HeavySlotScheduling


class FakeProcess:
    shutting_down = False

    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)


FILES = ("heavy_a.py", "light_a.py", "heavy_b.py", "heavy_c.py", "light_b.py")


def scheduler(processes: list[FakeProcess]) -> HeavySlotScheduling:
    sched = HeavySlotScheduling.__new__(HeavySlotScheduling)  # past xdist's config parsing
    sched.workqueue = OrderedDict((f, {f"{f}::t{i}": False for i in range(3)}) for f in FILES)
    collection = [test for tests in sched.workqueue.values() for test in tests]
    sched.assigned_work = {p: {} for p in processes}
    sched.registered_collections = {p: collection for p in processes}
    sched._is_heavy = lambda scope: scope.startswith("heavy")
    sched._slots = 2
    return sched


def given(sched: HeavySlotScheduling, process: Any) -> str:
    sched._assign_work_unit(process)
    return list(sched.assigned_work[process])[-1]


def finish(sched: HeavySlotScheduling, process: Any, file: str, left: int = 0) -> None:
    tests = sched.assigned_work[process][file]
    for test in list(tests)[: len(tests) - left]:
        tests[test] = True


def started() -> tuple[HeavySlotScheduling, list[FakeProcess]]:
    processes = [FakeProcess() for _ in range(3)]
    sched = scheduler(processes)
    assert [given(sched, p) for p in processes] == ["heavy_a.py", "heavy_b.py", "light_a.py"]
    return sched, processes


def test_at_the_start_as_many_processes_get_a_heavy_file_as_there_are_slots() -> None:
    started()


def test_a_process_ending_a_heavy_file_is_given_the_next_heavy_one() -> None:
    sched, (one, _, three) = started()
    finish(sched, one, "heavy_a.py", left=2)  # asks with two tests to go: takes over its slot
    assert given(sched, one) == "heavy_c.py"
    finish(sched, three, "light_a.py", left=1)  # both slots held by the other two
    assert given(sched, three) == "light_b.py"


def test_a_process_holding_no_slot_gets_a_light_file_though_heavy_ones_wait() -> None:
    sched, (_, _, three) = started()
    finish(sched, three, "light_a.py")
    assert given(sched, three) == "light_b.py"
    assert list(sched.workqueue) == ["heavy_c.py"]


def test_a_slot_freed_goes_to_the_next_process_that_asks() -> None:
    sched, (one, two, three) = started()
    finish(sched, one, "heavy_a.py")
    assert given(sched, one) == "heavy_c.py"
    finish(sched, one, "heavy_c.py")
    assert given(sched, one) == "light_b.py"  # no heavy file left
    finish(sched, two, "heavy_b.py")
    sched.workqueue["heavy_d.py"] = {"heavy_d.py::t0": False}
    for p in (one, two, three):
        sched.registered_collections[p] = [*sched.registered_collections[p], "heavy_d.py::t0"]
    assert given(sched, three) == "heavy_d.py"  # only a light file and a finished one are out


def test_with_no_light_file_left_a_heavy_one_is_given_and_waits_for_its_slot() -> None:
    sched, (_, _, three) = started()
    finish(sched, three, "light_a.py")
    assert given(sched, three) == "light_b.py"
    finish(sched, three, "light_b.py")
    assert given(sched, three) == "heavy_c.py"  # both slots held: its lock waits


def test_the_chosen_files_tests_are_sent_to_the_process_that_asked() -> None:
    one = FakeProcess()
    sched = scheduler([one])
    given(sched, one)
    assert one.sent == [[0, 1, 2]]
