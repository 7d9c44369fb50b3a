"""The MultiLangDaemon's .properties keys: which WorkerConfig field each sets, which are read
with rules of their own, and which are known but ignored (with why), plus the value converters.
Every converter raises ConfigError naming the key."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from checkpoint.base.errors import ConfigError
from kclpy_spark.config import WorkerConfig

log = logging.getLogger(__name__)

# --- values --------------------------------------------------------------------------------------

_TRUE = {"true", "yes", "y", "on", "1"}  # commons-beanutils' BooleanConverter
_FALSE = {"false", "no", "n", "off", "0"}


def as_bool(key: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"property {key!r} must be true or false, got {value!r}")


JAVA_LONG_MAX = 2**63 - 1  # the KCL's largest number; a longer one overflowed float()


def as_int(key: str, value: str, *, low: int = 1, high: int = JAVA_LONG_MAX) -> int:
    if not re.fullmatch(r"[+-]?\d{1,30}", value):
        raise ConfigError(f"property {key!r} must be a whole number, got {value[:40]!r}")
    number = int(value)
    if number < low or number > high:
        bounds = (
            f">= {low}" if number < low and high == JAVA_LONG_MAX else f"between {low} and {high}"
        )
        raise ConfigError(f"property {key!r} must be {bounds}, got {number}")
    return number


def as_seconds(key: str, value: str) -> float:
    """A ``...Millis`` property as seconds: the one place milliseconds are converted."""
    return as_int(key, value) / 1000.0


def _idle_seconds(key: str, value: str) -> float:
    """``idleTimeBetweenReadsInMillis``: as the KCL, a value below the least is raised to it with
    a warning (the KCL's least is larger; reads are paced by the shard's limits either way)."""
    millis = as_int(key, value, low=0)
    if millis < 1:
        log.warning("property %s = %d: raised to 1 ms (the least this takes)", key, millis)
        millis = 1
    return millis / 1000.0


STREAM_ARN = re.compile(r"^arn:[\w-]+:kinesis:([\w-]+):(\d{12}):stream/([a-zA-Z0-9_.-]{1,128})$")


# --- the keys ------------------------------------------------------------------------------------

# KCL key -> (WorkerConfig field, converter). Durations become seconds.
FIELDS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "applicationName": ("application_name", lambda k, v: v),
    "regionName": ("region", lambda k, v: v),
    "workerId": ("worker_id", lambda k, v: v),
    "workerIdentifier": ("worker_id", lambda k, v: v),  # the KCL's own name; workerId sets it
    "failoverTimeMillis": ("failover_time", as_seconds),
    "maxRecords": ("max_records", lambda k, v: as_int(k, v, high=10_000)),
    "idleTimeBetweenReadsInMillis": ("idle_time_between_reads", lambda k, v: _idle_seconds(k, v)),
    "shardSyncIntervalMillis": ("shard_sync_interval", as_seconds),
    "parentShardPollIntervalMillis": ("parent_shard_poll_interval", as_seconds),
    "maxLeasesForWorker": ("max_leases_for_worker", as_int),
    "maxLeasesToStealAtOneTime": ("max_leases_to_steal", as_int),
    "ignoreUnexpectedChildShards": ("ignore_unexpected_child_shards", as_bool),
    "shutdownGraceMillis": ("shutdown_grace", as_seconds),
    "isGracefulLeaseHandoffEnabled": ("graceful_handoff", as_bool),
    "gracefulLeaseHandoffTimeoutMillis": ("handoff_timeout", as_seconds),
}

# Keys read below with their own rules.
SPECIAL = frozenset(
    {
        "executableName",
        "timeoutInSeconds",
        "processingLanguage",
        "streamName",
        "streamArn",
        "tableName",
        "initialPositionInStream",
        "initialPositionInStreamExtended",
        "kinesisEndpoint",
        "dynamoDBEndpoint",
        "dynamoDBRegionName",
        "retrievalMode",
        "callProcessRecordsEvenForEmptyRecordList",
        "cleanupLeasesUponShardCompletion",
        "clientVersionConfig",
        "metricsLevel",
        "consumerName",
    }
)

_NO_EFFECT = "not needed here"
_NO_KCL3_TABLES = "no coordinator state or worker metrics entities are written, none to migrate"
_MADE_PLAIN = (
    "the lease table is made without deletion protection or point-in-time recovery: turn them on "
    "on the table itself (update-table, update-continuous-backups)"
)
# Known keys we ignore, with why. WARNING: ignoring it changes what the application gets.
IGNORED_INFO: dict[str, str] = {
    "maxActiveThreads": "processors run on one asyncio loop; no thread pool to size",
    "maxLeaseRenewalThreads": "renewals run on a pool of their own (at most 20 threads)",
    "validateSequenceNumberBeforeCheckpointing": (
        "checkpoints are always validated against [last checkpoint, last record delivered]"
    ),
    "taskBackoffTimeMillis": "failed batches back off with jitter (max_processing_attempts)",
    "listShardsBackoffTimeInMillis": _NO_EFFECT,
    "maxListShardsRetryAttempts": _NO_EFFECT,
    "schedulerInitializationBackoffTimeMillis": _NO_EFFECT,
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "shard sync runs on the elected leader",
    "logWarningForTaskAfterMillis": _NO_EFFECT,
    "initialLeaseTableReadCapacity": "the lease table is created on demand (PAY_PER_REQUEST)",
    "initialLeaseTableWriteCapacity": "the lease table is created on demand (PAY_PER_REQUEST)",
    "retryGetRecordsInSeconds": _NO_EFFECT,
    "maxGetRecordsThreadPool": _NO_EFFECT,
    "shardPrioritization": "leases are taken by the KCL 2.x taker's priorities",
    "enablePriorityLeaseAssignment": "leases are taken by the KCL 2.x taker's priorities",
    "cloudWatchRegionName": "no CloudWatch metrics are published",
    "metricsBufferTimeMillis": "no CloudWatch metrics are published",
    "metricsMaxQueueSize": "no CloudWatch metrics are published",
    "metricsEnabledDimensions": "no CloudWatch metrics are published",
    "leaseTableScanTotalSegments": "the lease table is scanned as one segment",
    "migrateAllEntitiesToLeaseTable": _NO_KCL3_TABLES,
    "tableMigrationCompleteBakeTimeSeconds": _NO_KCL3_TABLES,
}
KCL3_NOTE = (
    "KCL 3.x's lease assignment settings are not read: lease_assignment (auto by default) "
    "assigns and balances by kclpy-spark's own rules (lease counts, throughput, CPU), and no "
    "worker metrics table is written"
)
_FANOUT = "fan-out is configured by retrievalMode and consumerName only"
IGNORED_WARNING: dict[str, str] = {
    **dict.fromkeys(
        [
            "coordinatorStateTableName",
            "coordinatorStateBillingMode",
            "coordinatorStateReadCapacity",
            "coordinatorStateWriteCapacity",
            "coordinatorStatePointInTimeRecoveryEnabled",
            "coordinatorStateDeletionProtectionEnabled",
            "coordinatorStateTags",
            "workerMetricsTableName",
            "workerMetricsBillingMode",
            "workerMetricsReadCapacity",
            "workerMetricsWriteCapacity",
            "workerMetricsPointInTimeRecoveryEnabled",
            "workerMetricsDeletionProtectionEnabled",
            "workerMetricsTags",
            "inMemoryWorkerMetricsCaptureFrequencyMillis",
            "workerMetricsReporterFreqInMillis",
            "noOfPersistedMetricsPerWorkerMetrics",
            "disableWorkerMetrics",
            "maxThroughputPerHostKBps",
            "dampeningPercentage",
            "reBalanceThresholdPercentage",
            "allowThroughputOvershoot",
            "varianceBalancingFrequency",
            "workerMetricsEMAAlpha",
            "staleWorkerMetricsEntryCleanupDuration",
            "leaseAssignmentIntervalMillis",
        ],
        KCL3_NOTE,
    ),
    **dict.fromkeys(
        [
            "consumerArn",
            "maxDescribeStreamSummaryRetries",
            "maxDescribeStreamConsumerRetries",
            "registerStreamConsumerRetries",
            "retryBackoffMillis",
        ],
        _FANOUT,
    ),
    "leaseTableDeletionProtectionEnabled": _MADE_PLAIN,
    "leaseTablePitrEnabled": _MADE_PLAIN,
    "millisBehindLatestThresholdForReducedTps": (
        "a read within idle_time_between_reads of the shard's tip waits "
        "idleTimeBetweenReadsInMillis before the next; set that instead"
    ),
}
# Ignored keys set to what this project does anyway (the KCL's defaults): said at INFO only.
AS_DONE_HERE: dict[str, str] = {
    **dict.fromkeys(
        [
            "leaseTableDeletionProtectionEnabled",
            "leaseTablePitrEnabled",
            "coordinatorStatePointInTimeRecoveryEnabled",
            "coordinatorStateDeletionProtectionEnabled",
            "workerMetricsPointInTimeRecoveryEnabled",
            "workerMetricsDeletionProtectionEnabled",
        ],
        "false",
    ),
    "millisBehindLatestThresholdForReducedTps": "0",
}


def _java_zero(value: str) -> bool:
    """A Java number property that reads as 0 ("0", "00", "+0")."""
    return re.fullmatch(r"\s*[+-]?0+\s*", value) is not None


def done_here(key: str, value: str) -> bool:
    """Whether an ignored key is set to what this project does anyway."""
    default = AS_DONE_HERE.get(key)
    if default == "0":
        return _java_zero(value)
    return default is not None and value.strip().lower() == default


CREDENTIALS = re.compile(r"^awscredentialsprovider(dynamodb|cloudwatch)?$", re.IGNORECASE)
DEFAULT_PROVIDERS = {"DefaultCredentialsProvider", "DefaultAWSCredentialsProviderChain"}
# Providers whose source the AWS SDK for Python's default chain reads as well.
CHAIN_PROVIDERS = {
    *DEFAULT_PROVIDERS,
    "EnvironmentVariableCredentialsProvider",
    "ContainerCredentialsProvider",
    "EC2ContainerCredentialsProviderWrapper",
    "InstanceProfileCredentialsProvider",
    "WebIdentityTokenFileCredentialsProvider",
    "WebIdentityTokenCredentialsProvider",  # SDK v1's name
}
# PollingConfigBean's keys: with any of them set, the KCL's DEFAULT retrieval mode is polling.
POLLING_KEYS = (
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "retryGetRecordsInSeconds",
    "maxGetRecordsThreadPool",
    "millisBehindLatestThresholdForReducedTps",
)
# Those the bean holds as Java numbers, not objects: 0 is as if not set.
_PRIMITIVE_POLLING_KEYS = frozenset(
    {"maxRecords", "idleTimeBetweenReadsInMillis", "millisBehindLatestThresholdForReducedTps"}
)


def polling_keys_set(props: Mapping[str, str]) -> list[str]:
    """The polling keys set, as PollingConfigBean.anyPropertiesSet counts them."""
    return [
        key
        for key in POLLING_KEYS
        if props.get(key) and not (key in _PRIMITIVE_POLLING_KEYS and _java_zero(props[key]))
    ]


KNOWN_KEYS = frozenset(FIELDS) | SPECIAL | frozenset(IGNORED_INFO) | frozenset(IGNORED_WARNING)
WORKER_FIELDS = frozenset(f.name for f in fields(WorkerConfig))
# Enhanced fan-out is used when this WorkerConfig can express it.
FANOUT_SUPPORTED = "retrieval_mode" in WORKER_FIELDS
