# Sourced by the README's commands: checks the prerequisites and makes the project's virtualenv.
# One line per missing prerequisite, never a stack trace.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

die() { echo "kclpy-spark: $*" >&2; exit 2; }

PY311="${KCLPY_SPARK_PYTHON:-}"
if [ -z "$PY311" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      PY311="$(command -v "$cand")"; break
    fi
  done
fi
[ -n "$PY311" ] || die "Python 3.11 is required: install it (e.g. 'pyenv install 3.11') or set KCLPY_SPARK_PYTHON"
command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || die "Java 17 is required for Spark and DynamoDB Local: install a JDK 17 (e.g. 'apt-get install openjdk-17-jdk-headless')"

VENV="$ROOT/.venv"
STAMP="$VENV/.kclpy-spark-installed"
WANT="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "kclpy-spark: creating the virtualenv in .venv (first run downloads pyspark; a few minutes)" >&2
  "$PY311" -m venv "$VENV" || die "could not create a virtualenv with $PY311 (is the venv module installed?)"
fi
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  mkdir -p "$ROOT/.cache"
  LOG="$ROOT/.cache/pip-install.log"
  echo "kclpy-spark: installing kclpy-spark and its dependencies into .venv (log: .cache/pip-install.log)" >&2
  # pip compiles every file it installs (half of this step's minute): keep it. Where
  # PYTHONDONTWRITEBYTECODE is set (some CI images set it), nothing compiled later is kept; every process
  # would compile pyspark's and botocore's modules again (--no-compile made the suite 25% slower).
  if ! { "$VENV/bin/python" -m pip install --upgrade pip && "$VENV/bin/python" -m pip install -e ".[dev]"; } >"$LOG" 2>&1; then
    die "pip install failed; the last lines of .cache/pip-install.log say: $(tail -n 3 "$LOG" | tr '\n' ' ')"
  fi
  echo "$WANT" > "$STAMP"
fi
# The project's own modules compiled too (an editable install leaves them as sources): where
# PYTHONDONTWRITEBYTECODE is set, every process (each daemon, CLI call and Spark Python worker)
# would compile them again, about 0.3 s of CPU each. compileall rewrites only what changed.
"$VENV/bin/python" -m compileall -q -j 0 kclpy_spark checkpoint shard_sync bench tests >/dev/null 2>&1 || true
export PATH="$VENV/bin:$PATH"
export PYSPARK_PYTHON="$VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
