"""The .properties reader: Java's Properties syntax, and every KCL key mapped onto WorkerConfig."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition, Position
from kclpy_spark.config import WorkerConfig
from kclpy_spark.multilang.properties import (
    DEFAULT_CHILD_GRACE,
    FANOUT_SUPPORTED,
    MultiLangSettings,
    config_from_properties,
    load_properties,
    parse_properties,
)

HERE = Path(__file__).resolve().parent
LOGGER = "kclpy_spark.multilang.properties"

BASE = {
    "executableName": "python3 app.py",
    "streamName": "orders",
    "applicationName": "orders-app",
    "retrievalMode": "POLLING",
}


def build(**props: str) -> tuple[WorkerConfig, MultiLangSettings]:
    return config_from_properties({**BASE, **props}, folder=Path("/apps/orders"))


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]


# --- java.util.Properties syntax -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=1", {"a": "1"}),
        ("a = 1", {"a": "1"}),
        ("a: 1", {"a": "1"}),
        ("a 1", {"a": "1"}),
        ("a\t=\t1", {"a": "1"}),
        ("   a = 1", {"a": "1"}),
        ("a = 1  ", {"a": "1  "}),  # trailing blanks belong to the value, as in Java
        ("a", {"a": ""}),
        ("a =", {"a": ""}),
        ("a = b = c", {"a": "b = c"}),
        ("a == b", {"a": "= b"}),
        ("a : = b", {"a": "= b"}),
        ("# a = 1\n! b = 2\n\n   \nc = 3", {"c": "3"}),
        ("a = 1\na = 2", {"a": "2"}),
        ("a = 1\r\nb = 2\rc = 3", {"a": "1", "b": "2", "c": "3"}),
        ("a = one, \\\n      two", {"a": "one, two"}),
        ("a = one\\\n  \\\n  two", {"a": "onetwo"}),
        ("a = x\\\\\nb = y", {"a": "x\\", "b": "y"}),  # an even run of backslashes: no join
        ("a = x\\\\\\\n  y", {"a": "x\\y"}),
        ("# comment \\\na = 1", {"a": "1"}),  # a comment line never continues
        ("a = \\\n# not a comment", {"a": "# not a comment"}),
        ("a = 1\\", {"a": "1"}),  # continued past the end of the file
        ("a = \\t\\n\\r\\f|", {"a": "\t\n\r\f|"}),
        ("a = \\u0041\\u00e9", {"a": "A\u00e9"}),
        ("a = \\q\\=\\:", {"a": "q=:"}),
        ("my\\:key\\ name = v", {"my:key name": "v"}),
        ("k\\=ey=v", {"k=ey": "v"}),
        ("a=\\ leading", {"a": " leading"}),
    ],
)
def test_java_properties_syntax(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_a_malformed_unicode_escape_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"app\.properties: line 3: malformed \\uxxxx"):
        parse_properties("a = 1\n\nb = \\u00g1", source="app.properties")


def test_a_file_that_is_not_utf8_is_read_as_latin1(tmp_path: Path) -> None:
    path = tmp_path / "app.properties"
    path.write_bytes(
        b"executableName = python3 caf\xe9.py\nstreamName = s\napplicationName = app\n"
        b"retrievalMode = POLLING\n"
    )
    loaded = load_properties(path)
    assert loaded.multilang.executable_name == "python3 caf\u00e9.py"


def test_the_kcl_workers_tables_follow_the_application_not_the_table_name() -> None:
    """A Java KCL 3.0-3.4 fleet names its worker metrics and coordinator tables after its
    applicationName: with a tableName of its own, the store looked for <tableName>-... and never
    saw the KCL workers (no hand-offs to them, their client version unread)."""
    from checkpoint.stores.dynamodb import DynamoDBLeaseTable

    cfg, _ = build(applicationName="orders-app", tableName="orders-leases")
    assert (cfg.application_name, cfg.kcl_application_name) == ("orders-leases", "orders-app")
    store = DynamoDBLeaseTable(object(), cfg.application_name,  # type: ignore[arg-type]
                               kcl_application=cfg.kcl_application_name)  # fmt: skip
    assert store.table_name == "orders-leases"
    assert store.kcl_metrics.table_name == "orders-app-WorkerMetricStats"
    assert store.kcl_coordinator.table_name == "orders-app-CoordinatorState"
    same, _ = build(applicationName="orders-app", tableName="orders-app")
    assert same.kcl_application_name is None
    plain = DynamoDBLeaseTable(object(), "orders-app")  # type: ignore[arg-type]
    assert plain.kcl_metrics.table_name == "orders-app-WorkerMetricStats"


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_properties(tmp_path / "nope.properties")


# --- the keys ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [
        ("applicationName", "my-app", "application_name", "my-app"),
        ("tableName", "my-lease-table", "application_name", "my-lease-table"),
        ("regionName", "eu-west-1", "region", "eu-west-1"),
        ("workerId", "worker-7", "worker_id", "worker-7"),
        ("failoverTimeMillis", "2500", "failover_time", 2.5),
        ("maxRecords", "250", "max_records", 250),
        ("idleTimeBetweenReadsInMillis", "300", "idle_time_between_reads", 0.3),
        ("shardSyncIntervalMillis", "60000", "shard_sync_interval", 60.0),
        ("parentShardPollIntervalMillis", "10000", "parent_shard_poll_interval", 10.0),
        ("maxLeasesForWorker", "12", "max_leases_for_worker", 12),
        ("maxLeasesToStealAtOneTime", "2", "max_leases_to_steal", 2),
        ("ignoreUnexpectedChildShards", "true", "ignore_unexpected_child_shards", True),
        ("ignoreUnexpectedChildShards", "No", "ignore_unexpected_child_shards", False),
        ("shutdownGraceMillis", "7000", "shutdown_grace", 7.0),
        ("isGracefulLeaseHandoffEnabled", "false", "graceful_handoff", False),
        ("gracefulLeaseHandoffTimeoutMillis", "45000", "handoff_timeout", 45.0),
        ("kinesisEndpoint", "http://127.0.0.1:4566", "endpoint_url", "http://127.0.0.1:4566"),
        ("dynamoDBEndpoint", "http://localhost:4566", "endpoint_url", "http://localhost:4566"),
        ("kclpyspark.lease_store", "sqlite:leases.db", "lease_store", "sqlite:leases.db"),
        ("kclpyspark.max_processing_attempts", "1", "max_processing_attempts", 1),
        ("kclpyspark.park_duration", "2.5", "park_duration", 2.5),
    ],
)
def test_each_key_sets_its_field(key: str, value: str, field: str, expected: Any) -> None:
    cfg, _ = build(**{key: value})
    assert getattr(cfg, field) == expected


def test_defaults_and_the_multilang_settings() -> None:
    cfg, settings = build(timeoutInSeconds="30", shutdownGraceMillis="1500")
    assert cfg.lease_store == "dynamodb"  # the KCL's lease table
    assert cfg.application_name == "orders-app"
    assert cfg.stream_name == "orders" and cfg.stream_arn is None
    assert cfg.initial_position == InitialPosition.latest()  # the KCL's default too
    assert settings == MultiLangSettings(
        executable_name="python3 app.py",
        cwd=Path("/apps/orders"),
        timeout=30.0,
        shutdown_grace=1.5,
        processing_language=None,
    )
    _, plain = build()
    assert plain.timeout is None and plain.shutdown_grace == DEFAULT_CHILD_GRACE


def test_the_lease_tables_region_is_compared_with_aws_region_without_region_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With neither regionName nor an ARN, dynamoDBRegionName went unchecked: the lease table
    was read in AWS_REGION's region, not the one the property named."""
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    with pytest.raises(ConfigError, match="'dynamoDBRegionName'"):
        build(dynamoDBRegionName="eu-west-1")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    build(dynamoDBRegionName="eu-west-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")  # ECS and Lambda always set it
    cfg, _ = build(**{"kclpyspark.region": "eu-west-1", "dynamoDBRegionName": "eu-west-1"})
    assert cfg.region == "eu-west-1"  # the worker's region, not AWS_REGION's


