# Sourced by scripts/test.sh (tests only, never the daemon or the benchmarks): the JVMs the tests
# start compile with C1 alone, and a Spark driver maps a class-data archive of Spark's classes,
# made once per JDK and pyspark install (.cache/, about a minute). Most test JVMs live for seconds
# to a minute, where C2's compiling and class loading cost more CPU than the work: a Spark
# session's start and a few small jobs take about 0.4x the CPU this way. A JVM with another class
# path (executors, standalone servers, spark-submit's launcher) ignores the archive (CDS checks
# it; its notes are silenced). LocalStack's own JVM is left as it is (localstack/lsctl.py drops
# these options). KCLPY_SPARK_TEST_JVM=default turns all of it off.
if [ "${KCLPY_SPARK_TEST_JVM:-fast}" != default ]; then
  # The key: the JDK and every Spark jar as installed (CDS refuses a jar of another size or time).
  _jvm_key="$({ env -u JDK_JAVA_OPTIONS -u JAVA_TOOL_OPTIONS java -version 2>&1; echo "${JAVA_HOME:-}"; command -v java
                stat -c "%n %s %Y" "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"/jars/*
              } | sha256sum | cut -c1-16)" || true
  _jvm_archive="$ROOT/.cache/spark-classes-$_jvm_key.jsa"
  if [ ! -f "$_jvm_archive" ]; then
    echo "kclpy-spark: making the test JVMs' class archive (once; log: .cache/spark-classes.log)" >&2
    mkdir -p "$ROOT/.cache"
    rm -rf "$ROOT"/.cache/spark-classes-*.jsa "$ROOT"/.cache/.cds-*
    if ! env -u JDK_JAVA_OPTIONS timeout 600 python "$ROOT/scripts/spark_class_archive.py" "$_jvm_archive" \
         >"$ROOT/.cache/spark-classes.log" 2>&1; then
      echo "kclpy-spark: no class archive (.cache/spark-classes.log); test JVMs load their classes" >&2
    fi
  fi
  KCLPY_SPARK_TEST_JAVA_OPTIONS="-XX:TieredStopAtLevel=1"
  if [ -f "$_jvm_archive" ]; then
    KCLPY_SPARK_TEST_JAVA_OPTIONS="$KCLPY_SPARK_TEST_JAVA_OPTIONS -XX:SharedArchiveFile=\"$_jvm_archive\" -Xlog:cds=off -Xlog:cds+dynamic=off"
  fi
  export KCLPY_SPARK_TEST_JAVA_OPTIONS
  export JDK_JAVA_OPTIONS="${JDK_JAVA_OPTIONS:+$JDK_JAVA_OPTIONS }$KCLPY_SPARK_TEST_JAVA_OPTIONS"
  unset _jvm_key _jvm_archive
fi
