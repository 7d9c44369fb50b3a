"""The demo: a stream on a local endpoint, a producer, and workers reading it."""

from __future__ import annotations

from typing import Any

from checkpoint.base.errors import map_aws_error


def create_demo_stream(kinesis: Any, stream: str, shards: int, endpoint: str) -> None:
    """Create ``stream`` and wait until it is active; an endpoint that is down or refuses is one
    line (a KclpySparkError), not botocore's traceback."""
    try:
        kinesis.create_stream(StreamName=stream, ShardCount=shards)
        kinesis.get_waiter("stream_exists").wait(
            StreamName=stream, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
        )
    except Exception as exc:  # botocore's errors: mapped to one line naming the endpoint
        raise map_aws_error(exc, f"creating the demo stream {stream} on {endpoint}") from None