def test_kclpy_spark_variables_set_keys_over_a_properties_file_as_over_a_toml_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The environment was applied to TOML configs only: under ``multilang`` every
    KCLPY_SPARK_<KEY> did nothing, silently (no /metrics with KCLPY_SPARK_METRICS_PORT), while
    the lease table's region check believed KCLPY_SPARK_REGION, which the worker never used."""
    monkeypatch.setenv("KCLPY_SPARK_METRICS_PORT", "9464")
    monkeypatch.setenv("KCLPY_SPARK_FAILOVER_TIME", "30")
    cfg, _ = build(failoverTimeMillis="20000")
    assert cfg.metrics_port == 9464 and cfg.failover_time == 30.0  # the variable beats the file
    flagged, _ = config_from_properties(
        BASE, folder=Path("/apps/orders"), overrides={"failover_time": 12.0}
    )
    assert flagged.failover_time == 12.0  # the flag beats the variable
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("KCLPY_SPARK_REGION", "eu-west-1")
    cfg, _ = build(dynamoDBRegionName="eu-west-1")
    assert cfg.region == "eu-west-1"  # checked against, and used: the same region
    monkeypatch.setenv("KCLPY_SPARK_REGION", "us-east-1")
    with pytest.raises(ConfigError, match="'dynamoDBRegionName'"):
        build(dynamoDBRegionName="eu-west-1")


