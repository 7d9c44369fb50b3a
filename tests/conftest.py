"""Session fixtures: a real LocalStack (Kinesis + DynamoDB) and a real local SparkSession.

Tests that use ``localstack_endpoint`` (directly or through a client fixture) are marked
``integration`` automatically, and those that use ``spark`` are marked ``spark``, so
``pytest -m "not integration and not spark"`` runs the pure tests alone in seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checkpoint.stores.dynamo_table import coordination_table_of
from kclpy_spark.spark.py4j_args import pass_plain_arguments
from kclpy_spark.spark.session import SparkTarget, classic_conf

REPO = Path(__file__).resolve().parents[1]
LSCTL = REPO / "localstack" / "lsctl.py"
REGION = "us-east-1"


def _healthy(endpoint: str) -> bool:
    try:
        with urllib.request.urlopen(f"{endpoint}/_localstack/health", timeout=2) as resp:
            services = json.load(resp).get("services", {})
    except (OSError, ValueError):
        return False
    return all(services.get(s) in {"running", "available"} for s in ("kinesis", "dynamodb"))


def _start_localstack() -> str:
    proc = subprocess.run(
        [sys.executable, str(LSCTL), "start"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"LocalStack did not start: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().splitlines()[-1]


def _client_kwargs(endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point a boto3/aiobotocore client at the LocalStack at ``endpoint``."""
    return {
        "endpoint_url": endpoint,
        "region_name": REGION,
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
    }


def _warm_up(endpoint: str) -> None:
    """A few rounds of the calls the tests make most, on a LocalStack just started: its DynamoDB
    Local is a JVM, and its first calls took over a second while Spark JVMs started beside it (a
    worker with a 3 s failover time, its calls 0.5 s each, once gave up opening its table)."""
    import boto3

    dynamodb = boto3.client("dynamodb", **_client_kwargs(endpoint))
    kinesis = boto3.client("kinesis", **_client_kwargs(endpoint))
    name = f"warm-up-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
    )  # fmt: skip
    kinesis.create_stream(StreamName=name, ShardCount=1)
    try:
        for i in range(30):
            key = {"k": {"S": f"k{i % 3}"}}
            dynamodb.put_item(TableName=name, Item={**key, "n": {"N": str(i)}})
            dynamodb.update_item(
                TableName=name, Key=key, UpdateExpression="SET n = n + :one",
                ConditionExpression="attribute_exists(k)",
                ExpressionAttributeValues={":one": {"N": "1"}},
            )  # fmt: skip
            dynamodb.get_item(TableName=name, Key=key, ConsistentRead=True)
            dynamodb.scan(TableName=name)
            dynamodb.describe_table(TableName=name)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
        )
        shard = kinesis.list_shards(StreamName=name)["Shards"][0]["ShardId"]
        for i in range(10):
            kinesis.put_record(StreamName=name, Data=b"x", PartitionKey=str(i))
        iterator = kinesis.get_shard_iterator(
            StreamName=name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(10):
            iterator = kinesis.get_records(ShardIterator=iterator)["NextShardIterator"]
    finally:
        with contextlib.suppress(Exception):
            dynamodb.delete_table(TableName=name)
        with contextlib.suppress(Exception):
            kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True)


def _stop_localstack() -> None:
    subprocess.run([sys.executable, str(LSCTL), "stop"], check=False, capture_output=True)


# Under pytest-xdist (scripts/test.sh runs three test processes) the workers share one LocalStack:
# the first to need it starts it under a lock and leaves this file in the folder the run's
# workers share; the controlling process stops it when the whole run ends (pytest_sessionfinish).
STARTED_MARK = "localstack-started-by-this-run"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across the run's processes (released if one dies)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def localstack_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running LocalStack: ``LOCALSTACK_ENDPOINT`` if set, else one we start and stop."""
    given = os.environ.get("LOCALSTACK_ENDPOINT")
    if given:
        if not _healthy(given):
            pytest.fail(f"LOCALSTACK_ENDPOINT={given} does not report kinesis and dynamodb running")
        yield given
        return
    port = os.environ.get("LOCALSTACK_PORT", "4566")
    endpoint = f"http://127.0.0.1:{port}"
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent
        with _locked(shared / "localstack.lock"):
            if not _healthy(endpoint):
                endpoint = _start_localstack()
                (shared / STARTED_MARK).write_text(endpoint)
                _warm_up(endpoint)
        yield endpoint
        return
    if _healthy(endpoint):
        # A LocalStack already answers there (ours from an earlier run, or one started by hand):
        # use it, and leave it running.
        yield endpoint
        return
    endpoint = _start_localstack()
    _warm_up(endpoint)
    try:
        yield endpoint
    finally:
        _stop_localstack()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controlling process of an xdist run: stop the LocalStack a worker started."""
    if hasattr(session.config, "workerinput"):
        return  # a worker; the mark below exists only if a worker of this run wrote it
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    mark = factory.getbasetemp() / STARTED_MARK
    if mark.exists():
        _stop_localstack()
        mark.unlink()


@pytest.fixture(scope="session")
def aws_client_kwargs(localstack_endpoint: str) -> dict[str, Any]:
    """Keyword arguments that point a boto3/aiobotocore client at LocalStack."""
    return _client_kwargs(localstack_endpoint)


@pytest.fixture(scope="session")
def aws_client(localstack_endpoint: str) -> Callable[[str], Any]:
    """A factory of localstack-client clients: ``aws_client("kinesis")``."""
    from urllib.parse import urlparse

    import localstack_client.session

    url = urlparse(localstack_endpoint)
    os.environ.setdefault("EDGE_PORT", str(url.port or 4566))
    session = localstack_client.session.Session(
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name=REGION,
        localstack_host=f"{url.hostname}:{url.port or 4566}",
    )

    def make(service: str) -> Any:
        return session.client(service)

    return make


@pytest.fixture(scope="session")
def kinesis_client(aws_client: Callable[[str], Any]) -> Any:
    return aws_client("kinesis")


@pytest.fixture(scope="session")
def dynamodb_client(aws_client: Callable[[str], Any]) -> Any:
    return aws_client("dynamodb")


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A name no other test uses, for streams and tables on the shared LocalStack.

    A stream of that name is deleted afterwards: LocalStack limits the open shards of the account
    (100 by default; 500 in one that localstack/lsctl.py starts), so a suite that left its streams
    behind would run out halfway. So is the coordination table a lease store made beside a lease
    table of that name (a test deletes the lease table it made itself), so a long-lived
    LOCALSTACK_ENDPOINT does not collect them.
    """
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:8]}"
    yield name
    if "kinesis_client" in request.fixturenames:
        kinesis = request.getfixturevalue("kinesis_client")
        with contextlib.suppress(Exception):  # never created, or already gone
            kinesis.delete_stream(StreamName=name, EnforceConsumerDeletion=True)
    if "dynamodb_client" in request.fixturenames:
        dynamodb = request.getfixturevalue("dynamodb_client")
        with contextlib.suppress(Exception):
            dynamodb.delete_table(TableName=coordination_table_of(name))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real ``local[2]`` SparkSession for the whole run (a second one would reuse the JVM)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = SparkSession.builder.master("local[2]").appName("kclpy-spark-tests")
    # Configured as the sink's own local sessions are (the no-chmod jar, Arrow to the tasks, ...).
    extra = {"spark.sql.shuffle.partitions": "2", "spark.sql.warehouse.dir": str(warehouse)}
    for key, value in classic_conf(SparkTarget.parse("local[2]"), extra).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    pass_plain_arguments()  # as the sink's own sessions do
    session.sparkContext.setLogLevel("WARN")
    try:
        yield session
    finally:
        session.stop()


