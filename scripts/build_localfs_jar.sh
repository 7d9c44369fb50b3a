#!/usr/bin/env bash
# Builds kclpy_spark/spark/java/kclpy-spark-localfs.jar (or the path given) from its one Java
# source, against the Hadoop API jar that pyspark ships (needs a JDK 17+: javac and jar).
# Reproducible: the same javac gives the same class bytes, and the entries carry a fixed date.
# tests/integration/test_local_fs.py builds it again and compares the class bytes.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
JARS="$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
HADOOP_API="$(ls "$JARS"/hadoop-client-api-*.jar | head -1)"
SRC="$ROOT/kclpy_spark/spark/java"
JAR="${1:-$SRC/kclpy-spark-localfs.jar}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
javac --release 17 -nowarn -cp "$HADOOP_API" -d "$OUT" "$SRC/kclpyspark/NoForkLocalFileSystem.java"
jar --create --no-manifest --date=2026-01-01T00:00:00Z --file "$JAR" -C "$OUT" kclpyspark
echo "built $JAR"
