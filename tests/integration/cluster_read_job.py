"""A separate process with a ``local-cluster`` SparkSession (separate executor JVMs and Python
workers), for tests about executors: probes them, then reads one range per shard of a stream,
and prints what it found as one JSON line. Usage: cluster_read_job.py ENDPOINT STREAM SHARDS
BAD_ENDPOINT [EXECUTOR_PYTHON] (with an executor Python, only the probe runs, with it; with
PY_FILES_ENV naming a zip too, it goes on to read, with the zip in ``spark.submit.pyFiles``, and
says where the executors imported kclpy_spark from)."""

from __future__ import annotations

import json
import os
import sys

from checkpoint.sequence import ExtendedSequenceNumber
from kclpy_spark.spark.cluster_read import read_ranges
from kclpy_spark.spark.executor_probe import ExecutorProbeError, probe_executors
from kclpy_spark.spark.range_tasks import AwsTarget
from kclpy_spark.spark.ranges import ReadRange

PY_FILES_ENV = "KCLPY_TEST_PY_FILES"


def _where_imported(batches: object) -> object:  # pickled by value: on the executors
    import pyarrow as pa

    import kclpy_spark

    for batch in batches:  # type: ignore[attr-defined]
        yield pa.RecordBatch.from_pydict({"path": [kclpy_spark.__file__] * batch.num_rows})


def main() -> None:
    endpoint, stream, shards = sys.argv[1], sys.argv[2], int(sys.argv[3])
    executor_python = sys.argv[5] if len(sys.argv) > 5 else None
    os.environ["PYSPARK_PYTHON"] = executor_python or sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    py_files = os.environ.get(PY_FILES_ENV)
    builder = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("kclpy-spark-cluster-read")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    if py_files:
        builder = builder.config("spark.submit.pyFiles", py_files)
    session = builder.getOrCreate()
    aws = AwsTarget("us-east-1", endpoint)
    out: dict[str, object] = {"driver_pid": os.getpid()}
    try:
        if executor_python is not None:
            try:
                probe_executors(session, aws, {"StreamName": stream})
            except ExecutorProbeError as exc:
                out["probe_error"] = str(exc)
                return
            if not py_files:
                return
            found = session.range(0, 4, 1, 4).mapInArrow(_where_imported, "path string")
            out["imported_from"] = sorted({r["path"] for r in found.collect()})
        else:
            try:
                probe_executors(
                    session, AwsTarget("us-east-1", sys.argv[4]), {"StreamName": stream}
                )
            except ExecutorProbeError as exc:
                out["bad_endpoint_error"] = str(exc)
            answers = probe_executors(session, aws, {"StreamName": stream}, tasks=4)
            out["probe_pids"] = sorted({a.pid for a in answers})
        ranges = [
            ReadRange(
                f"shardId-{i:012d}",
                stream,
                {"StreamName": stream},
                f"shardId-{i:012d}",
                ExtendedSequenceNumber("TRIM_HORIZON"),
                max_seconds=20.0,
            )
            for i in range(shards)
        ]
        read = read_ranges(session, ranges, aws)
        rows = read.records.collect()
        out["rows"] = sorted(bytes(r["data"]).decode() for r in rows)
        out["ends"] = {k: e.rows for k, e in read.ends.items()}
    finally:
        session.stop()
        print(json.dumps(out))


if __name__ == "__main__":
    main()