def test_the_lease_tables_region_may_come_from_the_stream_arn() -> None:
    """dynamoDBRegionName was compared with a regionName of us-east-1 when none was set."""
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders"
    cfg, _ = build(streamArn=arn, dynamoDBRegionName="eu-west-1")
    assert cfg.stream_arn == arn
    local, _ = build(kinesisEndpoint="http://127.0.0.1:4566")  # an emulator serves both
    assert local.endpoint_url == "http://127.0.0.1:4566"


def test_stream_arn_wins_over_stream_name(caplog: pytest.LogCaptureFixture) -> None:
    arn = "arn:aws:kinesis:us-east-1:123456789012:stream/payments"
    cfg, _ = build(streamArn=arn, streamName="orders")
    assert cfg.stream_arn == arn and cfg.stream_name is None and cfg.stream == arn
    assert any("wins over streamName" in m for m in warnings(caplog))


def test_initial_position_in_stream_extended_means_at_timestamp(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg, _ = build(initialPositionInStreamExtended="1636609142")
    expected = datetime.fromtimestamp(1636609142, tz=UTC)
    assert cfg.initial_position == InitialPosition(Position.AT_TIMESTAMP, expected)
    cfg, _ = build(initialPositionInStream="trim_horizon", initialPositionInStreamExtended="5")
    assert cfg.initial_position.position is Position.AT_TIMESTAMP
    assert any("the timestamp wins" in m for m in warnings(caplog))
    cfg, _ = build(initialPositionInStream="TRIM_HORIZON")
    assert cfg.initial_position == InitialPosition.trim_horizon()


def test_an_unknown_key_gives_one_warning_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    build(frobnicate="1", failovertimemillis="1000", maxRecord="5")
    found = warnings(caplog)
    assert found == [
        "unknown property 'frobnicate' is ignored",
        "unknown property 'failovertimemillis' is ignored (did you mean 'failoverTimeMillis'?)",
        "unknown property 'maxRecord' is ignored (did you mean 'maxRecords'?)",
    ]


@pytest.mark.parametrize(
    "key",
    [
        "coordinatorStateTableName",
        "workerMetricsTableName",
        "disableWorkerMetrics",
        "reBalanceThresholdPercentage",
        "leaseAssignmentIntervalMillis",
        "staleWorkerMetricsEntryCleanupDuration",
    ],
)
def test_kcl3_keys_are_accepted_with_a_warning(key: str, caplog: pytest.LogCaptureFixture) -> None:
    build(**{key: "42"})
    assert [m for m in warnings(caplog) if key in m and "KCL 3.x" in m]


@pytest.mark.parametrize(
    "key",
    ["maxActiveThreads", "taskBackoffTimeMillis", "validateSequenceNumberBeforeCheckpointing"],
)
def test_harmless_known_keys_are_logged_at_info(key: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    build(**{key: "1"})
    assert not warnings(caplog)
    assert any(key in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


def test_credentials_providers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    build(AwsCredentialsProvider="DefaultCredentialsProvider")
    assert not warnings(caplog)
    assert any("default credential chain is used" in r.getMessage() for r in caplog.records)
    # A profile was warned about and not used: the worker ran as whatever the chain found.
    cfg, _ = build(AwsCredentialsProvider="software.amazon.awssdk.auth.credentials."
                   "ProfileCredentialsProvider|prod", AwsCredentialsProviderCloudWatch=
                   "ProfileCredentialsProvider|prod")  # fmt: skip
    assert cfg.profile == "prod"
    cfg, _ = build(AwsCredentialsProvider="EnvironmentVariableCredentialsProvider")
    assert cfg.profile is None and not warnings(caplog)
    # The KCL's comma-separated chain: the first that answers is used, the first here.
    cfg, _ = build(AwsCredentialsProvider="ProfileCredentialsProvider|prod,"
                   "DefaultAWSCredentialsProviderChain")  # fmt: skip
    assert cfg.profile == "prod"
    cfg, _ = build(AwsCredentialsProvider="EnvironmentVariableCredentialsProvider,"
                   "InstanceProfileCredentialsProvider")  # fmt: skip
    assert cfg.profile is None  # both within the default chain
    # The CloudWatch one serves nothing here (no metrics go to CloudWatch).
    unused = {"AwsCredentialsProviderCloudWatch": "StsAssumeRoleCredentialsProvider|arn|s"}
    cfg, _ = build(AwsCredentialsProvider="ProfileCredentialsProvider|prod", **unused)
    assert cfg.profile == "prod"
    # SDK v1's web identity provider (IRSA).
    cfg, _ = build(AwsCredentialsProvider="WebIdentityTokenCredentialsProvider")
    assert cfg.profile is None


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"AwsCredentialsProvider": "StsAssumeRoleCredentialsProvider|arn:aws:iam::1:role/r|s"},
         "'StsAssumeRoleCredentialsProvider' is not supported"),
        ({"AwsCredentialsProvider": "ProfileCredentialsProvider|a",
          "AwsCredentialsProviderDynamoDB": "ProfileCredentialsProvider|b"},
         "one set of credentials serves every service"),
        # The KCL falls through to the profile where the first finds nothing: another identity.
        ({"AwsCredentialsProvider": "DefaultAWSCredentialsProviderChain,"
                                    "ProfileCredentialsProvider|prod"},
         "only the first provider of a chain is used here"),
        # A variant's profile would have run every service as it.
        ({"AWSCredentialsProviderDynamoDB": "ProfileCredentialsProvider|tables"},
         "profile 'tables' and AwsCredentialsProvider the default chain"),
    ],
)  # fmt: skip
def test_credentials_providers_that_would_run_as_another_identity_are_refused(
    props: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build(**props)


def test_behaviour_keys_we_do_not_support_warn(caplog: pytest.LogCaptureFixture) -> None:
    build(cleanupLeasesUponShardCompletion="true")
    assert not warnings(caplog)
    build(cleanupLeasesUponShardCompletion="false")
    assert "cleanupLeasesUponShardCompletion = false is not supported" in " | ".join(
        warnings(caplog)
    )


@pytest.mark.parametrize(("value", "expected"), [(None, False), ("false", False), ("TRUE", True)])
def test_empty_record_lists_are_asked_for_as_the_kcl_reads_the_key(
    caplog: pytest.LogCaptureFixture, value: str | None, expected: bool
) -> None:
    props = {} if value is None else {"callProcessRecordsEvenForEmptyRecordList": value}
    _, settings = build(**props)
    assert settings.empty_record_lists is expected
    assert not warnings(caplog)


def test_retrieval_mode() -> None:
    polling, _ = build(retrievalMode="polling")
    default_polls, _ = build(retrievalMode="DEFAULT", maxRecords="100")
    if FANOUT_SUPPORTED:
        fanout, _ = build(retrievalMode="FANOUT", consumerName="orders-efo")
        default, _ = build(retrievalMode="DEFAULT")
        assert getattr(polling, "retrieval_mode") == "polling"  # noqa: B009
        assert getattr(default_polls, "retrieval_mode") == "polling"  # noqa: B009
        assert getattr(fanout, "retrieval_mode") == "fanout"  # noqa: B009
        assert getattr(fanout, "consumer_name") == "orders-efo"  # noqa: B009
        assert getattr(default, "retrieval_mode") == "fanout"  # noqa: B009 - the KCL's rule
    else:
        with pytest.raises(ConfigError, match="'retrievalMode' = FANOUT"):
            build(retrievalMode="FANOUT")
    with pytest.raises(ConfigError, match="'retrievalMode' must be"):
        build(retrievalMode="STREAMING")


@pytest.mark.skipif(not FANOUT_SUPPORTED, reason="this version polls")
@pytest.mark.parametrize(
    ("props", "mode"),
    [
        ({"millisBehindLatestThresholdForReducedTps": "1000"}, "polling"),
        ({"millisBehindLatestThresholdForReducedTps": "0"}, "fanout"),
        ({"idleTimeBetweenReadsInMillis": "0"}, "fanout"),
        ({"idleTimeBetweenReadsInMillis": "500"}, "polling"),
        ({"retryGetRecordsInSeconds": "0"}, "polling"),  # an object in the bean: set is set
    ],
)
def test_default_retrieval_counts_polling_keys_as_the_kcl_does(
    props: dict[str, str], mode: str
) -> None:
    """PollingConfigBean.anyPropertiesSet: the reduced-TPS threshold is a polling key (the
    daemon chose fan-out where the KCL polls), and a Java number 0 is as if not set."""
    cfg, _ = build(retrievalMode="DEFAULT", **props)
    assert getattr(cfg, "retrieval_mode") == mode  # noqa: B009


@pytest.mark.parametrize(
    "key",
    [
        "leaseTableDeletionProtectionEnabled",
        "leaseTablePitrEnabled",
        "leaseTableScanTotalSegments",
        "migrateAllEntitiesToLeaseTable",
        "tableMigrationCompleteBakeTimeSeconds",
        "millisBehindLatestThresholdForReducedTps",
    ],
)
def test_kcl_3_keys_are_known_and_say_why_they_are_not_applied(
    caplog: pytest.LogCaptureFixture, key: str
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        build(**{key: "1"})
    said = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert said and all("is ignored: " in m and "unknown" not in m for m in said)


@pytest.mark.skipif(not FANOUT_SUPPORTED, reason="this version polls")
def test_the_fan_out_consumer_is_named_after_the_application_whatever_the_table() -> None:
    named, _ = build(retrievalMode="FANOUT", tableName="orders-leases")
    given, _ = build(retrievalMode="FANOUT", tableName="orders-leases", consumerName="efo")
    assert (named.application_name, named.consumer_name) == ("orders-leases", "orders-app")
    assert given.consumer_name == "efo"


@pytest.mark.parametrize("props", [{}, {"ApplicationName": "orders-app"}, {"applicationName": " "}])
def test_the_application_name_is_required(props: dict[str, str]) -> None:
    """As the MultiLangDaemon: apps that left it out would share one default lease table."""
    raw = {k: v for k, v in BASE.items() if k != "applicationName"} | props
    with pytest.raises(ConfigError, match="'applicationName' is required"):
        config_from_properties(raw, folder=Path("."))


def test_an_idle_time_of_zero_is_raised_to_the_least_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The KCL raises a value below its least with a warning; it was refused here."""
    cfg, _ = build(idleTimeBetweenReadsInMillis="0")
    assert cfg.idle_time_between_reads == 0.001
    assert "idleTimeBetweenReadsInMillis = 0: raised to 1 ms" in caplog.text


def test_worker_identifier_is_the_kcls_name_for_worker_id() -> None:
    cfg, _ = build(workerIdentifier="host-7")
    assert cfg.worker_id == "host-7"


def test_a_variable_or_flag_naming_another_stream_replaces_the_files() -> None:
    """As over a TOML file: the file's streamName beside a KCLPY_SPARK_STREAM_ARN of another
    stream was refused as two streams."""
    arn = "arn:aws:kinesis:eu-west-1:123456789012:stream/other"
    env = {"KCLPY_SPARK_STREAM_ARN": arn, "KCLPY_SPARK_REGION": "eu-west-1"}
    cfg, _ = config_from_properties(BASE, folder=Path("."), environ=env)
    assert (cfg.stream_arn, cfg.stream_name) == (arn, None)
    cfg, _ = config_from_properties(BASE, folder=Path("."), environ={},
                                    overrides={"stream_name": "third"})  # fmt: skip
    assert cfg.stream == "third"


def test_overrides_win_over_the_file() -> None:
    cfg, _ = config_from_properties(
        {**BASE, "workerId": "from-file", "kinesisEndpoint": "http://a:1"},
        folder=Path("."),
        overrides={"worker_id": "from-flag", "endpoint_url": None, "lease_store": "memory"},
    )
    assert (cfg.worker_id, cfg.endpoint_url, cfg.lease_store) == (
        "from-flag",
        "http://a:1",
        "memory",
    )


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"failoverTimeMillis": "ten"}, "'failoverTimeMillis' must be a whole number"),
        ({"failoverTimeMillis": "1.5"}, "'failoverTimeMillis' must be a whole number"),
        ({"failoverTimeMillis": "0"}, "'failoverTimeMillis' must be >= 1"),
        ({"idleTimeBetweenReadsInMillis": "-5"}, "'idleTimeBetweenReadsInMillis' must be >= 0"),
        ({"maxRecords": "20000"}, "'maxRecords' must be between 1 and 10000"),
        ({"ignoreUnexpectedChildShards": "maybe"}, "'ignoreUnexpectedChildShards' must be true"),
        ({"timeoutInSeconds": "0"}, "'timeoutInSeconds' must be >= 1"),
        # A traceback (OverflowError: int too large to convert to float), not one line:
        ({"timeoutInSeconds": "1" + "0" * 400}, "'timeoutInSeconds' must be a whole number"),
        ({"timeoutInSeconds": str(2**63)}, "'timeoutInSeconds' must be between 1 and"),
        ({"shutdownGraceMillis": "soon"}, "'shutdownGraceMillis' must be a whole number"),
        ({"initialPositionInStream": "EARLIEST"}, "'initialPositionInStream' must be"),
        ({"initialPositionInStream": "AT_TIMESTAMP"}, "initialPositionInStreamExtended"),
        ({"initialPositionInStreamExtended": "yesterday"}, "'initialPositionInStreamExtended'"),
        ({"initialPositionInStreamExtended": "1700000000000"}, "epoch seconds, not milli"),
        ({"streamArn": "arn:aws:s3:::bucket"}, "'streamArn' is not a Kinesis stream ARN"),
        ({"streamName": "bad name!"}, "'streamName'"),
        ({"applicationName": "x"}, "'applicationName'"),
        ({"tableName": "no spaces allowed"}, "'tableName'"),
        ({"kinesisEndpoint": "localhost:4566"}, "'kinesisEndpoint'"),
        ({"kinesisEndpoint": "http://a:1", "dynamoDBEndpoint": "http://b:2"}, "same endpoint"),
        ({"dynamoDBRegionName": "eu-west-1", "regionName": "us-east-1"}, "'dynamoDBRegionName'"),
        (
            {
                "streamArn": "arn:aws:kinesis:eu-west-1:123456789012:stream/o",
                "regionName": "us-east-1",
            },
            "'regionName' 'us-east-1' is not the region of 'streamArn'",
        ),
        # The KCL sends DynamoDB to its regional endpoint: one endpoint serves both here.
        (
            {"kinesisEndpoint": "https://vpce-1.kinesis.eu-west-1.vpce.amazonaws.com"},
            "the other service's endpoint is not set",
        ),
        ({"callProcessRecordsEvenForEmptyRecordList": "sometimes"}, "'callProcessRecords"),
        ({"kclpyspark.nonsense": "1"}, "'kclpyspark.nonsense'"),
        ({"kclpyspark.max_processing_attempts": "many"}, "'max_processing_attempts'"),
        ({"executableName": ""}, "'executableName' is required"),
        ({"streamName": ""}, "'streamName' (or 'streamArn') is required"),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(props: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(**props)
    assert message in str(info.value)


def test_the_sample_properties_file(caplog: pytest.LogCaptureFixture) -> None:
    loaded = load_properties(HERE / "sample.properties")
    cfg, settings = loaded.worker, loaded.multilang
    assert cfg.stream_name == "kclpy-spark-multilang-sample"
    assert cfg.application_name == "kclpy-spark-multilang-sample"
    assert cfg.initial_position == InitialPosition.trim_horizon()
    assert (cfg.failover_time, cfg.max_records, cfg.idle_time_between_reads) == (10.0, 1000, 1.0)
    assert settings.executable_name == "python3 sample_protocol_processor.py"
    assert settings.cwd == HERE and settings.timeout == 60.0 and settings.shutdown_grace == 10.0
    assert settings.processing_language == "python/3"
    assert not warnings(caplog)


def test_two_names_of_one_key_set_differently_are_one_line() -> None:
    """workerId and workerIdentifier both set: the one later in the file won, silently."""
    with pytest.raises(ConfigError, match="'workerId' and 'workerIdentifier'"):
        build(workerId="a", workerIdentifier="b")
    cfg, _ = build(workerId="a", workerIdentifier="a")
    assert cfg.worker_id == "a"


@pytest.mark.parametrize(
    ("key", "value", "warned"),
    [
        ("leaseTableDeletionProtectionEnabled", "false", False),
        ("leaseTableDeletionProtectionEnabled", "true", True),
        ("leaseTablePitrEnabled", "FALSE", False),
        ("millisBehindLatestThresholdForReducedTps", "00", False),
        ("workerMetricsDeletionProtectionEnabled", "false", False),
        ("millisBehindLatestThresholdForReducedTps", "500", True),
    ],
)
def test_ignored_keys_left_at_what_is_done_here_are_not_warned_about(
    caplog: pytest.LogCaptureFixture, key: str, value: str, warned: bool
) -> None:
    """KCL 3.x property files carry these at their defaults: a WARNING to turn on what is
    off was noise."""
    with caplog.at_level(logging.INFO, logger=LOGGER):
        build(**{key: value})
    assert bool(warnings(caplog)) is warned
    assert any(key in r.getMessage() and "is ignored" in r.getMessage() for r in caplog.records)
