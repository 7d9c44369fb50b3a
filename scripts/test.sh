#!/usr/bin/env bash
# The whole test suite: makes .venv, installs LocalStack (cached), runs pytest.
# The session fixture starts LocalStack (or uses LOCALSTACK_ENDPOINT) and stops it at the end.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not integration and not spark"`.
# Three test processes (pytest-xdist, one test file each at a time): most tests wait on leases and
# timers, not on the CPU; at most two run a CPU-heavy file at once (tests/conftest.py, CPU_HEAVY).
# KCLPY_SPARK_TEST_WORKERS=0 runs everything in one process.
# Test JVMs start cheaper: scripts/_test_jvm.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# What the project's own install does not need runs beside it (a fresh machine's minute or two;
# nothing once installed): LocalStack's install (its own virtualenv and npm packages), and apt's
# chromium and promtool for two tests. Each is waited for before pytest starts.
BESIDE=()  # each its own process group (set -m): a failure or Ctrl-C stops its pip, npm or apt too
trap 'for pid in "${BESIDE[@]}"; do kill -- "-$pid" 2>/dev/null || true; done' EXIT
set -m
if LSCTL_PYTHON="$(command -v python3)" && "$LSCTL_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 8))'; then
  "$LSCTL_PYTHON" "$ROOT/localstack/lsctl.py" install & BESIDE+=($!)
else
  LSCTL_PYTHON=""
fi
(source "$ROOT/scripts/_browser.sh"; source "$ROOT/scripts/_promtool.sh") & BESIDE+=($!)
set +m
source "$ROOT/scripts/_venv.sh"
source "$ROOT/scripts/_test_jvm.sh"
for pid in "${BESIDE[@]}"; do
  wait "$pid" || { echo "kclpy-spark: an install step failed (its lines above)" >&2; exit 2; }
done
trap - EXIT
[ -n "$LSCTL_PYTHON" ] || python localstack/lsctl.py install
# Files in the order tests/conftest.py gives them (xdist would sort them by test count).
exec python -m pytest -n "${KCLPY_SPARK_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
