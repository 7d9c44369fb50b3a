"""Where a worker's settings come from: flag over ``KCLPY_SPARK_<KEY>`` over the file over the
default; and which region its clients use (config, stream ARN, AWS_REGION, the SDK's chain with
a profile, a local endpoint) with one line when nothing names one. Pure apart from the
environment and a temporary ~/.aws/config."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from checkpoint.base.errors import ConfigError
from kclpy_spark.aws import client_kwargs, region_of
from kclpy_spark.cli import _config_from_args, build_parser
from kclpy_spark.config import WorkerConfig, layered
from kclpy_spark.stream_spec import StreamSpec

ARN = "arn:aws:kinesis:ap-south-1:123456789012:stream/orders"


@pytest.fixture
def aws_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An SDK environment that names no region and no profile, with its own config file."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "aws-config"
    config.write_text("[default]\n\n[profile ops]\nregion = eu-north-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    return config


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(text)
    return path


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'stream_name = "s"\nmax_records = 100\nfailover_time = 20.0\n'
                           'application_name = "from-file"\n')  # fmt: skip
    env = {"KCLPY_SPARK_MAX_RECORDS": "200", "KCLPY_SPARK_FAILOVER_TIME": "30",
           "KCLPY_SPARK_GRACEFUL_HANDOFF": "false"}  # fmt: skip
    cfg = layered(path, env, {"max_records": 300, "failover_time": None})
    assert cfg.max_records == 300  # the flag
    assert cfg.failover_time == 30.0  # the environment (the flag was not given)
    assert cfg.graceful_handoff is False  # the environment over the default
    assert cfg.application_name == "from-file"  # the file
    assert cfg.max_leases_to_steal == WorkerConfig.max_leases_to_steal  # the default


def test_a_flag_or_variable_naming_the_stream_replaces_the_files_stream(tmp_path: Path) -> None:
    """The stream is one setting in three keys: a flag's stream_name beside the file's
    stream_arn (or [[streams]]) was refused as two streams, against the documented order."""
    arn_file = _toml(tmp_path, f'stream_arn = "{ARN}"\nregion = "ap-south-1"\n')
    assert layered(arn_file, {}, {"stream_name": "new"}).stream == "new"
    assert layered(arn_file, {"KCLPY_SPARK_STREAM_NAME": "new"}, {}).stream == "new"
    many = tmp_path / "many.toml"
    many.write_text('[[streams]]\nstream_name = "a"\n[[streams]]\nstream_name = "b"\n')
    cfg = layered(many, {}, {"stream_name": "one"})
    assert (cfg.streams, cfg.stream) == ((), "one")
    named = _toml(tmp_path, 'stream_name = "old"\n')
    assert layered(named, {}, {"stream_arn": ARN}).stream_arn == ARN
    # Naming the same stream again keeps the file's ARN (another account's stream).
    arn_file = _toml(tmp_path, f'stream_arn = "{ARN}"\nregion = "ap-south-1"\n')
    same = layered(arn_file, {"KCLPY_SPARK_STREAM_NAME": "orders"}, {"stream_name": "orders"})
    assert (same.stream_arn, same.stream_name) == (ARN, "orders")


def test_the_environment_alone_can_name_the_stream(tmp_path: Path) -> None:
    cfg = layered(None, {"KCLPY_SPARK_STREAM_NAME": "s", "KCLPY_SPARK_LEASE_STORE": "memory",
                         "KCLPY_SPARK_INITIAL_POSITION": "TRIM_HORIZON"}, {})  # fmt: skip
    assert (cfg.stream_name, cfg.lease_store, cfg.initial_position.position.value) == (
        "s", "memory", "TRIM_HORIZON")  # fmt: skip


def test_an_empty_variable_is_as_good_as_unset(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'stream_name = "s"\nendpoint_url = "http://127.0.0.1:4566"\n')
    cfg = layered(path, {"KCLPY_SPARK_ENDPOINT_URL": ""}, {})
    assert cfg.endpoint_url == "http://127.0.0.1:4566"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"KCLPY_SPARK_MAX_RECORDS": "many"}, ["KCLPY_SPARK_MAX_RECORDS", "max_records"]),
        ({"KCLPY_SPARK_GRACEFUL_HANDOFF": "perhaps"}, ["KCLPY_SPARK_GRACEFUL_HANDOFF"]),
        ({"KCLPY_SPARK_MAX_RECORDS": "0"}, ["max_records", "1..10000"]),
        ({"KCLPY_SPARK_REGION": "mars-1"}, ["region", "mars-1"]),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(env: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        layered(None, {"KCLPY_SPARK_STREAM_NAME": "s", **env}, {})
    message = str(err.value)
    assert "\n" not in message
    assert all(w in message for w in words), message


def test_the_command_line_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, 'stream_name = "s"\nmax_records = 100\n')
    monkeypatch.setenv("KCLPY_SPARK_MAX_RECORDS", "250")
    monkeypatch.setenv("KCLPY_SPARK_WORKER_ID", "from-env")
    args = build_parser().parse_args(["run", "--config", str(path), "--worker-id", "flag"])
    cfg = _config_from_args(args)
    assert (cfg.max_records, cfg.worker_id) == (250, "flag")


@pytest.mark.parametrize(
    ("cfg", "env", "region"),
    [
        (dict(region="ap-south-1", stream_arn=ARN), {"AWS_REGION": "eu-west-1"}, "ap-south-1"),
        (dict(stream_arn=ARN), {"AWS_REGION": "eu-west-1"}, "ap-south-1"),
        (dict(), {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-west-2"}, "eu-west-1"),
        (dict(), {"AWS_DEFAULT_REGION": "us-west-2"}, "us-west-2"),
        (dict(profile="ops"), {}, "eu-north-1"),
        (dict(), {"AWS_PROFILE": "ops"}, "eu-north-1"),
        (dict(endpoint_url="http://127.0.0.1:4566"), {}, "us-east-1"),
        (dict(endpoint_url="http://127.0.0.1:4566"), {"AWS_REGION": "eu-west-1"}, "eu-west-1"),
    ],
)
def test_the_region_comes_from_the_first_place_that_names_one(
    aws_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    cfg: dict[str, str],
    env: dict[str, str],
    region: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    worker = WorkerConfig(**({"stream_name": "s"} if "stream_arn" not in cfg else {}), **cfg)
    assert region_of(worker) == region
    assert client_kwargs(worker)["region_name"] == region


def test_no_region_anywhere_is_one_line_naming_the_ways(aws_home: Path) -> None:
    with pytest.raises(ConfigError) as err:
        region_of(WorkerConfig(stream_name="s"))
    assert "no AWS region" in str(err.value) and "AWS_REGION" in str(err.value)


def test_a_missing_profile_is_one_line(aws_home: Path) -> None:
    with pytest.raises(ConfigError) as err:
        client_kwargs(WorkerConfig(stream_name="s", region="us-east-1", profile="nope"))
    assert "'nope'" in str(err.value) and "\n" not in str(err.value)


def test_a_bad_sdk_region_is_one_line(aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "not a region")
    with pytest.raises(ConfigError) as err:
        region_of(WorkerConfig(stream_name="s"))
    assert "'not a region'" in str(err.value)


def test_a_dynamodb_application_name_leaves_room_for_the_coordination_table() -> None:
    WorkerConfig(stream_name="s", application_name="a" * 239, lease_store="dynamodb")
    WorkerConfig(stream_name="s", application_name="a" * 255)  # SQLite: no second table
    with pytest.raises(ConfigError) as err:
        WorkerConfig(stream_name="s", application_name="a" * 240, lease_store="dynamodb")
    assert "239" in str(err.value) and "KclpySparkState" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("region", "valid"),
    [
        ("eu-west-1", True),
        ("us-gov-west-1", True),
        ("us-isob-east-1", True),
        ("cn-northwest-1", True),
        ("eusc-de-east-1", True),  # botocore's aws-eusc partition: was refused
        ("eu-west1", False),
        ("localhost:4566", False),
        ("EU-WEST-1", False),
    ],
)
def test_region_names_of_every_partition(region: str, valid: bool) -> None:
    if valid:
        assert WorkerConfig(stream_name="s", region=region).region == region
    else:
        with pytest.raises(ConfigError, match="region"):
            WorkerConfig(stream_name="s", region=region)


def test_a_region_other_than_the_stream_arns_or_streams_in_two_regions_are_refused() -> None:
    """Every client of a worker uses one region: the config's won silently over the ARN's, and a
    second [[streams]] ARN of another region was asked for in the first one's (as if gone)."""
    with pytest.raises(ConfigError, match="not the region of the stream ARN"):
        WorkerConfig(stream_arn=ARN, region="us-east-1")
    west = ARN.replace("ap-south-1", "us-west-2")
    with pytest.raises(ConfigError, match="several regions"):
        WorkerConfig(streams=(StreamSpec(None, ARN, None), StreamSpec(None, west, None)))


