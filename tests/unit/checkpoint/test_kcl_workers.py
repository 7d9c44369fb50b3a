"""KCL 3.x workers known by their metrics entities (KCL 3.5's single-table format): which lease
table items are one (``kcl_worker_of``), and which are live (``live_kcl_workers``, the KCL
leader's 60 s rule)."""

from __future__ import annotations

from typing import Any

import pytest

from checkpoint.coordination import KCL_METRICS_MAX_AGE, live_kcl_workers
from checkpoint.port import KclWorkerSighting
from checkpoint.stores.dynamo_kcl_workers import kcl_worker_of

METRICS = {"S": "WORKER_METRIC_STATS"}


@pytest.mark.parametrize(
    ("item", "seen"),
    [
        ({"leaseKey": {"S": "w1"}, "entityType": METRICS, "lut": {"N": "17"}}, ("w1", 17.0)),
        ({"leaseKey": {"S": "w1"}, "entityType": METRICS, "lut": {"N": "1.5e9"}}, ("w1", 1.5e9)),
        ({"leaseKey": {"S": "w1"}, "entityType": METRICS}, None),  # no lut: counted as expired
        ({"leaseKey": {"S": "w1"}, "entityType": METRICS, "lut": {"S": "17"}}, None),
        ({"leaseKey": {"S": "w1"}, "entityType": METRICS, "lut": {"N": "soon"}}, None),
        ({"entityType": METRICS, "lut": {"N": "17"}}, None),
        ({"leaseKey": {"S": "w1"}, "entityType": {"S": "LEASE"}, "lut": {"N": "17"}}, None),
        ({"leaseKey": {"S": "Leader"}, "entityType": {"S": "LEADER"}, "lut": {"N": "1"}}, None),
        ({"leaseKey": {"S": "shardId-0"}, "lut": {"N": "17"}}, None),  # a lease (no entityType)
    ],
)
def test_which_items_are_kcl3_workers(item: dict[str, Any], seen: tuple[str, float] | None) -> None:
    assert kcl_worker_of(item) == (None if seen is None else KclWorkerSighting(*seen))


def test_the_separate_tables_items_are_keyed_by_wid_without_an_entity_type() -> None:
    item = {"wid": {"S": "w1"}, "lut": {"N": "17"}, "sts": {"M": {}}}
    assert kcl_worker_of(item, "wid") == KclWorkerSighting("w1", 17.0)
    assert kcl_worker_of({"wid": {"S": "w1"}}, "wid") is None
    assert kcl_worker_of(item) is None  # in the lease table: no entityType, a lease


def test_a_kcl3_worker_is_live_while_its_entity_is_at_most_60_seconds_old() -> None:
    now = 1_000.0
    sightings = [
        KclWorkerSighting("fresh", now - 1.0),
        KclWorkerSighting("edge", now - KCL_METRICS_MAX_AGE),
        KclWorkerSighting("stale", now - KCL_METRICS_MAX_AGE - 0.5),
        KclWorkerSighting("ahead", now + 3.0),  # its clock runs ahead of ours
    ]
    assert live_kcl_workers(sightings, now) == {
        "fresh": now - 1.0, "edge": now - KCL_METRICS_MAX_AGE, "ahead": now + 3.0
    }  # fmt: skip
    assert KCL_METRICS_MAX_AGE == 60.0


class _MigrationItemClient:
    """GetItem of a KCL 3.0-3.4 fleet's Migration3.0 item, or a throttle."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.throttle = False

    def describe_table(self, **_: Any) -> dict[str, Any]:
        return {"Table": {"TableStatus": "ACTIVE"}}

    def get_item(self, **_: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        if self.throttle:
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "x"}}
            raise ClientError(error, "GetItem")  # type: ignore[arg-type]
        return {"Item": {"key": {"S": "Migration3.0"}, "cv": {"S": self.version}}}


@pytest.mark.parametrize("read_first", [True, False])
def test_a_failed_read_of_the_fleets_client_version_is_not_a_fleet_that_follows_handoffs(
    read_first: bool,
) -> None:
    """A failed GetItem answered None, read as "a fleet started on 3.x": a fleet still in 2.x
    mode counted as hand-off targets that round, and each lease given to one idled until it
    expired. Now: the last version read, or one that follows no hand-offs."""
    from checkpoint.base.retry import RetryPolicy
    from checkpoint.coordination import kcl_workers_follow_handoffs
    from checkpoint.stores.dynamo_kcl_workers import KclCoordinatorTable

    client = _MigrationItemClient("CLIENT_VERSION_UPGRADE_FROM_2X")
    retry = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
    table = KclCoordinatorTable(client, "app", retry, lambda _: None)  # type: ignore[arg-type]
    table.probe()
    if read_first:
        assert table.client_version() == "CLIENT_VERSION_UPGRADE_FROM_2X"
    client.throttle = True
    assert not kcl_workers_follow_handoffs(table.client_version())
    client.version, client.throttle = "CLIENT_VERSION_3X", False
    assert kcl_workers_follow_handoffs(table.client_version())
    client.throttle = True
    assert kcl_workers_follow_handoffs(table.client_version())  # the last one read


class _Undescribable(_MigrationItemClient):
    """The coordinator table cannot be looked at: no IAM permission, or throttled."""

    def __init__(self, code: str) -> None:
        super().__init__("CLIENT_VERSION_2X")
        self.code = code

    def describe_table(self, **_: Any) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        error: Any = {"Error": {"Code": self.code, "Message": "x"}}
        raise ClientError(error, "DescribeTable")


@pytest.mark.parametrize(
    "code", ["AccessDeniedException", "ProvisionedThroughputExceededException"]
)
def test_a_failed_look_for_the_coordinator_table_is_not_a_fleet_that_follows_handoffs(
    code: str,
) -> None:
    """A table not found is a fleet started on 3.x; one that could not be looked at (IAM, a
    throttle) said the same, and a fleet still in 2.x mode was handed leases."""
    from checkpoint.base.retry import RetryPolicy
    from checkpoint.coordination import kcl_workers_follow_handoffs
    from checkpoint.stores.dynamo_kcl_workers import KclCoordinatorTable

    retry = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)
    table = KclCoordinatorTable(_Undescribable(code), "app", retry, lambda _: None)  # type: ignore[arg-type]
    table.probe()
    assert not kcl_workers_follow_handoffs(table.client_version())
