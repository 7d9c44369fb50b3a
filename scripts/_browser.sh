# Sourced by scripts/test.sh: the status page's browser test drives Debian's chromium through its
# chromedriver. Installed with apt when this runs as root; otherwise that one test is skipped.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  mkdir -p "$ROOT/.cache"
  APTLOG="$ROOT/.cache/apt-chromium.log"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "kclpy-spark: installing chromium and chromium-driver for the status page's browser test (log: .cache/apt-chromium.log)" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get install -y -q chromium chromium-driver \
           || { apt-get update -q && apt-get install -y -q chromium chromium-driver; }; } >"$APTLOG" 2>&1; then
      echo "kclpy-spark: could not install chromium (.cache/apt-chromium.log); the browser test is skipped" >&2
    fi
  else
    echo "kclpy-spark: chromium and chromedriver not found (not root: not installed); the browser test is skipped" >&2
  fi
fi
