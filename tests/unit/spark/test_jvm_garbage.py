"""When the sink collects Python's cycles (the py4j objects that pin dead batches in the JVM)."""

from __future__ import annotations

import threading

import pytest

from kclpy_spark.spark.jvm_garbage import JvmGarbage

MB = 1024 * 1024


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "max_frames", "collected_before"),
    [
        # (Arrow bytes of each frame made, limits, indexes of the frames a collection preceded)
        ([10 * MB] * 5, 64 * MB, 100, []),
        ([30 * MB] * 5, 64 * MB, 100, [2, 4]),  # a third frame would take the dead ones past 64
        ([64 * MB] * 3, 64 * MB, 100, [1, 2]),  # one batch as large as the limit: every time
        ([200 * MB] * 2, 64 * MB, 100, [1]),  # one larger than the limit still goes first
        ([1] * 7, 64 * MB, 3, [3, 6]),  # small batches: by count
        ([0] * 4, 64 * MB, 1, [1, 2, 3]),
    ],
)
def test_a_collection_comes_before_the_frame_that_would_pass_a_limit(
    sizes: list[int], max_bytes: int, max_frames: int, collected_before: list[int]
) -> None:
    at: list[int] = []
    current = [0]
    garbage = JvmGarbage(
        max_bytes=max_bytes, max_frames=max_frames, collect=lambda: at.append(current[0])
    )
    for i, size in enumerate(sizes):
        current[0] = i
        garbage.before_frame(size)
    assert at == collected_before
    assert garbage.collections == len(collected_before)


def test_a_collection_under_way_holds_no_other_writer_back() -> None:
    """The collection runs outside the lock: while one writer collects (held here), another
    makes its DataFrames, and they count towards the next collection."""
    collecting, release = threading.Event(), threading.Event()

    def slow_collect() -> None:
        collecting.set()
        assert release.wait(10)

    garbage = JvmGarbage(max_bytes=10**12, max_frames=2, collect=slow_collect)
    garbage.before_frame(1)
    garbage.before_frame(1)
    first = threading.Thread(target=garbage.before_frame, args=(1,))  # collects, and waits
    first.start()
    assert collecting.wait(10)
    done = threading.Event()
    second = threading.Thread(target=lambda: (garbage.before_frame(1), done.set()))
    second.start()
    assert done.wait(10), "a writer waited for another writer's collection"
    release.set()
    first.join(10)
    second.join(10)
    assert garbage.collections == 1