def test_a_credential_chain_that_fails_on_its_way_is_one_line(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key without its secret (or a profile's missing source_profile, a failing
    credential_process) was botocore's traceback and exit 1."""
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    with pytest.raises(ConfigError, match="AWS credentials") as err:
        client_kwargs(WorkerConfig(stream_name="s", region="eu-west-1"))
    assert "\n" not in str(err.value)


def test_dummy_keys_go_to_an_emulator_only(aws_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A VPC endpoint and no credentials signed requests with LocalStack's test/test keys: the
    user saw "security token invalid" instead of "no AWS credentials found"."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role here
    local = client_kwargs(WorkerConfig(stream_name="s", endpoint_url="http://127.0.0.1:4566"))
    assert local["aws_access_key_id"] == "test"
    vpce = "https://vpce-0a1b.kinesis.eu-west-1.vpce.amazonaws.com"
    aws = client_kwargs(WorkerConfig(stream_name="s", endpoint_url=vpce, region="eu-west-1"))
    assert "aws_access_key_id" not in aws and aws["endpoint_url"] == vpce


def test_a_misspelt_environment_variable_is_named_not_silently_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"KCLPY_SPARK_STREAM_NAME": "s", "KCLPY_SPARK_MAX_RECORD": "5",
               "KCLPY_SPARK_FAST_DECODE": "0"}  # fmt: skip
    cfg = layered(None, environ, {})
    assert cfg.stream_name == "s"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "environment variable KCLPY_SPARK_MAX_RECORD is no config key and is ignored "
        "(did you mean KCLPY_SPARK_MAX_RECORDS?)"
    ]


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:4566"])
def test_each_client_looks_its_credential_chain_up_once(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str | None
) -> None:
    """The check of the chain made its own session: a second lookup per client (an instance
    metadata service that does not answer doubled the start-up time)."""
    import botocore.credentials

    from kclpy_spark.aws import aio_client, boto3_client, lease_table_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE12")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    lookups: list[int] = []
    resolve = botocore.credentials.CredentialResolver.load_credentials

    def counted(self: Any) -> Any:
        lookups.append(1)
        return resolve(self)

    monkeypatch.setattr(botocore.credentials.CredentialResolver, "load_credentials", counted)
    cfg = WorkerConfig(stream_name="s", region="eu-west-1", endpoint_url=endpoint)
    boto3_client("kinesis", cfg)
    lease_table_client(cfg, 5.0)
    assert len(lookups) == 2

    async def made_on_the_loop() -> None:  # after them: no lookup of its own
        async with aio_client("kinesis", cfg):
            pass

    asyncio.run(made_on_the_loop())
    assert len(lookups) == 2


