"""#44: the kinesis-kcl source's offsets and pins, pure: how one batch follows another (starts
from pins, parents first, children of ended shards, LATEST as the query's first moment, the
AvailableNow bound), offsets that survive Spark's journal, and first-pin-wins storage."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError, KclpySparkError
from checkpoint.lease import HashKeyRange
from checkpoint.sequence import AT_TIMESTAMP, ExtendedSequenceNumber, InitialPosition
from kclpy_spark.readstream.offsets import (
    Pin,
    ShardPlan,
    SourceOffset,
    Start,
    first_offset,
    next_offset,
)
from kclpy_spark.readstream.pins import DirectoryPins
from shard_sync.shards import Shard

ESN = ExtendedSequenceNumber
TOP = 2**128 - 1
TH = InitialPosition.trim_horizon()
PARENT = Shard("s0", None, None, HashKeyRange(0, TOP), "100", "200")
OPEN = Shard("s0", None, None, HashKeyRange(0, TOP), "100")
LEFT = Shard("s1", "s0", None, HashKeyRange(0, TOP // 2), "300")
RIGHT = Shard("s2", "s0", None, HashKeyRange(TOP // 2 + 1, TOP), "300")
MERGED = Shard("s3", "s1", "s2", HashKeyRange(0, TOP), "400")
CLOSED = [Shard(s.shard_id, s.parent_shard_id, None, s.hash_key_range, "300", "390")
          for s in (LEFT, RIGHT)]  # fmt: skip


def test_the_first_batch_reads_the_open_shards_from_the_initial_position() -> None:
    start = first_offset("run", 1_000)
    one = next_offset(
        start, {}, [PARENT.__class__("s0", None, None, HashKeyRange(0, TOP), "100")], TH
    )
    assert one.batch == 0 and one.read_shards() == ["s0"]
    assert one.shards["s0"].start == Start()  # TRIM_HORIZON


@pytest.mark.parametrize(
    ("initial", "start"),
    [
        (InitialPosition.latest(), Start(AT_TIMESTAMP, 1_000)),  # the query's first moment
        (InitialPosition.at_timestamp(datetime(2026, 1, 1, tzinfo=UTC)),
         Start(AT_TIMESTAMP, 1_767_225_600_000)),
        (TH, Start()),
    ],
)  # fmt: skip
def test_latest_is_the_moment_the_query_first_started(
    initial: InitialPosition, start: Start
) -> None:
    open_shard = Shard("s0", None, None, HashKeyRange(0, TOP), "100")
    assert (
        next_offset(first_offset("run", 1_000), {}, [open_shard], initial).shards["s0"].start
        == start
    )


def _at(batch: int, **plans: ShardPlan) -> SourceOffset:
    return SourceOffset("run", batch, 1_000, None, plans)


def test_a_shard_moves_to_its_pins_last_record_and_keeps_the_next_iterator() -> None:
    prev = _at(3, s0=ShardPlan(Start(ESN("150")), True, (), (0, TOP)))
    pin = Pin(ESN("160"), ESN("190", 2), 7, next_iterator="it-1")
    following = next_offset(prev, {"s0": pin}, [PARENT], TH)
    assert following.batch == 4
    assert following.shards["s0"].start == Start(ESN("190", 2))
    assert following.shards["s0"].iterator == "it-1"
    empty = next_offset(prev, {"s0": Pin(None, None, 0, next_iterator="it-2")}, [PARENT], TH)
    assert empty.shards["s0"].start == Start(ESN("150"))  # nothing read: where it was


def test_children_come_after_their_parents_end_and_a_merge_after_both() -> None:
    prev = _at(3, s0=ShardPlan(Start(ESN("150")), True, (), (0, TOP)))
    ended = next_offset(prev, {"s0": Pin(None, None, 0, ended=True)}, [PARENT, LEFT, RIGHT], TH)
    assert ended.ended == {"s0"} and "s0" not in ended.shards
    assert ended.read_shards() == ["s1", "s2"]
    assert ended.shards["s1"].start == Start() and ended.shards["s1"].parents == ("s0",)
    listed = [PARENT, *CLOSED, MERGED]
    one_side = next_offset(ended, {"s1": Pin(None, None, 0, ended=True),
                                   "s2": Pin(ESN("350"), ESN("350"), 1)}, listed, TH)  # fmt: skip
    assert one_side.read_shards() == ["s2"], "the merge waits for its other parent"
    assert one_side.shards["s3"].parents == ("s1", "s2") and not one_side.shards["s3"].read
    both = next_offset(one_side, {"s2": Pin(None, None, 0, ended=True)}, listed, TH)
    assert both.read_shards() == ["s3"] and both.ended == {"s0", "s1", "s2"}


def test_a_shard_gone_from_the_stream_ends_and_its_children_are_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query down longer than the retention across a split: the parent is no longer listed.
    It was read every batch (GetShardIterator: not found, the query failing for good) and its
    children waited for it for ever."""
    prev = _at(7, s0=ShardPlan(Start(ESN("150")), True, (), (0, TOP)))
    following = next_offset(prev, {"s0": Pin(ESN("160"), ESN("170"), 2)}, [LEFT, RIGHT], TH)
    assert following.read_shards() == ["s1", "s2"] and "s0" not in following.shards
    assert following.shards["s1"].start == Start()  # from the child's start
    assert "s0 are no longer in the stream" in caplog.text


