"""Client construction for Kinesis and DynamoDB (boto3 and aiobotocore) from a WorkerConfig.

The only place that decides endpoints, retries and credentials. With a local endpoint configured
and no credentials in the environment, LocalStack's dummy credentials are used; against AWS the
SDK's own credential chain and TLS endpoints apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig

# SDK-level retries stay small: our own loops back off with jitter and know what is retriable.
_RETRIES = {"mode": "standard", "max_attempts": 3}
_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 30.0


def client_kwargs(cfg: WorkerConfig) -> dict[str, Any]:
    """Keyword arguments for ``create_client`` / ``boto3.client`` (without the botocore Config)."""
    return endpoint_kwargs(cfg.region, cfg.endpoint_url)


def endpoint_kwargs(region: str | None, endpoint_url: str | None) -> dict[str, Any]:
    """The same from a region and an endpoint alone (what a Spark executor is told: credentials
    come from its own chain, never from the driver)."""
    kwargs: dict[str, Any] = {"region_name": region}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
        if not _have_credentials():
            kwargs["aws_access_key_id"] = "test"
            kwargs["aws_secret_access_key"] = "test"
    return kwargs


def _have_credentials() -> bool:
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def botocore_config(
    *,
    max_pool_connections: int = 10,
    timeout: float | None = None,
    sdk_retries: bool = True,
) -> Any:
    """Client settings: ``timeout`` (seconds) for both connect and read instead of the defaults;
    without ``sdk_retries`` botocore makes one attempt per call (our own loop retries)."""
    from botocore.config import Config

    return Config(
        retries=_RETRIES if sdk_retries else {"mode": "standard", "total_max_attempts": 1},  # type: ignore[arg-type]
        connect_timeout=_CONNECT_TIMEOUT if timeout is None else timeout,
        read_timeout=_READ_TIMEOUT if timeout is None else timeout,
        max_pool_connections=max_pool_connections,
    )


def boto3_client(service: str, cfg: WorkerConfig) -> Any:
    """A synchronous boto3 client (lease table, shard listing: called from worker threads)."""
    import boto3

    session: Any = boto3.session.Session()
    return session.client(service, config=botocore_config(), **client_kwargs(cfg))


def lease_table_client(cfg: WorkerConfig, timeout: float) -> Any:
    """The DynamoDB client of the lease table: ``timeout`` seconds per connect and per read, no
    SDK retries (the store's own retry loop has the deadline), and enough pooled connections for
    the renewal threads (20) plus the worker's other lease-table calls."""
    import boto3

    session: Any = boto3.session.Session()
    config = botocore_config(max_pool_connections=32, timeout=timeout, sdk_retries=False)
    return session.client("dynamodb", config=config, **client_kwargs(cfg))


def aio_client(service: str, cfg: WorkerConfig, *, max_pool_connections: int = 50) -> Any:
    """An aiobotocore client context manager: ``async with aio_client("kinesis", cfg) as c``."""
    from aiobotocore.session import get_session

    return get_session().create_client(
        service,
        config=botocore_config(max_pool_connections=max_pool_connections),
        **client_kwargs(cfg),
    )
