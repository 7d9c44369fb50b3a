#!/usr/bin/env bash
# Starts LocalStack (Kinesis + DynamoDB) if needed; prints its endpoint URL last.
exec python3 "$(dirname "$0")/lsctl.py" start "$@"
