"""Worker scope (the default for parquet: and delta:): what a lease's pending checkpoint names
of its batch, and so how big each lease-table write of a batch is (memory table, fake sinks)."""

from __future__ import annotations

import pytest

from checkpoint.base.errors import ConfigError
from checkpoint.lease import Lease
from checkpoint.sequence import TRIM_HORIZON
from kclpy_spark.processor import Record
from kclpy_spark.spark.micro_batcher import BatcherSettings
from kclpy_spark.spark.pieces import records_to_chunk
from tests.unit.spark.test_micro_batcher import Env, FakeSink, esn

BIG = 49590338271490256608559692538361571095921575989136588898


class PerPieceSink(FakeSink):
    """A sink that writes a piece at most once whatever its batch (as parquet: and delta:)."""

    idempotent_per_piece = True


def largest_pending_state(sink: FakeSink, leases: int, max_leases: int = 250) -> int:
    env = Env(BatcherSettings(max_records=1_000_000, max_wait=1.0, scope="worker",
                              max_attempts=1, max_leases=max_leases), sink=sink)  # fmt: skip
    shards = [f"shardId-{i:012d}" for i in range(leases)]
    for n, shard in enumerate(shards):
        env.table.create_lease_if_absent(Lease(shard, TRIM_HORIZON))
        env.take(shard)
        records = [Record(b"x", "k", str(BIG + n))]
        env.cps[shard].set_largest_permitted(esn(BIG + n))
        env.batcher.add(env.lanes[shard], records_to_chunk(records, "stream", shard))
    sink.fail = lambda batch: True  # the pending checkpoints stay, to be measured
    env.clock.advance(1.0)
    env.batcher.step()
    batches = -(-leases // max_leases) if not isinstance(sink, PerPieceSink) else 1
    assert len(sink.attempts) == batches and len(sink.attempts_pieces) == leases
    return max(len(env.lease(s).pending_checkpoint_state or b"") for s in shards)


def test_a_per_piece_sink_s_pending_state_does_not_grow_with_the_batch() -> None:
    """Each lease named every piece of its batch: 14 KB a lease at 100 leases, 144 KB at 1,000,
    past DynamoDB's 400 KB item limit near 2,800 (a lease that cannot take its pending
    checkpoint parks), and the batch's writes grew with the square of its leases."""
    small = largest_pending_state(PerPieceSink(), 5)
    assert largest_pending_state(PerPieceSink(), 300) == small < 1024


@pytest.mark.parametrize("leases", [5, 50])
def test_a_function_sink_s_pending_state_still_names_the_whole_batch(leases: int) -> None:
    """A function sink keyed by batch_id needs a re-formed piece back in its old batch: every
    lease names the batch's pieces (README: keep such batches to a few hundred leases)."""
    per_lease = largest_pending_state(FakeSink(), leases) / leases
    assert 100 < per_lease < 400  # about a piece key a lease of the batch


def test_a_function_sink_s_batch_holds_at_most_max_leases_leases() -> None:
    """Naming the whole batch, a lease's pending state grew with its batch's leases (past
    DynamoDB's 400 KB an item at ~1,400 with two batches in flight): a function's worker-scope
    batches hold ``max_leases`` leases at most, a per-piece sink's any number."""
    capped = largest_pending_state(FakeSink(), 30, max_leases=10)  # three batches of ten
    assert capped == largest_pending_state(FakeSink(), 10, max_leases=10)
    assert largest_pending_state(PerPieceSink(), 30, max_leases=10) < 1024  # one batch of 30


def test_a_function_sink_refuses_more_pieces_in_flight_than_a_lease_table_item_holds() -> None:
    settings = BatcherSettings(scope="worker", max_leases=300, batches_in_flight=2)
    with pytest.raises(ConfigError, match="'max_leases' x 'batches_in_flight' must be at most"):
        Env(settings)
    Env(settings, sink=PerPieceSink())  # names its own piece only
