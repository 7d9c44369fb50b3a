"""The user's ``spark.driver.extraJavaOptions`` reaches the driver JVM that the session holder
starts, next to the log4j configuration the daemon names for it (``--driver-java-options``, which
Spark lets take the place of that setting). A fresh process: this one's JVM runs already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, logging
logging.basicConfig(level=logging.INFO)
from kclpy_spark.spark.session import SparkSessionHolder
holder = SparkSessionHolder("local[1]", conf={
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -Dkclpy.test.name=kept",
})
jvm = holder.session().sparkContext._jvm
factory = jvm.java.lang.management.ManagementFactory
print(json.dumps({
    "collectors": [str(g.getName()) for g in factory.getGarbageCollectorMXBeans()],
    "property": jvm.java.lang.System.getProperty("kclpy.test.name"),
    "log4j": jvm.java.lang.System.getProperty("log4j2.configurationFile"),
}))
holder.stop()
"""


def test_the_users_driver_java_options_reach_the_jvm_with_the_log_configuration(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True,
        text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["collectors"] == ["Copy", "MarkSweepCompact"]  # the Serial collector, not G1
    assert seen["property"] == "kept"
    assert seen["log4j"] and seen["log4j"].endswith("/log4j2.properties")  # ours, still named
    assert "NativeCodeLoader" not in out.stderr  # the configuration still quiets Spark's noise
