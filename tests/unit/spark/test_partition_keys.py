"""Partition keys into Arrow: a key Arrow cannot encode (a lone surrogate) no longer fails the
page it is in, on the driver, on the executors and in readStream (all build their rows here);
nor does a read failure whose message quotes one (its range's end crosses back as JSON)."""

from __future__ import annotations

import pytest

from kclpy_spark.processor import Record
from kclpy_spark.spark.pieces import records_to_chunk
from kclpy_spark.spark.range_tasks import one_line
from kclpy_spark.spark.ranges import RangeEnd


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        (["plain", "\u00e9t\u00e9", "\U0001f600"], ["plain", "\u00e9t\u00e9", "\U0001f600"]),
        (["k\ud800x", "ok"], ["k\ufffdx", "ok"]),
        (["\udfff\ud83d", "\U0001f600\udc00"], ["\ufffd\ufffd", "\U0001f600\ufffd"]),
    ],
)
def test_keys_arrow_cannot_encode_are_written_with_replacement_characters(
    keys: list[str], want: list[str]
) -> None:
    records = [Record(bytes([i]), key, str(i + 1)) for i, key in enumerate(keys)]
    chunk = records_to_chunk(records, "s", "shardId-000000000000")
    assert chunk.batch.column("partition_key").to_pylist() == want
    assert chunk.batch.column("data").to_pylist() == [bytes([i]) for i in range(len(keys))]
    assert (chunk.first.sequence_number, chunk.last.sequence_number) == ("1", str(len(keys)))


def test_a_failure_quoting_such_a_key_still_crosses_back_as_its_ranges_end() -> None:
    line = one_line(ValueError("no record for key k\udc80\nsecond line"))
    assert line == "ValueError: no record for key k\\udc80"
    end = RangeEnd("shardId-000000000000", None, None, 0, 0, error=line)
    assert RangeEnd.from_json(end.to_json()) == end
