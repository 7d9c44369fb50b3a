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


def test_frames_made_from_several_writer_threads_are_counted_once_each() -> None:
    calls: list[int] = []
    garbage = JvmGarbage(max_bytes=10**12, max_frames=10, collect=lambda: calls.append(1))

    def make() -> None:
        for _ in range(250):
            garbage.before_frame(1)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 1,000 frames, a collection before every tenth but the first: 99.
    assert len(calls) == garbage.collections == 99