@pytest.mark.parametrize(
    "url",
    [
        "https://kinesis.eusc-de-east-1.amazonaws.eu",
        "https://kinesis.cn-north-1.api.amazonwebservices.com.cn",
        "https://vpce-1.kinesis.eu-west-1.vpce.amazonaws.com",
    ],
)
def test_every_partitions_endpoints_are_aws_hosts(url: str) -> None:
    from kclpy_spark.aws import is_aws_host

    assert is_aws_host(url) and not is_aws_host("http://localstack:4566")


def test_the_default_application_name_on_dynamodb_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two applications left at the default name share one lease table, silently."""
    from kclpy_spark.runtime.daemon import _warn_shared_default

    _warn_shared_default(WorkerConfig(stream_name="s", application_name="orders",
                                      lease_store="dynamodb"))  # fmt: skip
    _warn_shared_default(WorkerConfig(stream_name="s"))  # SQLite: one machine's own file
    assert not caplog.records
    _warn_shared_default(WorkerConfig(stream_name="s", lease_store="dynamodb"))
    assert "shares one lease table" in caplog.text


def test_the_credential_chains_sts_call_has_a_deadline_and_no_retries(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An assume-role profile refreshes its credentials with STS on a client the session makes
    for itself: it had botocore's 60 s connect and read and its retries, and within 10 minutes
    of the expiry every lease-table call waits on that refresh."""
    import socket
    import threading

    import botocore.exceptions

    from kclpy_spark.aws import _botocore_session

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        silent.settimeout(0.2)
        while not done.is_set():
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    aws_home.write_text(
        "[profile base]\naws_access_key_id = AKIAEXAMPLEBASE0001\n"
        "aws_secret_access_key = base-secret\nregion = us-east-1\n"
        "[profile role]\nrole_arn = arn:aws:iam::123456789012:role/r\nsource_profile = base\n"
        "region = us-east-1\n"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://127.0.0.1:{silent.getsockname()[1]}")
    try:
        with pytest.raises(botocore.exceptions.ReadTimeoutError):
            _botocore_session("role").get_credentials().get_frozen_credentials()
    finally:
        done.set()
        silent.close()
        for conn in accepted:
            conn.close()
    assert len(accepted) == 1  # one attempt (botocore's default made several, 60 s each)


@pytest.mark.parametrize(("failover", "timeout"), [(10.0, 5.0), (1.0, 1.0), (120.0, 30.0)])
def test_the_workers_kinesis_control_calls_end_within_a_failover_time(
    aws_home: Path, monkeypatch: pytest.MonkeyPatch, failover: float, timeout: float
) -> None:
    """DescribeStreamSummary and ListShards had the SDK's 30 s reads and four attempts: one call
    that got no answer took two minutes, past the worker's status record's life."""
    from kclpy_spark.aws import kinesis_control_client

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEEXAMPLE12")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x" * 40)
    cfg = WorkerConfig(stream_name="s", region="eu-west-1", failover_time=failover)
    config = kinesis_control_client(cfg).meta.config
    assert (config.connect_timeout, config.read_timeout) == (timeout, timeout)
    assert config.retries["total_max_attempts"] == 2


