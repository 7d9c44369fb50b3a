"""How botocore's errors map onto the package's error root (table-driven, no network)."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from checkpoint.base.errors import (
    BRIEF_CHARS,
    AccessError,
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
        # Retried ~30 s with a WARNING a try before the one-line error: no retry finds them.
        (NoCredentialsError(), AccessError, False),
    ],
)
def test_botocore_errors_map_to_the_error_root(
    error: Exception, kind: type[KclpySparkError], retriable: bool
) -> None:
    mapped = map_aws_error(error, "UpdateItem on table 'app'")
    assert type(mapped) is kind
    assert mapped.retriable is retriable
    assert str(mapped).startswith("UpdateItem on table 'app': ")


def test_a_whole_html_page_in_an_answer_becomes_one_short_line() -> None:
    """A proxy or a wrong port answering a 501 page put its 13 lines into every retry's WARNING
    and into the final one-line error."""
    page = "<html>\n<head><title>Error</title></head>\n" + "<p>Unsupported method</p>\n" * 40
    mapped = map_aws_error(client_error(page, 501), "GetRecords on shard 'x'")
    text = str(mapped)
    assert "\n" not in text and len(text) <= len("GetRecords on shard 'x': ") + BRIEF_CHARS
