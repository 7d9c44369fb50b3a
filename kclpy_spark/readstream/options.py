"""The ``kinesis-kcl`` source's options, checked once at ``load()`` (each bad one is one line).

Names follow the awslabs / Databricks Kinesis connectors where they have one (``streamName``,
``streamARN``, ``region``, ``endpointUrl``, ``initialPosition``); Spark hands options over with
their case folded, so any case is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition
from kclpy_spark.aws import arn_region, resolve_region
from kclpy_spark.config import WorkerConfig
from kclpy_spark.config_rules import APP_NAME, REGION, check_endpoint
from kclpy_spark.stream_spec import check_stream

# option (as documented) -> what it sets; every value is a string, as Spark passes them
KNOWN = {
    "streamName": "the stream to read",
    "streamARN": "the stream to read, by ARN",
    "region": "the stream's region (default: the ARN's, AWS_REGION, the SDK's)",
    "endpointUrl": "a local endpoint (LocalStack); default: AWS",
    "initialPosition": "TRIM_HORIZON, LATEST (default) or AT_TIMESTAMP:<epoch or ISO time>",
    "applicationName": "the application (names the pin folder by default)",
    "maxRecordsPerShard": "the most records a shard gives a batch (default 100000; KPL: aggregate)",
    "maxBytesPerShard": "the most bytes a shard gives a batch (default 10 MiB: ~5 s of its limit)",
    "maxReadBytesPerSecond": "per shard, the pace of reads (default 2 MiB/s; 0: no pacing)",
    "kplDeaggregation": "split KPL aggregates into their records (default true)",
    "pinLocation": "a folder the driver and every executor see, for the ranges' pins",
    "shardsPerTask": "shards one Spark task reads side by side (default 4)",
    "maxRecordsPerTrigger": "the most records a batch reads over all shards (Spark's ReadMaxRows)",
    "maxBytesPerTrigger": "the most bytes a batch reads over all shards (Spark's ReadMaxBytes)",
    "leaseStore": "none (default), dynamodb (the KCL's table, named applicationName) or "
    "sqlite:<path> (one machine): the query holds KCL leases and checkpoints them",
    "failoverTime": "with a lease store: seconds until a lease not renewed moves (default 10)",
}


@dataclass(frozen=True)
class SourceOptions:
    stream_name: str | None
    stream_arn: str | None
    region: str
    endpoint_url: str | None
    initial_position: InitialPosition
    application_name: str
    max_records: int
    max_bytes: int
    read_rate: int
    kpl: bool
    pin_location: Path
    shards_per_task: int = 4
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    lease_store: str | None = None  # None: no leases (Spark's checkpoint alone)
    failover_time: float = 10.0

    @property
    def stream_arg(self) -> dict[str, str]:
        if self.stream_arn:
            return {"StreamARN": self.stream_arn}
        return {"StreamName": str(self.stream_name)}

    @property
    def stream(self) -> str:
        return self.stream_arn or str(self.stream_name)

    @classmethod
    def parse(cls, given: Mapping[str, str]) -> SourceOptions:
        by_lower = {name.lower(): name for name in KNOWN}
        unknown = sorted(k for k in given if k.lower() not in by_lower)
        if unknown:
            raise ConfigError(
                f"kinesis-kcl: unknown option(s) {', '.join(unknown)} (known: {', '.join(KNOWN)})"
            )
        values = {by_lower[k.lower()]: str(v) for k, v in given.items()}
        name, arn = values.get("streamName"), values.get("streamARN")
        if not name and not arn:
            raise ConfigError("kinesis-kcl: option streamName (or streamARN) is required")
        check_stream(name or None, arn or None, "kinesis-kcl option", ("streamName", "streamARN"))
        endpoint = values.get("endpointUrl") or None
        if endpoint is not None:
            check_endpoint(endpoint)
        app = values.get("applicationName", "kclpy-spark-stream")
        if not APP_NAME.match(app):
            raise ConfigError(
                "kinesis-kcl: option applicationName must be 3-255 letters, digits, '_', '-', "
                f"'.', got {app!r}"
            )
        try:
            position = InitialPosition.parse(values.get("initialPosition", "LATEST"))
        except ValueError as exc:
            raise ConfigError(f"kinesis-kcl: option initialPosition: {exc}") from None
        made = cls(
            stream_name=name or None,
            stream_arn=arn or None,
            endpoint_url=endpoint,
            initial_position=position,
            application_name=app,
            max_records=_int(values, "maxRecordsPerShard", 100_000, 1, 10_000_000),
            max_bytes=_int(values, "maxBytesPerShard", 10 * 1024 * 1024, 1, 2**40),
            read_rate=_int(values, "maxReadBytesPerSecond", 2 * 1024 * 1024, 0, 2 * 1024 * 1024),
            kpl=_bool(values, "kplDeaggregation", True),
            shards_per_task=_int(values, "shardsPerTask", 4, 1, 64),
            # absolute at load(): the executors' working folders differ from the driver's
            pin_location=Path(values.get("pinLocation") or f".kclpy-spark/pins/{app}").absolute(),
            # last (every other option checked first), on the driver, once: the executors are told
            # it, as the daemon's are
            region=_region(values.get("region") or None, arn or None, endpoint),
            max_records_per_trigger=_optional(values, "maxRecordsPerTrigger", 2**40),
            max_bytes_per_trigger=_optional(values, "maxBytesPerTrigger", 2**50),
            lease_store=_lease_store(values.get("leaseStore", "none")),
            failover_time=float(_int(values, "failoverTime", 10, 1, 3600)),
        )
        if made.max_records_per_trigger is not None and made.max_bytes_per_trigger is not None:
            raise ConfigError(
                "kinesis-kcl: give maxRecordsPerTrigger or maxBytesPerTrigger, not both (Spark "
                "hands a Python source one limit)"
            )
        if made.lease_store is not None:
            _check_leased(made, named_app="applicationName" in values)
        return made

    def worker_config(self) -> WorkerConfig:
        """The configuration of the query's lease worker (a fresh worker id each call)."""
        from kclpy_spark.config import _default_worker_id, from_mapping

        values = {
            "application_name": self.application_name, "stream_name": self.stream_name,
            "stream_arn": self.stream_arn, "region": self.region,
            "endpoint_url": self.endpoint_url, "initial_position": self.initial_position,
            "lease_store": self.lease_store, "failover_time": self.failover_time,
            "worker_id": f"query:{_default_worker_id()}",
        }  # fmt: skip
        try:
            return from_mapping(values, source="kinesis-kcl options")
        except ConfigError as exc:
            raise ConfigError(
                f"kinesis-kcl: option leaseStore {self.lease_store!r}: {exc}"
            ) from None