def test_a_listing_that_raced_a_reshard_adds_nothing_this_time() -> None:
    prev = _at(3, s0=ShardPlan(Start(ESN("150")), True, (), (0, TOP)))
    raced = [Shard("s0", None, None, HashKeyRange(0, TOP), "100"), LEFT, RIGHT]  # s0 still open
    following = next_offset(prev, {"s0": Pin(None, None, 0)}, raced, TH)
    assert following.read_shards() == ["s0"] and set(following.shards) == {"s0"}


def test_a_read_shard_without_a_pin_is_an_error() -> None:
    prev = _at(3, s0=ShardPlan(Start(ESN("150")), True))
    with pytest.raises(LookupError, match="no pin for s0"):
        next_offset(prev, {}, [PARENT], TH)


def test_available_now_stops_once_every_shard_is_done_under_the_same_bound() -> None:
    prev = SourceOffset("run", 3, 1_000, 5_000, {"s0": ShardPlan(Start(ESN("150")), True)})
    caught_up = {"s0": Pin(ESN("160"), ESN("170"), 2, caught_up=True)}
    assert next_offset(prev, caught_up, [OPEN], TH, until_ms=5_000) is prev  # nothing left
    again = next_offset(prev, caught_up, [OPEN], TH, until_ms=9_000)  # a new run: read again
    assert again.read_shards() == ["s0"] and again.until_ms == 9_000
    behind = next_offset(prev, {"s0": Pin(ESN("160"), ESN("170"), 2)}, [OPEN], TH, 5_000)
    assert behind.read_shards() == ["s0"]


def test_a_closed_shard_read_dry_at_its_tip_has_ended() -> None:
    """Kinesis shows a shard's end only to a read past its last record; a shard the listing
    showed closed before a read that then finds nothing more at the tip has ended too."""
    prev = SourceOffset("run", 3, 1_000, 5_000, {"s0": ShardPlan(Start(ESN("150")), True)})
    listed = [PARENT, LEFT, RIGHT]
    seen_closed = next_offset(prev, {"s0": Pin(None, None, 0, caught_up=True)}, listed, TH, 5_000)
    assert seen_closed.read_shards() == ["s0"] and seen_closed.shards["s0"].closed
    dry = next_offset(seen_closed, {"s0": Pin(None, None, 0, caught_up=True)}, listed, TH, 5_000)
    assert dry.ended == {"s0"} and dry.read_shards() == ["s1", "s2"]
    more = next_offset(seen_closed, {"s0": Pin(ESN("160"), ESN("170"), 2, caught_up=True)},
                       listed, TH, 5_000)  # fmt: skip
    assert more.read_shards() == ["s0"], "records came: read again until it reads dry"
    past_bound = next_offset(seen_closed, {"s0": Pin(None, None, 0, caught_up=True, bounded=True)},
                             listed, TH, 5_000)  # fmt: skip
    assert past_bound is seen_closed, "what is left came after the bound: the run is over"


