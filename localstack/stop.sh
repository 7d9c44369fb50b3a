#!/usr/bin/env bash
# Stops the LocalStack started by start.sh / lsctl.py start (ok if not running).
exec python3 "$(dirname "$0")/lsctl.py" stop "$@"
