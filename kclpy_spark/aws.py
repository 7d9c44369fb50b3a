"""Client construction for Kinesis and DynamoDB (boto3 and aiobotocore) from a WorkerConfig.

The only place that decides regions, endpoints, retries and credentials. The region is the
config's ``region``, else the stream ARN's, else the environment's and the SDK's (``AWS_REGION``,
``AWS_DEFAULT_REGION``, the profile's ``region``), else us-east-1 when a local endpoint is set
(emulators accept any); with none of them it is one line naming the ways to set it. Credentials
come from the SDK's chain with the config's ``profile`` (or ``AWS_PROFILE``); with an emulator's
endpoint (not an AWS host) and no credentials at all, LocalStack's dummy ones are used.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from checkpoint.base.errors import ConfigError, brief

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig

LOCAL_REGION = "us-east-1"  # a local endpoint's region when nothing names one

# SDK-level retries stay small: our own loops back off with jitter and know what is retriable.
_RETRIES = {"mode": "standard", "max_attempts": 3}
_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 30.0
# Clients a session makes for itself (the credential chain's STS calls: assume-role and web
# identity, e.g. EKS's IRSA) had botocore's defaults, 60 s to connect and 60 s to read, retried;
# within 10 minutes of the credentials' expiry every call of every thread waits on one refresh,
# so a slow STS held every lease's renewal past its lease. One attempt of at most 5 s, under the
# lease-table call's budget (failover_time / 2) at the default failover time.
_NESTED_CONNECT_TIMEOUT = 2.0
_NESTED_READ_TIMEOUT = 3.0


def client_kwargs(cfg: WorkerConfig, session: Any = None) -> dict[str, Any]:
    """Keyword arguments for ``create_client`` / ``boto3.client`` (without the botocore Config).
    A profile that is not there, or a credential chain that fails, is one line here. ``session``:
    the botocore session the client is made from (its credentials are looked up once, and the
    client reuses them)."""
    session = session or _botocore_session(cfg.profile)
    found = _FOUND[cfg.profile] = _credentials(session) is not None
    return endpoint_kwargs(region_of(cfg), cfg.endpoint_url, cfg.profile, credentials=found)


# Whether a profile's chain found credentials, as the last synchronous client saw it: the
# asynchronous client (made after them, on the event loop) asks this, not the chain.
_FOUND: dict[str | None, bool] = {}


def region_of(cfg: WorkerConfig) -> str:
    """The region every client of ``cfg`` uses (the module docstring has the order)."""
    arns = [s.stream_arn for s in cfg.stream_specs if s.stream_arn]
    return resolve_region(cfg.region, arn_region(arns[0] if arns else None), cfg.profile,
                          cfg.endpoint_url)  # fmt: skip


def arn_region(arn: str | None) -> str | None:
    """The region a stream ARN names (``arn:<partition>:kinesis:<region>:...``)."""
    return arn.split(":")[3] if arn else None


def resolve_region(
    configured: str | None, arn_region: str | None, profile: str | None, endpoint_url: str | None
) -> str:
    from kclpy_spark.config_rules import REGION

    if configured:
        return configured
    if arn_region:
        return arn_region
    # AWS_REGION is what the other SDKs (and Lambda, ECS) set; botocore reads only the rest.
    found = os.environ.get("AWS_REGION") or _botocore_session(profile).get_config_variable("region")
    if found:
        if not REGION.match(found):
            raise ConfigError(f"the AWS SDK's region (AWS_REGION or a profile) is not a region: "
                              f"{found!r}")  # fmt: skip
        return str(found)
    if endpoint_url:
        return LOCAL_REGION
    raise ConfigError(
        "no AWS region: set 'region' in the config (or --region, or KCLPY_SPARK_REGION), "
        "AWS_REGION, or a profile with a region"
    )


def endpoint_kwargs(
    region: str | None,
    endpoint_url: str | None,
    profile: str | None = None,
    *,
    credentials: bool | None = None,
) -> dict[str, Any]:
    """The same from a region and an endpoint alone (what a Spark executor is told: credentials
    come from its own chain, never from the driver)."""
    kwargs: dict[str, Any] = {"region_name": region}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
        # An emulator accepts any keys; an AWS endpoint (a VPC or FIPS one) is told none, so a
        # missing credential is the one line saying so, not a request signed with dummy keys.
        if not is_aws_host(endpoint_url):
            found = credentials
            if found is None:
                found = _credentials(_botocore_session(profile)) is not None
            if not found:
                kwargs["aws_access_key_id"] = "test"
                kwargs["aws_secret_access_key"] = "test"
    return kwargs


def is_aws_host(endpoint_url: str) -> bool:
    """Whether ``endpoint_url`` names an AWS endpoint of any partition botocore knows
    (``*.amazonaws.com``, ``*.api.aws``, ``*.amazonaws.eu``...), not an emulator's."""
    from urllib.parse import urlsplit

    host = (urlsplit(endpoint_url).hostname or "").lower().rstrip(".")
    return any(host.endswith("." + suffix) for suffix in _aws_dns_suffixes())


@functools.cache
def _aws_dns_suffixes() -> tuple[str, ...]:
    """Every partition's DNS suffixes (IPv4 and dual-stack), from botocore's own data."""
    from botocore.loaders import Loader

    found = {"amazonaws.com", "amazonaws.com.cn", "amazonaws.eu", "api.aws", "c2s.ic.gov",
             "sc2s.sgov.gov"}  # fmt: skip
    try:
        for partition in Loader().load_data("partitions")["partitions"]:
            outputs = partition.get("outputs", {})
            found.update(s for s in (outputs.get("dnsSuffix"), outputs.get("dualStackDnsSuffix"))
                         if s)  # fmt: skip
    except Exception:  # an older botocore without it: the suffixes above
        pass
    return tuple(sorted(found))


