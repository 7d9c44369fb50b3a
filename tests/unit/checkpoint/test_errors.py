"""How botocore's errors map onto the package's error root (table-driven, no network)."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    ParamValidationError,
    ReadTimeoutError,
)

from checkpoint.base.errors import (
    DependencyError,
    InvalidStateError,
    KclpySparkError,
    RequestError,
    ResourceNotFoundError,
    ThrottledError,
    map_aws_error,
)


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "UpdateItem",
    )


@pytest.mark.parametrize(
    ("error", "kind", "retriable"),
    [
        # Checked by botocore before sending: it never left the client (it was a retriable
        # dependency error, retried to the deadline and judged a write that may have landed).
        (ParamValidationError(report="Invalid type for parameter Limit"), RequestError, False),
        (EndpointConnectionError(endpoint_url="http://x"), DependencyError, True),
        (ReadTimeoutError(endpoint_url="http://x"), DependencyError, True),
        (client_error("ProvisionedThroughputExceededException"), ThrottledError, True),
        (client_error("ResourceNotFoundException"), ResourceNotFoundError, False),
        (client_error("ValidationException"), InvalidStateError, False),
        (client_error("SomethingNewException"), RequestError, False),
        (client_error("InternalServerError", 500), DependencyError, True),
    ],
)
def test_botocore_errors_map_to_the_error_root(
    error: Exception, kind: type[KclpySparkError], retriable: bool
) -> None:
    mapped = map_aws_error(error, "UpdateItem on table 'app'")
    assert type(mapped) is kind
    assert mapped.retriable is retriable
    assert str(mapped).startswith("UpdateItem on table 'app': ")
