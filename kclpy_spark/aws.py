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
    kwargs: dict[str, Any] = {"region_name": cfg.region}
    if cfg.endpoint_url:
        kwargs["endpoint_url"] = cfg.endpoint_url
        if not _have_credentials():
            kwargs["aws_access_key_id"] = "test"
            kwargs["aws_secret_access_key"] = "test"
    return kwargs


def _have_credentials() -> bool:
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def botocore_config(*, max_pool_connections: int = 10) -> Any:
    from botocore.config import Config

    return Config(
        retries=_RETRIES,  # type: ignore[arg-type]
        connect_timeout=_CONNECT_TIMEOUT,
        read_timeout=_READ_TIMEOUT,
        max_pool_connections=max_pool_connections,
    )


def boto3_client(service: str, cfg: WorkerConfig) -> Any:
    """A synchronous boto3 client (lease table, shard listing: called from worker threads)."""
    import boto3

    session: Any = boto3.session.Session()
    return session.client(service, config=botocore_config(), **client_kwargs(cfg))


def aio_client(service: str, cfg: WorkerConfig, *, max_pool_connections: int = 50) -> Any:
    """An aiobotocore client context manager: ``async with aio_client("kinesis", cfg) as c``."""
    from aiobotocore.session import get_session

    return get_session().create_client(
        service,
        config=botocore_config(max_pool_connections=max_pool_connections),
        **client_kwargs(cfg),
    )