def _credentials(session: Any) -> Any:
    """The session's credentials (None: none anywhere); a chain that fails on its way (a key
    without its secret, a profile's source_profile missing, a credential_process that failed)
    is one line, not botocore's traceback."""
    import botocore.exceptions

    try:
        return session.get_credentials()
    except botocore.exceptions.BotoCoreError as exc:
        raise ConfigError(f"AWS credentials: {brief(str(exc))}") from None


def _botocore_session(profile: str | None) -> Any:
    """A botocore session of ``profile`` (None: ``AWS_PROFILE`` or the default); a profile that
    is not there is one line."""
    import botocore.exceptions
    import botocore.session

    session = botocore.session.Session(profile=profile)
    bound_nested_calls(session)
    try:
        session.get_config_variable("region")  # reads the profile: fails here if it is missing
    except botocore.exceptions.ProfileNotFound as exc:
        raise ConfigError(
            f"AWS profile not found: {exc.kwargs.get('profile')!r} (config 'profile' or "
            "AWS_PROFILE; profiles live in ~/.aws/config and ~/.aws/credentials)"
        ) from None
    return session


def bound_nested_calls(session: Any) -> None:
    """Give the clients ``session`` makes for itself (its credential providers' STS calls) a
    deadline; the clients made here pass their own settings, which win over these."""
    from botocore.config import Config

    session.set_default_client_config(
        Config(
            connect_timeout=_NESTED_CONNECT_TIMEOUT,
            read_timeout=_NESTED_READ_TIMEOUT,
            retries={"mode": "standard", "total_max_attempts": 1},
        )
    )


def botocore_config(
    *,
    max_pool_connections: int = 10,
    timeout: float | None = None,
    attempts: int | None = None,
) -> Any:
    """Client settings: ``timeout`` (seconds) for both connect and read instead of the defaults;
    ``attempts``: that many in all per call (1: our own loop retries), else the SDK's retries."""
    from botocore.config import Config

    retries = _RETRIES if attempts is None else {"mode": "standard", "total_max_attempts": attempts}
    return Config(
        retries=retries,  # type: ignore[arg-type]
        connect_timeout=_CONNECT_TIMEOUT if timeout is None else timeout,
        read_timeout=_READ_TIMEOUT if timeout is None else timeout,
        max_pool_connections=max_pool_connections,
    )


def boto3_client(service: str, cfg: WorkerConfig, config: Any = None) -> Any:
    """A synchronous boto3 client (called from worker threads), with ``config`` (default:
    ``botocore_config()``)."""
    import boto3

    botocore_session = _botocore_session(cfg.profile)
    session: Any = boto3.session.Session(botocore_session=botocore_session)
    return session.client(
        service, config=config or botocore_config(), **client_kwargs(cfg, botocore_session)
    )


def kinesis_control_client(cfg: WorkerConfig) -> Any:
    """The synchronous Kinesis client of the worker's control calls (DescribeStreamSummary,
    ListShards, a shard's existence): half a failover time per connect and per read, two
    attempts. With the SDK's 30 s reads and four attempts one call that got no answer took two
    minutes, past the worker's status record's life: the others counted it gone, and its
    suspend and missing-stream checks waited behind it."""
    timeout = min(_READ_TIMEOUT, max(1.0, cfg.failover_time / 2))
    return boto3_client("kinesis", cfg, botocore_config(timeout=timeout, attempts=2))


def lease_table_client(cfg: WorkerConfig, timeout: float) -> Any:
    """The DynamoDB client of the lease table: ``timeout`` seconds per connect and per read, no
    SDK retries (the store's own retry loop has the deadline), and enough pooled connections for
    the renewal threads (20) plus the worker's other lease-table calls."""
    config = botocore_config(max_pool_connections=32, timeout=timeout, attempts=1)
    return boto3_client("dynamodb", cfg, config)


# Connections an asynchronous client may open at once. A fan-out subscription holds one for up to
# five minutes (HTTP/1.1: no multiplexing); with 50, a worker's 51st subscription and every other
# call of that client waited, without a deadline, for a subscription to end. Connections are
# opened as calls need them (one per call in flight: bounded by the leases alive) and idle ones
# closed after aiohttp's keep-alive time; this only must never be the limit.
ASYNC_CONNECTIONS = 4096


def aio_client(
    service: str, cfg: WorkerConfig, *, max_pool_connections: int = ASYNC_CONNECTIONS
) -> Any:
    """An aiobotocore client context manager: ``async with aio_client("kinesis", cfg) as c``."""
    from aiobotocore.session import AioSession

    _botocore_session(cfg.profile)  # a profile that is not there: one line, not a traceback
    # No credential lookup of its own (the synchronous clients made first checked the chain):
    # it would be one more, on the event loop.
    session = AioSession(profile=cfg.profile)
    bound_nested_calls(session)
    return session.create_client(
        service,
        config=botocore_config(max_pool_connections=max_pool_connections),
        **endpoint_kwargs(
            region_of(cfg), cfg.endpoint_url, cfg.profile, credentials=_FOUND.get(cfg.profile)
        ),
    )
