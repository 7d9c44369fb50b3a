"""The status page in a real headless browser (Debian's chromium through its chromedriver): real
worker processes on LocalStack (DynamoDB lease table), the page served by a worker and by
``kclpy-spark status --serve``; leases, owners, the shard graph and the lag chart appear, and
change when a lease moves to a second worker. Nothing served can change state.

A screenshot of each page is saved under .cache/test-artifacts/.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from worker_procs import REPO, fleet, free_port, produce, wait_active, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = REPO / ".cache" / "test-artifacts"

_BROWSER = Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()
# As root, scripts/test.sh installs them: their absence then is a failure, not a skip (the page
# would go untested in CI without a word).
pytestmark = pytest.mark.skipif(
    not _BROWSER and os.geteuid() != 0,
    reason="chromium and chromedriver are not installed (scripts/test.sh installs them with apt "
    "when it runs as root)",
)


@pytest.fixture(autouse=True)
def _browser_installed() -> None:
    if not _BROWSER:
        pytest.fail("chromium and chromedriver are not installed: scripts/test.sh installs them")


def _status_json(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=10) as resp:
        parsed: dict[str, Any] = json.loads(resp.read())
        return parsed


def _reachable(port: int) -> bool:
    try:
        _status_json(port)
        return True
    except OSError:
        return False


def _method(port: int, path: str, method: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"{}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1800",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _rows(driver: Any) -> dict[str, str]:
    """lease key -> owner, as the page's lease table shows them: read in one script, so a
    re-render of the table between finding a row and reading it cannot leave a stale row."""
    pairs = driver.execute_script(
        "return Array.from(document.querySelectorAll('#leases tbody tr[data-lease]'),"
        " r => [r.dataset.lease, r.dataset.owner]);"
    )
    return {lease: owner for lease, owner in pairs}


def _text(driver: Any, selector: str, attribute: str = "innerText") -> str:
    """The first match's text (or another property), read in one script (no stale element)."""
    script = "const e = document.querySelector(arguments[0]); return e ? e[arguments[1]] : null;"
    value = driver.execute_script(script, selector, attribute)
    assert value is not None, f"nothing on the page matches {selector!r}"
    return str(value)


def _count(driver: Any, selector: str) -> int:
    from selenium.webdriver.common.by import By

    return len(driver.find_elements(By.CSS_SELECTOR, selector))


def _page_shows(driver: Any, what: str, check: Callable[[], bool], timeout: float) -> None:
    try:
        wait_for(f"the page to show {what}", check, timeout=timeout, step=1.0)
    except AssertionError as exc:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "status-page-failed.png"))
        shown = _text(driver, "body")
        console = [e.get("message") for e in driver.get_log("browser")]
        raise AssertionError(f"{exc}\npage text:\n{shown}\nconsole: {console}") from None


def _read_only(driver: Any, port: int) -> None:
    """Nothing on the page can act, and no route takes anything but GET."""
    assert _count(driver, "form, button, input, select, textarea") == 0
    for path in ("/", "/status", "/status.json"):
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert _method(port, path, method) == 405, (method, path)


def _producer(kinesis: Any, stream: str, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        n = 0
        while not stop.wait(0.5):
            produce(kinesis, stream, range(n, n + 10))
            n += 10

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_status_page_shows_leases_and_follows_a_lease_move(
    kinesis_client: Any, localstack_endpoint: str, unique_name: str, tmp_path: Path, browser: Any
) -> None:
    name = unique_name
    kinesis_client.create_stream(StreamName=name, ShardCount=2)
    wait_active(kinesis_client, name)
    config = f"""
application_name = "{name}"
stream_name = "{name}"
endpoint_url = "{localstack_endpoint}"
initial_position = "TRIM_HORIZON"
lease_store = "dynamodb"
processor = "kclpy_spark.demo.samples:JsonLinesProcessor"
failover_time = 3.0
idle_time_between_reads = 0.3
"""
    stop = threading.Event()
    producer = _producer(kinesis_client, name, stop)
    port = free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with fleet(tmp_path, config, tmp_path / "out") as workers:
            workers.start("page-a", "--metrics-port", str(port))
            wait_for("worker a's page", lambda: _reachable(port), timeout=60)
            browser.get(f"http://127.0.0.1:{port}/")
            _page_shows(browser, "both leases held by page-a",
                        lambda: set(_rows(browser).values()) == {"page-a"}
                        and len(_rows(browser)) == 2, timeout=60)  # fmt: skip
            _page_shows(browser, "the lag chart and the shard graph",
                        lambda: _count(browser, "#lag-chart [data-lease]") >= 2
                        and _count(browser, "#graph g.node") == 2, timeout=30)  # fmt: skip
            assert "page-a" in _text(browser, "#workers tbody")
            _read_only(browser, port)
            browser.save_screenshot(str(ARTIFACTS / "status-page-one-worker.png"))

            # A second worker joins: balancing moves one lease, and the page follows.
            workers.start("page-b")
            _page_shows(browser, "one lease moved to page-b",
                        lambda: sorted(_rows(browser).values()) == ["page-a", "page-b"],
                        timeout=90)  # fmt: skip
            _page_shows(browser, "the move (a graceful handoff) in the recent events",
                        lambda: _count(browser, "#events tr[data-kind='handed']") >= 1
                        and _count(browser, "#events tr[data-kind='asked']") >= 1,
                        timeout=60)  # fmt: skip
            browser.save_screenshot(str(ARTIFACTS / "status-page.png"))
            # #45: it fits a 1400 px screen: a checkpoint shows its ends, the whole on hover.
            assert browser.execute_script("return document.documentElement.scrollWidth") <= 1400
            cell = "#leases tbody td.checkpoint"
            assert len(_text(browser, cell, "title")) >= 50 and "\u2026" in _text(browser, cell)
            import kclpy_spark

            summary = _text(browser, "#summary")
            assert f"kclpy-spark {kclpy_spark.__version__}" in summary

            # The same page for a machine that runs no worker: status --serve.
            serve_port = free_port()
            server = subprocess.Popen(
                [sys.executable, "-m", "kclpy_spark.cli", "status", "--config",
                 str(workers.config), "--serve", f"127.0.0.1:{serve_port}", "--watch", "1"],
                env=workers.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            try:
                wait_for("status --serve", lambda: _reachable(serve_port), timeout=60)
                browser.get(f"http://127.0.0.1:{serve_port}/status")
                _page_shows(browser, "both workers' leases from the table alone",
                            lambda: sorted(_rows(browser).values()) == ["page-a", "page-b"],
                            timeout=60)  # fmt: skip
                _page_shows(browser, "both workers live",
                            lambda: _count(browser, "#workers tbody tr[data-worker]") == 2,
                            timeout=30)  # fmt: skip
                _read_only(browser, serve_port)
                browser.save_screenshot(str(ARTIFACTS / "status-page-serve.png"))
            finally:
                server.send_signal(signal.SIGTERM)
                out, _ = server.communicate(timeout=30)
            assert server.returncode == 0, out
            assert f"status page on http://127.0.0.1:{serve_port}/" in out
    finally:
        stop.set()
        producer.join(timeout=10)
