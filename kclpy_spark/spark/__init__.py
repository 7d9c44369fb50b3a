"""Spark foreachBatch sinks that acknowledge records only after their write succeeded.

The checkpoint follows the last record *written*, never the last record read. Records of the
worker's leases are gathered into micro-batches (``max_records``, ``max_bytes``, ``max_wait``),
each batch becomes one Spark DataFrame built from Arrow (columns ``stream``, ``shard_id``,
``sequence_number``, ``sub_sequence_number``, ``partition_key``, ``approximate_arrival_timestamp``,
``data``; or the JSON payload decoded into ``value_schema``), and your function is called with
Spark's own foreachBatch signature, so existing code moves over unchanged::

    def foreach_batch(df, batch_id):
        df.write.mode("append").parquet("/data/out")

    # worker.toml, next to the worker settings:
    # [sink]
    # sink = "my_module:foreach_batch"     # or "parquet:/data/out", "delta:/data/table"
    # spark_target = "local[2]"            # spark://host:7077, yarn, k8s://..., sc://host:15002

When the function returns (every sink's, with several ``[[sinks]]``), each lease's range in the
batch is acknowledged and its checkpoint moves; when it raises, nothing moves and the batch is
retried with backoff, then dead-lettered or its leases parked. ``batch_id`` is a stable hash of
the batch's (lease, first, last) ranges, so a batch replayed after a crash has the same id; the
built-in ``ParquetSink`` and ``DeltaSink`` are idempotent per lease range. ``current_batch()``
(``sink_batch``) tells a function the batch's pieces.

Import-light on purpose: nothing here imports pyspark (a worker that only runs RecordProcessors
never loads it); the modules import it inside the functions that need a session. Entry point:
``sink_setup.processor_factory_from_sink_config``. Parts (ARCHITECTURE.md lists every module):
``sink_config``/``settings`` (what a ``[sink]`` table says), ``session`` (SparkSessionHolder, Spark
targets), ``pieces`` (ids, Arrow), ``lane``/``planner``/``micro_batcher``/``writer`` (the
MicroBatcher and its writer threads), ``batch_life`` (one batch's states), ``acks`` (every sink of a
batch must answer before its checkpoint moves), ``timed_write`` (a write with a deadline, on threads
that a hung write cannot exhaust), ``sink_processor`` (SparkSinkProcessor), ``sink_batch`` (what a
sink is given), ``sinks`` (Parquet, Delta, dead letters), and the executor reads
(``executor_reads``, ``cluster_read`` on the driver, ``range_tasks`` on the executors,
``ranges``, ``frames``).
"""