def test_an_offset_survives_sparks_journal() -> None:
    offset = SourceOffset(
        "run", 7, 1_000, 5_000,
        {"s1": ShardPlan(Start(ESN("12345", 3)), True, ("s0",), (0, TOP // 2), False, "it"),
         "s2": ShardPlan(Start(AT_TIMESTAMP, 999), False, ("s0",), None, True)},
        frozenset({"s0"}),
    )  # fmt: skip
    text = json.dumps(offset.to_json())
    assert SourceOffset.from_json(json.loads(text)) == offset
    with pytest.raises(ValueError, match="another version"):
        SourceOffset.from_json({**offset.to_json(), "v": 99})


def test_the_first_pin_of_a_range_wins_and_old_batches_go(tmp_path: Path) -> None:
    pins = DirectoryPins(tmp_path)
    mine, theirs = Pin(ESN("1"), ESN("5"), 5), Pin(ESN("1"), ESN("9"), 9)
    results: list[Pin] = []
    threads = [threading.Thread(target=lambda p=p: results.append(pins.put_first("r", 3, "s0", p)))
               for p in (mine, theirs) * 4]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and pins.get("r", 3, "s0") == results[0]
    assert not list(tmp_path.rglob("*.tmp"))
    pins.put_first("r", -1, "s0", mine)  # a leased query's first plan (kept for good before)
    pins.put_first("r", 1, "s0", mine)
    pins.put_first("r", 2, "s0", mine)
    assert pins.forget_before("r", 2) == 2
    assert pins.get("r", 1, "s0") is None and pins.get("r", 2, "s0") == mine
    assert pins.get("other", 3, "s0") is None


def test_pins_that_cannot_be_deleted_are_left_for_the_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a missing folder was allowed for: a file a late task wrote into an old batch's
    folder (ENOTEMPTY) or an NFS ``.nfs`` file (EBUSY) failed ``latestOffset``, and the query."""
    import errno
    import shutil

    pins = DirectoryPins(tmp_path)
    pins.put_first("r", 1, "s0", Pin(ESN("1"), ESN("5"), 5))

    def busy(path: object) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    monkeypatch.setattr(shutil, "rmtree", busy)
    assert pins.forget_before("r", 2) == 0
    assert "could not delete the pins" in caplog.text
    monkeypatch.undo()
    assert pins.forget_before("r", 2) == 1  # the next batch's cleanup


def _reader(tmp_path: Path) -> object:
    from kclpy_spark.readstream.data_source import KinesisKclStreamReader
    from kclpy_spark.readstream.options import SourceOptions

    options = SourceOptions.parse({"streamName": "s", "endpointUrl": "http://127.0.0.1:1",
                                   "pinLocation": str(tmp_path / "pins")})  # fmt: skip
    return KinesisKclStreamReader(options)


class CountingLister:
    def __init__(self) -> None:
        self.calls = 0

    def list_shards(self, shard_filter: object = None) -> list[Shard]:
        self.calls += 1
        return [OPEN]


def test_a_task_that_never_ran_leaves_its_shard_where_it_was(tmp_path: Path) -> None:
    """A foreachBatch that reads only some partitions: the others' shards get an empty pin and
    are read again from the same start; pins missing from a batch never planned here are one
    line (pinLocation changed, or not shared)."""
    from checkpoint.base.errors import KclpySparkError

    reader: Any = _reader(tmp_path)
    pins = reader._pins()
    offset = SourceOffset("run", 3, 1_000, None, {
        "s0": ShardPlan(Start(ESN("150")), True, iterator="it-0"),
        "s1": ShardPlan(Start(ESN("250")), True, iterator="it-1")})  # fmt: skip
    with pytest.raises(KclpySparkError, match="pins of batch 3 are not in"):
        reader._pins_of(offset, pins)
    pins.mark_planned("run", 3)
    pins.put_first("run", 3, "s0", Pin(ESN("160"), ESN("170"), 2))
    found = reader._pins_of(offset, pins)
    assert found["s0"].rows == 2
    assert found["s1"] == Pin(None, None, 0, next_iterator="it-1")
    assert pins.get("run", 3, "s1") == found["s1"]  # a late task of batch 3 reads nothing


def test_after_a_dry_batch_the_next_waits_a_second_without_listing(tmp_path: Path) -> None:
    reader: Any = _reader(tmp_path)
    reader._lister = lister = CountingLister()
    pins = reader._pins()
    offset = SourceOffset("run", 3, 1_000, None, {"s0": ShardPlan(Start(ESN("150")), True)})
    pins.mark_planned("run", 3)
    pins.put_first("run", 3, "s0", Pin(None, None, 0, caught_up=True))
    start = offset.to_json()
    first = reader.latestOffset(start, None)  # the first look after a dry batch: planned
    assert first["batch"] == 4 and lister.calls == 1
    assert reader.latestOffset(start, None) == start and lister.calls == 1  # within the second
    reader._planned_at -= 1.0
    assert reader.latestOffset(start, None)["batch"] == 4 and lister.calls == 2


def test_a_folder_that_cannot_hold_pins_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot hold pins"):
        DirectoryPins(tmp_path / "file" / "pins").check()
    DirectoryPins(tmp_path / "ok").check()
    assert list((tmp_path / "ok").iterdir()) == []


def test_a_batch_puts_shards_per_task_ranges_in_each_partition(tmp_path: Path) -> None:
    """Each shard's reads are paced by its own limits: a task reads several side by side."""
    reader: Any = _reader(tmp_path)
    plans = {f"s{i}": ShardPlan(Start(ESN(str(100 + i))), i != 5, iterator=f"it-{i}")
             for i in range(7)}  # fmt: skip
    end = SourceOffset("run", 4, 1_000, None, plans).to_json()
    reader._planned_here = ("run", 4)  # planned by this process: no listing
    parts = reader.partitions(end, end)
    groups = [[json.loads(r)["shard_id"] for r in json.loads(p.value)["ranges"]] for p in parts]
    assert groups == [["s0", "s1", "s2", "s3"], ["s4", "s6"]]  # s5 not read in this batch
    first = json.loads(json.loads(parts[0].value)["ranges"][1])
    assert (first["after"], first["iterator"]) == (["101", 0], "it-1")
    assert reader._pins().planned("run", 4)


def test_a_replay_without_its_runs_pins_is_one_line_not_other_records(tmp_path: Path) -> None:
    """Restarted with another pin folder (a relative pinLocation under a new working folder, a
    new pod): the replayed batch was planned and read afresh, other records than the batch it
    replaced, and a sink keeping the first write of a batch id skipped or doubled them."""
    reader: Any = _reader(tmp_path)
    reader._lister = CountingLister()
    plans = {"s0": ShardPlan(Start(ESN("150")), True)}
    end = SourceOffset("run", 4, 1_000, None, plans).to_json()
    with pytest.raises(KclpySparkError, match="batch 4 of run run is replayed, but the pins"):
        reader.partitions(end, end)
    first = SourceOffset("run", 0, 1_000, None, plans).to_json()
    assert reader.partitions(first, first)  # a run's first batch has no predecessor to ask


def test_a_replayed_batch_leaves_out_a_shard_that_aged_out_since(tmp_path: Path) -> None:
    """A query down past the retention across a reshard: Spark replays the batch it planned
    before, with a shard the stream no longer holds, whose read failed every task, and the
    query with it, at every restart."""
    reader: Any = _reader(tmp_path)
    reader._lister = lister = CountingLister()  # lists s0 only
    plans = {sid: ShardPlan(Start(ESN("150")), True) for sid in ("s0", "gone")}
    end = SourceOffset("run", 4, 1_000, None, plans).to_json()
    reader._pins().mark_planned("run", 3)  # the run's pin folder, as the query left it
    parts = reader.partitions(end, end)  # not planned here: a replay
    read = [json.loads(r)["shard_id"] for p in parts for r in json.loads(p.value)["ranges"]]
    assert read == ["s0"] and lister.calls == 1
    # The next plan finds the shard gone (an empty pin: it never ran) and reads on without it.
    found = reader._pins_of(SourceOffset.from_json(end), reader._pins())
    assert found["gone"].rows == 0


def test_the_region_is_resolved_once_at_load_and_none_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kclpy_spark.readstream.options import SourceOptions

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="no AWS region"):
        SourceOptions.parse({"streamName": "s"})
    arn = "arn:aws:kinesis:ap-south-1:123456789012:stream/orders"
    assert SourceOptions.parse({"streamARN": arn}).region == "ap-south-1"
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert SourceOptions.parse({"streamName": "s"}).region == "eu-west-1"
    assert SourceOptions.parse({"streamName": "s", "region": "us-west-2"}).region == "us-west-2"
    # Taken as given: a botocore error from inside latestOffset, or blamed on leaseStore.
    for extra in ({}, {"leaseStore": "sqlite:/tmp/x.db", "applicationName": "app"}):
        with pytest.raises(ConfigError, match=r"^kinesis-kcl: option region is not an AWS region"):
            SourceOptions.parse({"streamName": "s", "region": "eu west 1", **extra})


@pytest.mark.parametrize(
    ("rows", "size", "batch", "expected"),
    [
        (None, None, 0, {"a": (None, None), "b": (None, None), "c": (None, None)}),
        (7, None, 0, {"a": (3, None), "b": (2, None), "c": (2, None)}),
        (7, None, 1, {"b": (3, None), "c": (2, None), "a": (2, None)}),  # the remainder turns
        (2, None, 0, {"a": (1, None), "b": (1, None)}),  # c waits for a later batch
        (2, None, 2, {"c": (1, None), "a": (1, None)}),
        (None, 3_000, 0, {"a": (None, 1_000), "b": (None, 1_000), "c": (None, 1_000)}),
    ],
)
def test_a_per_trigger_limit_is_shared_over_the_shards_read(
    rows: int | None, size: int | None, batch: int, expected: dict[str, Any]
) -> None:
    from kclpy_spark.readstream.offsets import within_limit

    plans = {sid: ShardPlan(Start(), True) for sid in "abc"}
    limited = within_limit(SourceOffset("run", batch, 0, shards=plans), rows, size)
    got = {sid: (p.max_records, p.max_bytes) for sid, p in limited.shards.items() if p.read}
    assert got == expected
    assert SourceOffset.from_json(limited.to_json()) == limited


def test_a_shards_share_of_one_batchs_limit_does_not_carry_into_the_next() -> None:
    from kclpy_spark.readstream.offsets import within_limit

    one = within_limit(next_offset(first_offset("run", 1_000), {}, [OPEN], TH), 5, None)
    assert one.shards["s0"].max_records == 5
    two = next_offset(one, {"s0": Pin(ESN("1"), ESN("5"), 5)}, [OPEN], TH)
    assert two.shards["s0"].max_records is None


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ({"maxRecordsPerTrigger": "10", "maxBytesPerTrigger": "10"}, ["not both"]),
        ({"maxRecordsPerTrigger": "0"}, ["maxRecordsPerTrigger", "1.."]),
        ({"leaseStore": "postgres"}, ["leaseStore", "'postgres'", "dynamodb"]),
        ({"leaseStore": "memory"}, ["leaseStore", "memory", "lost with it"]),
        # "sqlite:" alone said the worker's form, which offers memory, refused just above.
        ({"leaseStore": "sqlite:"}, ["leaseStore", "sqlite:PATH", "'sqlite:'"]),
        # Two queries on different streams shared the default lease table (shard ids repeat).
        ({"leaseStore": "dynamodb"}, ["leaseStore needs option applicationName"]),
        ({"failoverTime": "soon"}, ["failoverTime", "whole number"]),
    ],
)
def test_bad_limit_and_lease_options_are_one_line(given: dict[str, str], words: list[str]) -> None:
    from kclpy_spark.readstream.options import SourceOptions

    with pytest.raises(ConfigError) as caught:
        SourceOptions.parse({"streamName": "s", "region": "us-east-1", **given})
    message = str(caught.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_the_lease_store_kind_is_taken_in_any_case(tmp_path: Path) -> None:
    from kclpy_spark.readstream.options import SourceOptions

    given = {"streamName": "s", "region": "us-east-1", "applicationName": "app"}
    assert SourceOptions.parse({**given, "leaseStore": "DynamoDB"}).lease_store == "dynamodb"
    assert SourceOptions.parse({**given, "leaseStore": "NONE"}).lease_store is None
    path = tmp_path / "Leases.db"
    assert SourceOptions.parse({**given, "leaseStore": f"SQLite:{path}"}).lease_store == (
        f"sqlite:{path}"
    )


def test_lease_options_make_a_worker_configuration(tmp_path: Path) -> None:
    from kclpy_spark.readstream.options import SourceOptions

    options = SourceOptions.parse({"streamName": "s", "region": "us-east-1",
                                   "applicationName": "app", "failoverTime": "4",
                                   "leaseStore": f"sqlite:{tmp_path / 'l.db'}"})  # fmt: skip
    first, second = options.worker_config(), options.worker_config()
    assert first.application_name == "app" and first.failover_time == 4.0
    assert first.worker_id.startswith("query:") and first.worker_id != second.worker_id
    assert SourceOptions.parse({"streamName": "s", "region": "us-east-1"}).lease_store is None


def test_a_new_querys_latest_moment_is_a_margin_before_the_drivers_clock(tmp_path: Path) -> None:
    """Its LATEST was the driver's clock as it was: a driver ahead of the service skipped the
    records that arrived in the difference (the daemon starts a margin earlier)."""
    from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN

    reader: Any = _reader(tmp_path)
    before = time.time()
    started = SourceOffset.from_json(reader.initialOffset()).started_ms / 1000
    assert before - LATEST_RESTART_MARGIN - 0.01 <= started <= time.time() - LATEST_RESTART_MARGIN