def _check_leased(options: SourceOptions, *, named_app: bool) -> None:
    """One line at load() for a lease store the source cannot use."""
    if not named_app:
        # The lease table is named after it: two queries (or two sources of one) on different
        # streams would share the default one, and shard ids repeat across streams, so one
        # stream's checkpoints would resume the other's shards.
        raise ConfigError(
            "kinesis-kcl: option leaseStore needs option applicationName (the lease table's "
            "name: one per application and stream; a query that ran before without it used "
            "'kclpy-spark-stream': name that to keep its checkpoints)"
        )
    options.worker_config()  # a bad lease store


def _lease_store(given: str) -> str | None:
    """The lease store option: None for none; the kind in any case (DynamoDB, SQLite:PATH)."""
    kind, colon, path = given.partition(":")
    store = kind.lower() + colon + path
    if store == "memory":  # in the source's own process, gone with it: no one to share with
        raise ConfigError(
            "kinesis-kcl: option leaseStore must be none, dynamodb or sqlite:PATH (memory "
            "would keep the leases in the source's own process, lost with it)"
        )
    if store not in ("none", "dynamodb") and not (kind.lower() == "sqlite" and colon and path):
        raise ConfigError(
            f"kinesis-kcl: option leaseStore must be none, dynamodb or sqlite:PATH, got {given!r}"
        )
    return None if store == "none" else store


def _region(given: str | None, arn: str | None, endpoint: str | None) -> str:
    if given is not None and not REGION.match(given):  # taken as it was, failing much later
        raise ConfigError(f"kinesis-kcl: option region is not an AWS region name: {given!r}")
    try:
        return resolve_region(given, arn_region(arn), None, endpoint)
    except ConfigError as exc:
        if not str(exc).startswith("no AWS region"):  # a missing profile, a malformed AWS_REGION
            raise ConfigError(f"kinesis-kcl: {exc}") from None
        raise ConfigError(
            "kinesis-kcl: no AWS region: give option region (or a streamARN, AWS_REGION, or a "
            "profile with a region)"
        ) from None


def _int(values: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = values.get(name)
    if text is None:
        return default
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(
            f"kinesis-kcl: option {name} must be a whole number, got {text!r}"
        ) from None
    if not low <= number <= high:
        raise ConfigError(f"kinesis-kcl: option {name} must be {low}..{high}, got {number}")
    return number


def _optional(values: Mapping[str, str], name: str, high: int) -> int | None:
    return None if values.get(name) is None else _int(values, name, 0, 1, high)


def _bool(values: Mapping[str, str], name: str, default: bool) -> bool:
    text = values.get(name)
    if text is None:
        return default
    if text.lower() in {"true", "false"}:
        return text.lower() == "true"
    raise ConfigError(f"kinesis-kcl: option {name} must be true or false, got {text!r}")