# The files that take longest (a minute or more of one test process, from the durations every run
# prints; CPU-heavy ones first, though the order only matters within each kind: heavy_slots.py),
# started first: the test processes then finish about together instead of one running a long
# file alone at the end. Order only; nothing is skipped.
LONGEST_FIRST = (
    "test_spark_sink_kill9.py", "test_executor_reads.py", "test_core_install.py",
    "test_spark_sink_e2e.py", "test_cluster_read_executors.py", "test_readstream_kill9.py",
    "test_executor_chaos.py", "test_readstream.py", "test_readstream_leases.py",
    "test_until_caught_up.py",
    "test_faults.py", "test_leader_failover.py", "test_chaos.py", "test_worker_fleet.py",
    "test_bad_input_running.py", "test_kcl_rs_fleet.py", "test_demo.py", "test_operations.py",
    "test_lease_table_contract.py",
)  # fmt: skip


# The files whose tests keep the CPU busy (Spark JVMs, executors, pip building venvs).
# scripts/test.sh runs three test processes, but at most CPU_HEAVY_SLOTS of these files run at
# once: the third process meanwhile runs tests that mostly wait on leases and timers. (Four
# processes with no limit made Spark write deadlines expire on two cores.) They carry the
# ``cpu_heavy`` marker, so ``-m cpu_heavy`` selects them.
CPU_HEAVY = frozenset({
    "test_bad_input.py", "test_cluster_read.py", "test_cluster_read_executors.py",
    "test_core_install.py", "test_executor_chaos.py", "test_executor_reads.py",
    "test_readstream.py", "test_readstream_kill9.py", "test_readstream_leases.py",
    "test_sink_gives_up.py", "test_smoke_spark.py", "test_spark_java_options.py",
    "test_spark_jvm_garbage.py", "test_spark_sink_e2e.py", "test_spark_sink_kill9.py",
    "test_spark_sink_local.py", "test_until_caught_up.py",
})  # fmt: skip
CPU_HEAVY_SLOTS = 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` that hands out a heavy file whenever a slot is free, else a light one
    (``heavy_slots.py``): no test process waits on a slot while light files are left."""
    if config.getoption("dist") != "loadfile":
        return None
    from heavy_slots import HeavySlotScheduling

    return HeavySlotScheduling(
        config, log, is_heavy=lambda scope: Path(scope).name in CPU_HEAVY, slots=CPU_HEAVY_SLOTS
    )


@pytest.fixture(scope="module", autouse=True)
def _cpu_heavy_slot(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, one of CPU_HEAVY_SLOTS run-wide slots for a CPU_HEAVY file, held from
    before its module fixtures (a Spark cluster) start until they stop."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or request.path.name not in CPU_HEAVY:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent
    while True:
        for slot in range(CPU_HEAVY_SLOTS):
            with (shared / f"cpu-heavy-{slot}.lock").open("a") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                return
        time.sleep(0.2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
    for item in items:
        if item.path.name in CPU_HEAVY:
            item.add_marker(pytest.mark.cpu_heavy)
        names = set(getattr(item, "fixturenames", ()))
        if names & {
            "localstack_endpoint",
            "aws_client_kwargs",
            "aws_client",
            "kinesis_client",
            "dynamodb_client",
        }:
            item.add_marker(pytest.mark.integration)
        if "spark" in names:
            item.add_marker(pytest.mark.spark)
