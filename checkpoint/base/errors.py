"""The one exception root of kclpy-spark, and the one place AWS error codes are mapped to it.

Losing a race (a conditional write whose condition no longer holds) is never an exception here: the
port methods return whether they won. Exceptions are for infrastructure failures and bad input, and
each class says with ``retriable`` whether trying the same call again may succeed.
"""

from __future__ import annotations

from typing import Any, ClassVar


class KclpySparkError(Exception):
    """Root of every error kclpy-spark raises on purpose."""

    retriable: ClassVar[bool] = False
    # Set by a lease store on the error of a counter-moving write that may have been applied
    # before it failed (a timeout): the write's stamp (a checkpoint.lease.WriteStamp), by which
    # its writer can tell later whether the lease as stored is that write (LeaseHolder).
    sent_stamp: object | None = None


class ConfigError(KclpySparkError):
    """The configuration is invalid; the message names the setting."""


class DependencyError(KclpySparkError):
    """An AWS service (or the embedded store) failed in a way a retry may fix."""

    retriable = True


class ThrottledError(DependencyError):
    """The service asked us to slow down (ProvisionedThroughputExceeded, ThrottlingException...)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class MalformedAnswerError(DependencyError):
    """A 200 answer without the fields its call returns (``{}``, an HTML page from a proxy or a
    captive portal): retried like a dependency that failed, never read as an empty result."""


class ResourceNotFoundError(KclpySparkError):
    """A stream or table does not exist (and we were not allowed to create it)."""

    # The missing table's name, where a lease store knows it (the lease table or the
    # coordination table beside it), so a report names the right one.
    resource: str | None = None


class InvalidStateError(KclpySparkError):
    """Stored state is not what the code can work with: a corrupt lease item, a wrong key schema."""


class CorruptLeaseError(InvalidStateError):
    """A lease item lacks a required attribute or has one of the wrong type."""

    def __init__(self, lease_key: str, problem: str) -> None:
        super().__init__(f"lease {lease_key!r} is corrupt: {problem}")
        self.lease_key = lease_key
        self.problem = problem


class CheckpointRegressionError(KclpySparkError):
    """A checkpoint write would move a lease's checkpoint backwards. Nothing was written: a stored
    checkpoint only ever moves forward (resets use ``update_lease`` on purpose)."""


class AccessError(KclpySparkError):
    """The credentials are missing, wrong, expired, or not allowed to do this."""


class RequestError(KclpySparkError):
    """AWS rejected the request as invalid (a 4xx that is none of the above)."""


_ACCESS_CODES = frozenset(
    {
        "AccessDeniedException",
        "AccessDenied",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "MissingAuthenticationToken",
    }
)

# AWS error codes whose meaning is "slow down and try again".
_THROTTLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TooManyRequestsException",
    }
)
# Codes that a retry may fix but that are not throttling.
_TRANSIENT_CODES = frozenset(
    {
        "InternalServerError",
        "InternalFailure",
        "InternalFailureException",  # SubscribeToShard's event stream
        "ServiceUnavailable",
        "ResourceInUseException",
        "KMSThrottlingException",
        "TransactionInProgressException",
    }
)


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ClientError (or None for anything else)."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


def is_throttling(exc: BaseException) -> bool:
    """Whether ``exc`` is AWS asking us to slow down (ProvisionedThroughputExceeded, ...)."""
    return error_code(exc) in _THROTTLE_CODES


def _plain_http_behind_https(exc: BaseException) -> bool:
    """A TLS handshake answered by a plain-HTTP server (OpenSSL's "wrong version number"): no
    retry changes that, where other TLS failures may pass."""
    seen: BaseException | None = exc
    for _ in range(8):  # botocore and aiohttp wrap the ssl error a few levels deep
        if seen is None:
            return False
        if "WRONG_VERSION_NUMBER" in str(seen) or "wrong version number" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


# An error's text in a message and a log line: one line, and not a whole HTML page a proxy or a
# wrong port answered with.
BRIEF_CHARS = 300


def brief(text: str) -> str:
    """``text`` on one line, cut to BRIEF_CHARS."""
    text = " ".join(text.split())
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 3] + "..."


def _no_credentials(exc: BaseException) -> bool:
    """botocore found no credentials anywhere in its chain: no retry finds them."""
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:  # pragma: no cover - botocore comes with boto3
        return False
    return isinstance(exc, NoCredentialsError | PartialCredentialsError)


def _refused_before_sending(exc: BaseException) -> bool:
    """botocore's own check of the request's parameters failed (a wrong type, a value out of
    range): the request never left the client."""
    try:
        from botocore.exceptions import ParamValidationError
    except ImportError:  # pragma: no cover - botocore comes with boto3
        return False
    return isinstance(exc, ParamValidationError)


def map_aws_error(exc: BaseException, what: str) -> KclpySparkError:
    """Translate a botocore/aiobotocore exception into this package's hierarchy.

    ``what`` names the call and resource (``"UpdateItem on table 'app'"``); it leads the message.
    Connection problems (no response at all) are retriable dependency errors.
    """
    code = error_code(exc)
    message = f"{what}: {brief(str(exc))}"
    if _no_credentials(exc):
        return AccessError(
            f"{what}: no AWS credentials found (environment, profile, container or instance "
            "role); configure some, or a profile with --profile"
        )
    if code in _THROTTLE_CODES:
        return ThrottledError(message)
    if code == "ResourceNotFoundException":
        return ResourceNotFoundError(message)
    if code in _TRANSIENT_CODES:
        return DependencyError(message)
    if code is None and _plain_http_behind_https(exc):
        return RequestError(
            f"{what}: the endpoint answered in plain HTTP where TLS was expected: use an http:// "
            "endpoint_url for it (or the port that serves HTTPS)"
        )
    if code is None and _refused_before_sending(exc):
        return RequestError(message)  # never sent: no retry changes it, and nothing landed
    if code is None:
        # EndpointConnectionError, ReadTimeoutError, ConnectionClosedError...: no answer at all.
        return DependencyError(message)
    if code in {"ValidationException", "SerializationException"}:
        return InvalidStateError(message)
    if code in _ACCESS_CODES:
        return AccessError(message)
    status = _http_status(exc)
    if (status is not None and 400 <= status < 500) or (status is None and _in_event_stream(exc)):
        # Any other client error: the request itself is wrong, sending it again will not help.
        # An error event of a stream (SubscribeToShard's KMS errors) has a code and no status.
        return RequestError(message)
    return DependencyError(message)


def _in_event_stream(exc: BaseException) -> bool:
    try:
        from botocore.exceptions import EventStreamError
    except ImportError:  # pragma: no cover - botocore comes with boto3
        return False
    return isinstance(exc, EventStreamError)


def _http_status(exc: BaseException) -> int | None:
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None
