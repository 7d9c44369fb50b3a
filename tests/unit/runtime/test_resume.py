"""ReadStart: where each read of a tenure starts (pure)."""

from __future__ import annotations

import pytest

from checkpoint.sequence import (
    AT_TIMESTAMP,
    LATEST,
    TRIM_HORIZON,
    ExtendedSequenceNumber,
    InitialPosition,
)
from kclpy_spark.retrieval.positions import LATEST_RESTART_MARGIN
from kclpy_spark.runtime.resume import ReadStart

LATEST_POS = InitialPosition.latest()


@pytest.mark.parametrize("checkpoint", [TRIM_HORIZON, ExtendedSequenceNumber("42"), AT_TIMESTAMP])
def test_positions_that_do_not_move_are_never_pinned(checkpoint: ExtendedSequenceNumber) -> None:
    start = ReadStart("s", checkpoint, 1_700_000_000.0, LATEST_POS)
    assert start.begin(100.0) is None and start.begin(200.0) is None
    assert start.checkpoint == checkpoint


def test_latest_is_pinned_by_the_first_read_and_later_reads_start_there() -> None:
    start = ReadStart("s", LATEST, None, LATEST_POS)
    assert start.begin(1000.0) == 1000.0 - LATEST_RESTART_MARGIN  # to store in the lease
    assert start.checkpoint == LATEST  # the first read itself asks for LATEST
    assert start.begin(1500.0) is None
    assert start.checkpoint == AT_TIMESTAMP
    assert start.position == InitialPosition.at_timestamp(1000.0 - LATEST_RESTART_MARGIN)


def test_a_delivery_or_a_reset_moves_the_start() -> None:
    start = ReadStart("s", LATEST, None, LATEST_POS)
    start.begin(1000.0)
    start.delivered(ExtendedSequenceNumber("77"))
    assert start.begin(2000.0) is None and start.checkpoint == ExtendedSequenceNumber("77")
    start.restarted(LATEST)  # the aged-checkpoint policy "latest": a new first read
    assert start.begin(3000.0) == 3000.0 - LATEST_RESTART_MARGIN


@pytest.mark.parametrize(
    ("lease_checkpoint", "lease_start", "rewound_to", "starts_at", "position"),
    [
        (TRIM_HORIZON, None, TRIM_HORIZON, TRIM_HORIZON, LATEST_POS),
        (TRIM_HORIZON, None, ExtendedSequenceNumber("7"), ExtendedSequenceNumber("7"), LATEST_POS),
        # A LATEST lease this tenure pinned: at its pin, never a new LATEST.
        (LATEST, None, LATEST, AT_TIMESTAMP, InitialPosition.at_timestamp(995.0)),
        # Pinned by an earlier tenure (the pin beside its LATEST checkpoint).
        (LATEST, 900.0, LATEST, AT_TIMESTAMP, InitialPosition.at_timestamp(900.0)),
    ],
)  # fmt: skip
def test_a_rewind_reads_again_from_the_checkpoint_or_the_tenures_own_start(
    lease_checkpoint: ExtendedSequenceNumber,
    lease_start: float | None,
    rewound_to: ExtendedSequenceNumber,
    starts_at: ExtendedSequenceNumber,
    position: InitialPosition,
) -> None:
    """A processor that lost what it held (RedeliverFromCheckpoint) gets the records after the
    lease's checkpoint again; with nothing checkpointed, from where the tenure began."""
    start = ReadStart("s", lease_checkpoint, lease_start, LATEST_POS)
    first_pin = (
        1000.0 - LATEST_RESTART_MARGIN
        if (lease_checkpoint, lease_start) == (LATEST, None)
        else None
    )
    assert start.begin(1000.0) == first_pin
    start.delivered(ExtendedSequenceNumber("99"))
    start.rewound(rewound_to)
    assert start.begin(2000.0) is None
    assert (start.checkpoint, start.position) == (starts_at, position)
