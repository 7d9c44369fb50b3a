#!/usr/bin/env bash
# The whole test suite: makes .venv, installs LocalStack (cached), runs pytest.
# The session fixture starts LocalStack (or uses LOCALSTACK_ENDPOINT) and stops it at the end.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not integration and not spark"`.
# Three test processes (pytest-xdist, one test file each at a time): most tests wait on leases and
# timers, not on the CPU; at most two run a CPU-heavy file at once (tests/conftest.py, CPU_HEAVY).
# KCLPY_SPARK_TEST_WORKERS=0 runs everything in one process.
# Test JVMs start cheaper: scripts/_test_jvm.sh.
source "$(dirname "$0")/_venv.sh"
python localstack/lsctl.py install
source "$ROOT/scripts/_browser.sh"
source "$ROOT/scripts/_promtool.sh"
source "$ROOT/scripts/_test_jvm.sh"
exec python -m pytest -n "${KCLPY_SPARK_TEST_WORKERS:-3}" --dist loadfile "$@"
