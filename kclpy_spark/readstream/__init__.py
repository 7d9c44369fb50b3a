"""A Structured Streaming source, ``spark.readStream.format("kinesis-kcl")`` (issue 44)."""
