"""Read an amazon-kclpy application's ``.properties`` file, as the Java MultiLangDaemon does.

The file is read with Java's ``Properties`` syntax (``javaprops``); the keys are in ``kcl_keys``.

``load_properties`` maps the KCL's keys onto a ``WorkerConfig`` (durations converted from
milliseconds to seconds here, once) plus the ``MultiLangSettings`` of the child process. Every key
the MultiLangDaemon knows is accepted: those we honour change the config, those we do not are
logged (WARNING when ignoring them changes what the application gets, INFO when not), and a key
nobody knows gets one WARNING (with a suggestion when it looks like a known key in another case).
A value that cannot be used raises ``ConfigError`` naming the key.

Differences from the Java daemon, on purpose:

* ``streamArn`` wins over ``streamName`` (as documented); ``initialPositionInStreamExtended``
  (epoch seconds: AT_TIMESTAMP) wins over ``initialPositionInStream`` (in Java the outcome
  depends on hash order);
* values are stripped of surrounding blanks, and an empty value means "not set";
* the lease store is DynamoDB (the KCL's table, named by ``tableName`` or ``applicationName``);
* retrieval follows ``retrievalMode`` with the KCL's DEFAULT rule (enhanced fan-out unless a
  polling property is set) when this version supports fan-out, and polls otherwise;
* ``kclpyspark.<field>`` keys set any ``WorkerConfig`` field by its TOML name, in its units
  (seconds), e.g. ``kclpyspark.lease_store = sqlite:leases.db``; the Java daemon ignores them, so
  one file serves both.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpoint.base.errors import ConfigError
from checkpoint.sequence import InitialPosition, Position
from kclpy_spark.aws import is_aws_host
from kclpy_spark.config import (
    ENV_PREFIX,
    WorkerConfig,
    drop_other_streams,
    environment_values,
    from_mapping,
)
from kclpy_spark.multilang.javaprops import parse_properties, read_properties_file
from kclpy_spark.multilang.kcl_keys import (
    CHAIN_PROVIDERS,
    CREDENTIALS,
    FANOUT_SUPPORTED,
    FIELDS,
    IGNORED_INFO,
    IGNORED_WARNING,
    KCL3_NOTE,
    KNOWN_KEYS,
    SPECIAL,
    STREAM_ARN,
    WORKER_FIELDS,
    as_bool,
    as_int,
    as_seconds,
    done_here,
    polling_keys_set,
)

log = logging.getLogger(__name__)

EXTENSION_PREFIX = "kclpyspark."
# The MultiLangDaemon's default wait for a child to finish after its stdin is closed (the KCL's
# shutdownGraceMillis default for multilang, 5 s); timeoutInSeconds has no default (wait forever).
DEFAULT_CHILD_GRACE = 5.0

__all__ = [
    "DEFAULT_CHILD_GRACE",
    "EXTENSION_PREFIX",
    "FANOUT_SUPPORTED",
    "KNOWN_KEYS",
    "MultiLangSettings",
    "PropertiesConfig",
    "config_from_properties",
    "load_properties",
    "parse_properties",
    "read_properties_file",
]


# --- the result ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiLangSettings:
    """How to run the application's child processes (the MultiLangDaemon's own settings).

    ``timeout``: seconds to wait for each message from a child (``timeoutInSeconds``; None: wait
    forever, the KCL's default). ``shutdown_grace``: seconds a child gets to exit after its stdin
    is closed before it is terminated. ``cwd``: the .properties file's folder, where the command
    runs and relative paths in it are resolved.
    """

    executable_name: str
    cwd: Path
    timeout: float | None = None
    shutdown_grace: float = DEFAULT_CHILD_GRACE
    processing_language: str | None = None
    # callProcessRecordsEvenForEmptyRecordList: processRecords also after each read with none
    empty_record_lists: bool = False


@dataclass(frozen=True)
class PropertiesConfig:
    worker: WorkerConfig
    multilang: MultiLangSettings
    path: Path
    properties: Mapping[str, str]


# --- mapping -------------------------------------------------------------------------------------


def _ignored(key: str, value: str) -> None:
    if key in IGNORED_WARNING and not done_here(key, value):
        log.warning("property %s = %s is ignored: %s", key, value, IGNORED_WARNING[key])
    elif key in IGNORED_INFO or key in IGNORED_WARNING:
        why = IGNORED_INFO.get(key) or IGNORED_WARNING[key]
        log.info("property %s = %s is ignored: %s", key, value, why)


def _unknown(key: str) -> None:
    lowered = {k.lower(): k for k in KNOWN_KEYS}
    hint = lowered.get(key.lower()) or next(
        iter(difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.85)), None
    )
    suggestion = f" (did you mean {hint!r}?)" if hint else ""
    log.warning("unknown property %r is ignored%s", key, suggestion)


def _initial_position(props: Mapping[str, str]) -> InitialPosition | None:
    extended = props.get("initialPositionInStreamExtended")
    plain = props.get("initialPositionInStream")
    if extended:
        seconds = as_int("initialPositionInStreamExtended", extended, low=0)
        if plain and plain.upper() != Position.AT_TIMESTAMP.value:
            log.warning(
                "both initialPositionInStream = %s and initialPositionInStreamExtended are set: "
                "the timestamp wins (AT_TIMESTAMP)",
                plain,
            )
        try:
            return InitialPosition.at_timestamp(float(seconds))
        except (ValueError, OverflowError, OSError):
            raise ConfigError(
                f"property 'initialPositionInStreamExtended' = {extended!r} is not a time: it "
                "takes epoch seconds" + (", not milliseconds" if seconds >= 10**11 else "")
            ) from None
    if not plain:
        return None
    name = plain.upper()
    if name == Position.AT_TIMESTAMP.value:
        raise ConfigError(
            "property 'initialPositionInStream' = AT_TIMESTAMP needs a time: set "
            "'initialPositionInStreamExtended' to the epoch seconds instead"
        )
    if name not in (Position.LATEST.value, Position.TRIM_HORIZON.value):
        raise ConfigError(
            f"property 'initialPositionInStream' must be TRIM_HORIZON or LATEST, got {plain!r}"
        )
    return InitialPosition(Position(name))


def _stream(props: Mapping[str, str], values: dict[str, Any], keys: dict[str, str]) -> None:
    arn, name = props.get("streamArn"), props.get("streamName")
    if arn:
        match = STREAM_ARN.match(arn)
        if match is None:
            raise ConfigError(
                f"property 'streamArn' is not a Kinesis stream ARN "
                f"(arn:<partition>:kinesis:<region>:<account>:stream/<name>): {arn!r}"
            )
        if name and name != match.group(3):
            log.warning("streamArn %s wins over streamName = %s", arn, name)
        region = props.get("regionName")
        if region and region != match.group(1):
            raise ConfigError(
                f"property 'regionName' {region!r} is not the region of 'streamArn' "
                f"({match.group(1)!r}): every call would go to the wrong region"
            )
        values["stream_arn"], keys["stream_arn"] = arn, "streamArn"
        values["stream_name"] = None
    elif name:
        values["stream_name"], keys["stream_name"] = name, "streamName"
    else:
        raise ConfigError("property 'streamName' (or 'streamArn') is required")


def _endpoint(props: Mapping[str, str], values: dict[str, Any], keys: dict[str, str]) -> None:
    kinesis, dynamodb = props.get("kinesisEndpoint"), props.get("dynamoDBEndpoint")
    if kinesis and dynamodb and kinesis.rstrip("/") != dynamodb.rstrip("/"):
        raise ConfigError(
            "properties 'kinesisEndpoint' and 'dynamoDBEndpoint' must name the same endpoint "
            f"(one endpoint_url serves both), got {kinesis!r} and {dynamodb!r}"
        )
    endpoint = kinesis or dynamodb
    if endpoint and not (kinesis and dynamodb) and is_aws_host(endpoint):
        # The KCL sends the other service to its regional endpoint; here one endpoint_url
        # serves both, so an AWS one (a VPC or FIPS endpoint) would get the other's calls.
        given = "kinesisEndpoint" if kinesis else "dynamoDBEndpoint"
        raise ConfigError(
            f"property {given!r} names an AWS endpoint ({endpoint!r}) and the other service's "
            "endpoint is not set: one endpoint serves both Kinesis and DynamoDB here; leave it "
            "out for the regional endpoints"
        )
    if endpoint:
        values["endpoint_url"] = endpoint
        keys["endpoint_url"] = "kinesisEndpoint" if kinesis else "dynamoDBEndpoint"


def _lease_table_region(
    props: Mapping[str, str], values: Mapping[str, Any], environ: Mapping[str, str]
) -> None:
    """``dynamoDBRegionName`` must be the region the worker will use (the lease table is read
    there), as far as the keys set so far (the file's, the environment's, the flags') and the
    SDK's variables say."""
    dynamo_region = props.get("dynamoDBRegionName")
    region = (
        values.get("region")
        or _arn_region(props.get("streamArn"))
        or environ.get("AWS_REGION")
        or environ.get("AWS_DEFAULT_REGION")
    )
    if dynamo_region and region and dynamo_region != region:
        raise ConfigError(
            "property 'dynamoDBRegionName' must equal the stream's region (the lease table is "
            f"read in the stream's region, {region!r}), got {dynamo_region!r}"
        )


def _arn_region(arn: str | None) -> str | None:
    match = STREAM_ARN.match(arn) if arn else None
    return match.group(1) if match else None


def _behaviour_checks(props: Mapping[str, str]) -> None:
    cleanup = props.get("cleanupLeasesUponShardCompletion")
    if cleanup and not as_bool("cleanupLeasesUponShardCompletion", cleanup):
        log.warning(
            "cleanupLeasesUponShardCompletion = false is not supported: finished leases are "
            "deleted once their children have started, as with the KCL's default"
        )
    version = props.get("clientVersionConfig")
    if version and version.upper() != "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X":
        log.warning("property clientVersionConfig = %s is ignored: %s", version, KCL3_NOTE)
    level = props.get("metricsLevel")
    if level and level.upper() != "NONE":
        log.warning("property metricsLevel = %s is ignored: no CloudWatch metrics", level)


def _retrieval(props: Mapping[str, str], values: dict[str, Any], keys: dict[str, str]) -> None:
    """retrievalMode: POLLING, FANOUT, or DEFAULT (the KCL's rule: fan-out unless a polling
    property is set)."""
    given = props.get("retrievalMode")
    mode = (given or "DEFAULT").upper()
    if mode not in ("POLLING", "FANOUT", "DEFAULT"):
        raise ConfigError(
            f"property 'retrievalMode' must be POLLING, FANOUT or DEFAULT, got {given!r}"
        )
    if mode == "DEFAULT":
        polling = polling_keys_set(props)
        mode = "POLLING" if polling else "FANOUT"
        log.info(
            "retrievalMode DEFAULT: %s",
            f"polling, as {polling[0]} is set"
            if polling
            else "enhanced fan-out, as no polling property is set (the KCL's rule)",
        )
    consumer = props.get("consumerName")
    if not FANOUT_SUPPORTED:
        if mode == "FANOUT" and given:
            raise ConfigError(
                "property 'retrievalMode' = FANOUT: enhanced fan-out is not supported by this "
                "version; set retrievalMode = POLLING"
            )
        if mode == "FANOUT":
            log.warning(
                "the KCL would use enhanced fan-out here, which this version does not support: "
                "polling with GetRecords instead (set retrievalMode = POLLING to say so)"
            )
        if consumer:
            log.warning("property consumerName is ignored: records are polled")
        return
    values["retrieval_mode"] = mode.lower()
    keys["retrieval_mode"] = "retrievalMode"
    if consumer and mode == "FANOUT":
        values["consumer_name"], keys["consumer_name"] = consumer, "consumerName"
    elif consumer:
        log.info("property consumerName is not used: records are polled")


def _credentials(key: str, value: str) -> str | None:
    """The profile a credentials provider names (``Class|param|nested=value``, the class maybe
    fully qualified), None for the AWS SDK for Python's default chain. Of a comma-separated
    chain, the first: the KCL asks each in turn and uses the first that answers. A provider the
    default chain does not cover would run the worker as another identity: ConfigError."""
    first, *rest = [e.strip() for e in value.split(",") if e.strip()] or [""]
    for later in rest:  # the KCL falls through to them when the first finds no credentials
        if later.split("|")[0].strip().rsplit(".", 1)[-1] not in CHAIN_PROVIDERS:
            raise ConfigError(
                f"property {key!r}: only the first provider of a chain is used here, and "
                f"{later!r} after it would be another identity: name one provider"
            )
    if rest:
        log.info("%s: the first provider of the chain is used (%s)", key, first)
    provider, *params = [p.strip() for p in first.split("|")]
    name = provider.rsplit(".", 1)[-1]
    named = [p for p in params if "=" not in p]
    if name == "ProfileCredentialsProvider" and named:
        return named[0]
    if name not in CHAIN_PROVIDERS and name != "ProfileCredentialsProvider":
        raise ConfigError(
            f"property {key!r} = {provider!r} is not supported: credentials come from the AWS "
            "SDK for Python's default chain (environment, container and instance roles, web "
            "identity) or a named profile (ProfileCredentialsProvider|<name>; a role to assume "
            "goes in the profile, role_arn and source_profile in ~/.aws/config)"
        )
    log.info("%s = %s: the AWS SDK for Python's default credential chain is used", key, value)
    return None


def _credentials_profile(named: Mapping[str, str | None]) -> str | None:
    """The one profile of the credentials properties (``AwsCredentialsProvider`` and its
    DynamoDB variant, by key): one set of credentials serves both here, so the variant may only
    repeat the main one's. The CloudWatch one serves nothing (no metrics go to CloudWatch)."""
    main = next((p for k, p in named.items() if k.lower() == "awscredentialsprovider"), None)
    for key, profile in named.items():
        if profile != main:

            def said(p: str | None) -> str:
                return "the default chain" if p is None else f"profile {p!r}"

            raise ConfigError(
                f"property {key!r} names {said(profile)} and AwsCredentialsProvider "
                f"{said(main)}: one set of credentials serves every service here (name it in "
                "AwsCredentialsProvider)"
            )
    return main


EMPTY_LISTS = "callProcessRecordsEvenForEmptyRecordList"


def _multilang(props: Mapping[str, str], folder: Path) -> MultiLangSettings:
    executable = props.get("executableName")
    if not executable:
        raise ConfigError(
            "property 'executableName' is required (the command that speaks the MultiLang "
            "protocol, e.g. executableName = sample_kclpy_app.py)"
        )
    timeout = props.get("timeoutInSeconds")
    grace = props.get("shutdownGraceMillis")
    language = props.get("processingLanguage")
    empty = props.get(EMPTY_LISTS)
    if language:
        log.info("processingLanguage = %s (only sent in the user agent by the KCL)", language)
    return MultiLangSettings(
        executable_name=executable,
        cwd=folder,
        timeout=None if not timeout else float(as_int("timeoutInSeconds", timeout)),
        shutdown_grace=DEFAULT_CHILD_GRACE
        if not grace
        else as_seconds("shutdownGraceMillis", grace),
        processing_language=language or None,
        empty_record_lists=as_bool(EMPTY_LISTS, empty) if empty else False,
    )


def _direct_fields(props: Mapping[str, str], values: dict[str, Any], keys: dict[str, str]) -> None:
    """The properties that map onto one WorkerConfig field each; the rest are checked (credential
    providers, ignored and unknown keys) and handled by the caller."""
    credentials: dict[str, str | None] = {}
    for key, value in props.items():
        if key in FIELDS:
            name, convert = FIELDS[key]
            converted = convert(key, value)
            if name in keys and values[name] != converted:  # two names of one key (workerId)
                raise ConfigError(
                    f"properties {keys[name]!r} and {key!r} set the same thing differently "
                    f"({values[name]!r} and {converted!r}): keep one"
                )
            values[name], keys[name] = converted, key
        elif key.startswith(EXTENSION_PREFIX):
            name = key[len(EXTENSION_PREFIX) :]
            if name not in WORKER_FIELDS:
                raise ConfigError(
                    f"property {key!r}: {name!r} is not a kclpy-spark setting "
                    f"(known: {', '.join(sorted(WORKER_FIELDS))})"
                )
        elif CREDENTIALS.match(key) and key.lower().endswith("cloudwatch"):
            log.info("property %s is not used: no metrics are sent to CloudWatch", key)
        elif CREDENTIALS.match(key):
            credentials[key] = _credentials(key, value)
        elif key in IGNORED_INFO or key in IGNORED_WARNING:
            _ignored(key, value)
        elif key not in SPECIAL:
            _unknown(key)
    profile = _credentials_profile(credentials)
    if profile is not None:
        main = next(k for k in credentials if k.lower() == "awscredentialsprovider")
        values["profile"], keys["profile"] = profile, main


def _over_the_file(
    values: dict[str, Any],
    keys: dict[str, str],
    environ: Mapping[str, str],
    overrides: Mapping[str, Any],
) -> None:
    """The environment's ``KCLPY_SPARK_<KEY>`` over the file's keys, then the flags' (a layer
    naming another stream drops the file's stream keys, as over a TOML file)."""
    env = environment_values(environ)
    drop_other_streams(values, env)
    for name, value in env.items():
        values[name], keys[name] = value, f"{ENV_PREFIX}{name.upper()}"
    given = {name: value for name, value in overrides.items() if value is not None}
    drop_other_streams(values, given)
    for name, value in given.items():
        values[name], keys[name] = value, f"--{name.replace('_', '-')}"


def config_from_properties(
    raw: Mapping[str, str],
    *,
    folder: Path,
    source: str = "properties",
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[WorkerConfig, MultiLangSettings]:
    """The worker config and child settings for parsed properties ``raw`` (see the module doc).

    ``environ`` (default: the process's) sets keys by ``KCLPY_SPARK_<KEY>`` over the file, as
    for a TOML file; ``overrides`` are WorkerConfig fields (e.g. from command-line flags) over
    both; None values are skipped. Raises ConfigError naming the property (or field) that is
    wrong.
    """
    environ = os.environ if environ is None else environ
    props = {k: v.strip() for k, v in raw.items() if v.strip()}
    if "applicationName" not in props:
        # As the MultiLangDaemon: without it, apps on different streams would share a lease table
        # (and, in one stream's table, their shards' leases).
        raise ConfigError("property 'applicationName' is required (it names the lease table)")
    values: dict[str, Any] = {"lease_store": "dynamodb"}
    keys: dict[str, str] = {}  # WorkerConfig field -> the property that set it
    _direct_fields(props, values, keys)
    table = props.get("tableName")
    if table:
        # Our application name only names the lease table; the KCL also names its metrics and
        # its 3.x workers' tables (<applicationName>-WorkerMetricStats...) by the application.
        values["application_name"], keys["application_name"] = table, "tableName"
        if table != props["applicationName"]:
            values["kcl_application_name"] = props["applicationName"]
            keys["kcl_application_name"] = "applicationName"
    _stream(props, values, keys)
    _endpoint(props, values, keys)
    position = _initial_position(props)
    if position is not None:
        values["initial_position"] = position
        extended = "initialPositionInStreamExtended" in props
        keys["initial_position"] = f"initialPositionInStream{'Extended' if extended else ''}"
    _behaviour_checks(props)
    _retrieval(props, values, keys)
    if values.get("retrieval_mode") == "fanout" and "consumer_name" not in values:
        # The KCL names its fan-out consumer after applicationName, whatever tableName says.
        values["consumer_name"] = props["applicationName"]
        keys["consumer_name"] = "applicationName"
    settings = _multilang(props, folder)
    for key, value in props.items():
        if key.startswith(EXTENSION_PREFIX):
            name = key[len(EXTENSION_PREFIX) :]
            values[name], keys[name] = value, key
    _over_the_file(values, keys, environ, overrides or {})
    _lease_table_region(props, values, environ)
    try:
        return from_mapping(values, source=source), settings
    except ConfigError as exc:
        message = str(exc)
        culprits = [key for name, key in keys.items() if f"'{name}'" in message]
        if culprits:
            raise ConfigError(f"{message} (from property {culprits[0]!r})") from None
        raise


def load_properties(
    path: str | Path, *, overrides: Mapping[str, Any] | None = None
) -> PropertiesConfig:
    """Read and map a .properties file; ConfigError naming the key for anything unusable."""
    p = Path(path).resolve()
    raw = read_properties_file(p)
    worker, settings = config_from_properties(
        raw, folder=p.parent, source=str(p), overrides=overrides
    )
    return PropertiesConfig(worker, settings, p, raw)