def test_a_streams_variable_is_said_to_be_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """KCLPY_SPARK_STREAMS is a key's name, so no misspelling was reported, yet it did nothing."""
    cfg = layered(None, {"KCLPY_SPARK_STREAM_NAME": "s", "KCLPY_SPARK_STREAMS": "a,b"}, {})
    assert cfg.stream_name == "s" and cfg.streams == ()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == [
        "environment variable KCLPY_SPARK_STREAMS is ignored: [[streams]] come from the config "
        "file only"
    ]


def test_an_empty_metrics_host_is_one_line_not_every_address(tmp_path: Path) -> None:
    """An empty host (a template left blank) bound every interface: the status page and
    /metrics reachable from the network, unsaid."""
    with pytest.raises(ConfigError, match="'metrics_host' is empty"):
        layered(_toml(tmp_path, 'stream_name = "s"\nmetrics_host = ""\n'), {}, {})


def test_a_sqlite_lease_store_under_the_home_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:~/leases.db`` made a folder named "~" in the working directory: a daemon started
    elsewhere had a new, empty table (and started at LATEST, skipping records)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = WorkerConfig(stream_name="s", lease_store="sqlite:~/leases.db")
    assert cfg.sqlite_path == tmp_path / "leases.db"


def test_a_home_folder_of_no_user_is_one_line() -> None:
    """``sqlite:~nosuchuser/x.db``: a traceback (RuntimeError) instead of one line."""
    cfg = WorkerConfig(stream_name="s", lease_store="sqlite:~no-such-user-here/leases.db")
    with pytest.raises(ConfigError, match="'lease_store'"):
        _ = cfg.sqlite_path


def test_a_number_too_large_for_a_float_in_the_file_is_one_line(tmp_path: Path) -> None:
    """A traceback (OverflowError) from the file, where a flag or variable gave one line."""
    with pytest.raises(ConfigError, match="'failover_time'"):
        layered(_toml(tmp_path, f'stream_name = "s"\nfailover_time = 1{"0" * 400}\n'), {}, {})
