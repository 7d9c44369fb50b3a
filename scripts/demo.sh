#!/usr/bin/env bash
# The main job: starts a local Kinesis/DynamoDB endpoint (LocalStack) and runs the consumer demo
# on the embedded defaults. Extra arguments go to `kclpy-spark demo`.
source "$(dirname "$0")/_venv.sh"
ENDPOINT="$(python localstack/lsctl.py start | tail -n 1)"
exec kclpy-spark demo --endpoint "$ENDPOINT" "$@"
