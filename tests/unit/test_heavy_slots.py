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


FILES = ("heavy_a.py", "light_a.py", "heavy_b.py", "heavy_c.py", "light_b.py", "light_c.py")


def scheduler(processes: list[FakeProcess]) -> HeavySlotScheduling:
    sched = HeavySlotScheduling.__new__(HeavySlotScheduling)  # past xdist's config parsing
    sched.workqueue = OrderedDict((f, {f"{f}::t{i}": False for i in range(3)}) for f in FILES)
    collection = [test for tests in sched.workqueue.values() for test in tests]
    sched.assigned_work = {p: {} for p in processes}
    sched.registered_collections = {p: collection for p in processes}
    sched._is_heavy = lambda scope: scope.startswith("heavy")
    sched._slots = 2
    sched.log = lambda *args: None
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
    assert list(sched.workqueue) == ["heavy_c.py", "light_c.py"]


def test_a_finished_heavy_file_frees_its_slot_for_the_next_process_that_asks() -> None:
    sched, (one, two, three) = started()
    finish(sched, three, "light_a.py", left=1)
    assert given(sched, three) == "light_b.py"  # both slots held
    finish(sched, two, "heavy_b.py")  # two finished, and has not asked yet
    finish(sched, three, "light_a.py")
    finish(sched, three, "light_b.py", left=1)
    assert given(sched, three) == "heavy_c.py"  # two's slot is free: three takes it
    finish(sched, one, "heavy_a.py", left=1)
    assert given(sched, one) == "light_c.py"


def test_the_files_of_a_process_that_died_go_back_in_line_unless_finished() -> None:
    sched, (one, _, three) = started()
    finish(sched, one, "heavy_a.py", left=2)
    assert given(sched, one) == "heavy_c.py"
    finish(sched, one, "heavy_a.py")
    finish(sched, one, "heavy_c.py", left=1)
    assert sched.remove_node(one) == "heavy_c.py::t2"  # the test it died in
    assert "heavy_c.py" in sched.workqueue
    assert "heavy_a.py" not in sched.workqueue  # finished: never sent again (nothing to run)
    assert given(sched, three) == "heavy_c.py"  # one's slot is free
    assert three.sent[-1] == [11]  # only its test left to run


def test_with_no_light_file_left_a_heavy_one_is_given_and_waits_for_its_slot() -> None:
    sched, (_, _, three) = started()
    finish(sched, three, "light_a.py")
    assert given(sched, three) == "light_b.py"
    finish(sched, three, "light_b.py")
    assert given(sched, three) == "light_c.py"
    finish(sched, three, "light_c.py")
    assert given(sched, three) == "heavy_c.py"  # both slots held: its lock waits


def test_the_chosen_files_tests_are_sent_to_the_process_that_asked() -> None:
    one = FakeProcess()
    sched = scheduler([one])
    given(sched, one)
    assert one.sent == [[0, 1, 2]]
