# Sourced by scripts/test.sh: the metric-name test runs `promtool check metrics` from Debian's
# prometheus package (no service is started: the package only lays down its files). Installed
# with apt when this runs as root; otherwise that one test is skipped.
if ! command -v promtool >/dev/null 2>&1; then
  mkdir -p "$ROOT/.cache"
  APTLOG="$ROOT/.cache/apt-prometheus.log"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "kclpy-spark: installing Debian's prometheus for promtool (log: .cache/apt-prometheus.log)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get install -y -q --no-install-recommends prometheus \
           || { apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; }; } >"$APTLOG" 2>&1; then
      echo "kclpy-spark: could not install prometheus (.cache/apt-prometheus.log); the promtool test fails" >&2
    fi
  else
    echo "kclpy-spark: promtool not found (not root: not installed); the promtool test is skipped" >&2
  fi
fi
