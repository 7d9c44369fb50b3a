"""The readStream source's pins on the executors' side (no Spark, no Kinesis): a task that does
not see the driver's folder fails at once, a pinned read gets the time a pin needs, and two
reads of the same records are told apart from two different reads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import KclpySparkError
from checkpoint.lease import HashKeyRange
from checkpoint.sequence import ExtendedSequenceNumber as ESN
from kclpy_spark.readstream.data_source import KinesisKclStreamReader, _pinned
from kclpy_spark.readstream.offsets import Pin
from kclpy_spark.readstream.options import SourceOptions
from kclpy_spark.spark.ranges import PINNED_TIME_FACTOR, RangeEnd, ReadRange
from shard_sync.shards import Shard


class OneShard:
    def list_shards(self, shard_filter: object = None) -> list[Shard]:
        return [Shard("s0", None, None, HashKeyRange(0, 2**128 - 1), "100")]


def reader(pins: Path) -> Any:
    options = SourceOptions.parse({"streamName": "s", "endpointUrl": "http://127.0.0.1:1",
                                   "initialPosition": "TRIM_HORIZON",
                                   "pinLocation": str(pins)})  # fmt: skip
    source: Any = KinesisKclStreamReader(options)
    source._lister = OneShard()
    return source


def test_a_task_that_does_not_see_the_drivers_pin_folder_fails_naming_it(tmp_path: Path) -> None:
    """On a cluster whose executors have a folder of the same path but not the driver's, each
    task pinned on its own disk: the driver found no pin, read the same range again in the next
    batch, and so on for ever, without a word."""
    driver = reader(tmp_path / "pins")
    start = driver.initialOffset()
    end = driver.latestOffset(start, None)
    (partition,) = driver.partitions(start, end)  # the driver marks the batch in its folder
    elsewhere = reader(tmp_path / "pins-on-another-host")
    elsewhere._reads = lambda ranges: pytest.fail("read Kinesis before checking the pins")
    with pytest.raises(KclpySparkError, match="not a folder the driver and the executors share"):
        list(elsewhere.read(partition))


def test_a_pinned_read_gets_the_time_a_pin_needs() -> None:
    rng = ReadRange("s0", "s", {"StreamName": "s"}, "s0", ESN("TRIM_HORIZON"), max_seconds=30.0)
    again = _pinned(rng, Pin(ESN("1"), ESN("9"), 9))
    assert again.pinned is not None and again.max_seconds == 30.0 * PINNED_TIME_FACTOR


@pytest.mark.parametrize(
    ("other", "same"),
    [
        (Pin(ESN("1"), ESN("9"), 9, next_iterator="another"), True),
        (Pin(ESN("1"), ESN("9"), 9, caught_up=True), True),
        (Pin(ESN("1"), ESN("8"), 8), False),
        (Pin(None, None, 0), False),
    ],
)
def test_two_pins_name_the_same_records_whatever_their_iterators(other: Pin, same: bool) -> None:
    """A second attempt that lost the race to pin read again only when its records differ
    (the next iterator always differs between two reads)."""
    assert Pin(ESN("1"), ESN("9"), 9, next_iterator="one").same_records(other) is same


def _read_once(source: Any, partition: Any, next_call_at: float) -> None:
    """The task of ``partition``: one page of 9 records that asks the shard be left alone until
    ``next_call_at`` (a 2 MiB page: a second of the shard's read limit)."""

    def reads(ranges: list[ReadRange]) -> list[Any]:
        end = RangeEnd("s0", ESN("1"), ESN("9"), 9, 2 << 20, millis_behind_latest=5000,
                       next_iterator="it", calls=1, next_call_at=next_call_at)  # fmt: skip
        return [(rng, ([], end)) for rng in ranges]

    source._reads = reads
    list(source.read(partition))


def test_a_shard_read_in_one_batch_waits_its_pacing_in_the_next(tmp_path: Path) -> None:
    """A batch planned right after one that read a big page called the shard at once: Kinesis
    throttled it and the read gave way, an empty batch for that shard. The next batch's range
    now waits what is left of the pause the last read asked (a replay waits nothing)."""
    driver = reader(tmp_path / "pins")
    start = driver.initialOffset()
    end = driver.latestOffset(start, None)
    (first,) = driver.partitions(start, end)
    assert ReadRange.from_json(json.loads(first.value)["ranges"][0]).delay == 0.0
    _read_once(driver, first, time.time() + 10.0)  # the longest pause; this thread may lag
    following = driver.latestOffset(end, None)
    (second,) = driver.partitions(end, following)
    delay = ReadRange.from_json(json.loads(second.value)["ranges"][0]).delay
    assert 5.0 < delay <= 10.0
    replayed = reader(tmp_path / "pins")  # a restarted driver, the same batch again
    (again,) = replayed.partitions(end, following)
    assert ReadRange.from_json(json.loads(again.value)["ranges"][0]).delay == 0.0


@pytest.mark.parametrize(("ahead", "left"), [(0.0, 0.6), (3600.0, 1.0), (-3600.0, 0.0)])
def test_what_is_left_of_a_pause_is_never_more_than_the_pause(ahead: float, left: float) -> None:
    """The executor's clock ahead of the driver's by an hour: an absolute "call again at" time
    made every batch wait the longest pause; the pin keeps the pause itself and when the read
    ended, so another clock can only shorten it (to nothing, for a clock far behind)."""
    pin = Pin(ESN("1"), ESN("9"), 9, pause=1.0, ended_at=1000.0 + ahead)
    assert pin.pause_left(1000.4) == pytest.approx(left)
    assert Pin.from_json(pin.to_json()) == pin
