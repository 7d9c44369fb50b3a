"""The ``kclpy-spark`` command: ``run`` (the consumer daemon), ``status``, ``reset``,
``suspend``, ``resume``, ``demo`` and ``multilang`` (an amazon-kclpy application).

Errors the user can fix (bad config, missing stream or table, bad credentials) print one line
and exit with status 2; no stack trace. A daemon that gives up while running because its lease
table or stream has been gone too long prints one line and exits with status 3; a job
(``--until-caught-up``) that could not commit everything, 1; output to a closed pipe, 141.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from checkpoint.base.errors import ConfigError, KclpySparkError
from kclpy_spark._version import __version__
from kclpy_spark.logs import level_argument

if TYPE_CHECKING:
    from kclpy_spark.config import WorkerConfig


def _add_table_flags(p: argparse.ArgumentParser) -> None:
    """What every subcommand that reads the lease table takes: where the application is."""
    p.add_argument("--config", help="TOML config file (flags override it)")
    p.add_argument("--stream-name")
    p.add_argument("--stream-arn")
    p.add_argument("--application-name")
    p.add_argument("--region", help="default: the stream ARN's, AWS_REGION, the profile's")
    p.add_argument("--profile", help="a profile of ~/.aws/config (default: AWS_PROFILE)")
    p.add_argument("--endpoint-url", help="a local endpoint (LocalStack); default: AWS")
    p.add_argument("--lease-store", help="sqlite:<path> (default), dynamodb, or memory")
    p.add_argument("--failover-time", type=float, help="seconds")
    # Also accepted after the subcommand (`kclpy-spark run --log-level DEBUG`).
    p.add_argument("--log-level", type=level_argument, default=argparse.SUPPRESS)
    p.add_argument("--log-format", choices=("text", "json"), default=argparse.SUPPRESS)


def _add_worker_flags(p: argparse.ArgumentParser) -> None:
    """``run``'s flags: the table's, and how this worker reads and processes."""
    _add_table_flags(p)
    p.add_argument(
        "--initial-position", help="LATEST, TRIM_HORIZON or AT_TIMESTAMP:<epoch|ISO time>"
    )
    p.add_argument("--processor", help="package.module:Class")
    p.add_argument("--worker-id")
    p.add_argument("--max-records", type=int)
    p.add_argument("--idle-time-between-reads", type=float, help="seconds")
    p.add_argument("--shard-sync-interval", type=float, help="seconds")
    p.add_argument("--parent-shard-poll-interval", type=float, help="seconds")
    p.add_argument(
        "--metrics-port", type=int, help="serve /metrics, /healthz, /readyz and the status page /"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kclpy-spark", description="A pure-Python, KCL-style Kinesis consumer."
    )
    parser.add_argument("--version", action="version", version=f"kclpy-spark {__version__}")
    parser.add_argument("--log-level", type=level_argument, default="INFO")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the consumer daemon")
    _add_worker_flags(run)
    run.add_argument(
        "--until-caught-up",
        action="store_const",
        const=True,
        help="a job: read every shard to where it ended at start, commit, exit 0 (1 if not all "
        "could be committed)",
    )
    from kclpy_spark.ops.commands import add_subcommands

    add_subcommands(sub, _add_table_flags)
    demo = sub.add_parser(
        "demo", help="the whole path live: two workers writing Spark Parquet, a reshard, a kill -9"
    )
    demo.add_argument("--endpoint", required=True, help="e.g. http://127.0.0.1:4566")
    demo.add_argument("--shards", type=int, default=2)
    demo.add_argument(
        "--processor",
        action="store_true",
        help="the RecordProcessor demo instead (one worker in this process, no Spark)",
    )
    demo.add_argument("--records", type=int, default=300, help="--processor: records per phase")
    demo.add_argument("--seconds", type=float, default=75.0, help="seconds of producing")
    demo.add_argument("--rate", type=float, default=40.0, help="records per second produced")
    demo.add_argument("--timeout", type=float, default=240.0, help="seconds before giving up")
    demo.add_argument(
        "--read-on",
        choices=("driver", "executors"),
        default="driver",
        help="where the workers read records: their own process, or Spark's executors",
    )
    from kclpy_spark.multilang.command import add_subcommand as add_multilang

    add_multilang(sub)
    return parser


_FLAG_FIELDS = (
    "stream_name",
    "stream_arn",
    "application_name",
    "region",
    "profile",
    "endpoint_url",
    "initial_position",
    "lease_store",
    "processor",
    "worker_id",
    "failover_time",
    "max_records",
    "idle_time_between_reads",
    "shard_sync_interval",
    "parent_shard_poll_interval",
    "metrics_port",
)


def _config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """Flags over ``KCLPY_SPARK_<KEY>`` variables over the file over defaults."""
    import os

    from kclpy_spark.config import layered

    overrides = {name: getattr(args, name, None) for name in _FLAG_FIELDS}
    overrides["until_caught_up"] = getattr(args, "until_caught_up", None)
    if args.config is not None and not args.config.strip():  # was read as "no config file"
        raise ConfigError("--config: an empty path; name a TOML file or leave --config out")
    return layered(args.config or None, os.environ, overrides)


def _run(args: argparse.Namespace) -> int:
    from kclpy_spark.runtime.daemon import load_processor_factory, run_worker

    cfg = _config_from_args(args)
    tracker = None
    if args.config and cfg.streams:
        from kclpy_spark.runtime.daemon import config_file_stream_tracker

        tracker = config_file_stream_tracker(args.config, cfg.streams)
    # A [sink] table (or [[sinks]]) runs the Spark sink; pyspark is imported only then.
    from kclpy_spark.spark.sink_config import check_installed, load_sink_config

    sink_cfg = load_sink_config(args.config) if args.config else None
    if sink_cfg is not None:
        check_installed(sink_cfg)
    if sink_cfg is not None and cfg.processor is not None:
        raise ConfigError(
            "config has both 'processor' and a [sink] table: a worker runs one of them "
            "(the [sink] writes to Spark; a processor is your own code); remove one"
        )
    if sink_cfg is not None:
        from kclpy_spark.spark.sink_setup import processor_factory_from_sink_config

        sink_factory = processor_factory_from_sink_config(sink_cfg, cfg)
        try:
            sources = sink_factory.record_sources
            asyncio.run(
                run_worker(cfg, sink_factory, stream_tracker=tracker, record_sources=sources)
            )
        finally:
            sink_factory.close()
        return 0
    if cfg.processor is None:
        raise ConfigError("config 'processor' (package.module:Class) or a [sink] table is required")
    factory = load_processor_factory(cfg.processor)
    asyncio.run(run_worker(cfg, factory, stream_tracker=tracker))
    return 0


def _admin(args: argparse.Namespace) -> int:
    from kclpy_spark.ops import commands

    cfg = _config_from_args(args)
    if args.command == "status":
        return commands.status_command(args, cfg)
    if args.command == "reset":
        from kclpy_spark.ops.reset import reset_command

        return reset_command(args, cfg)
    return commands.suspend_command(cfg, args.command == "suspend", getattr(args, "wait", None))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kclpy_spark.logs import configure

    configure(args.log_level, args.log_format)
    try:
        if args.command == "run":
            return _run(args)
        if args.command in {"status", "reset", "suspend", "resume"}:
            return _admin(args)
        if args.command == "multilang":
            from kclpy_spark.multilang.command import run as run_multilang

            return run_multilang(args)
        if args.processor:
            from kclpy_spark.demo.run import run_demo

            return run_demo(args)
        from kclpy_spark.demo.pipeline import run_pipeline_demo

        return run_pipeline_demo(args)
    except KclpySparkError as exc:
        _say_error(str(exc), args.log_format)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kclpy-spark status --json | head`: the reader has gone
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe ended


def exit_code(exc: KclpySparkError) -> int:
    """The exit code of a command that failed with ``exc``: 1 for a job not caught up; 3 when
    the environment failed (a table or stream gone, a service that kept failing through
    start-up's retries), so a supervisor restarts it later; 2 for input a restart cannot mend."""
    from kclpy_spark.runtime.daemon import DependencyGoneError, NotCaughtUpError

    if isinstance(exc, NotCaughtUpError):
        return 1
    return 3 if isinstance(exc, DependencyGoneError) or exc.retriable else 2


def _say_error(message: str, log_format: str) -> None:
    """One line on stderr: plain text, or with ``--log-format json`` a JSON log line."""
    if log_format != "json":
        from kclpy_spark.logs import drain, redact

        drain()  # the queued log lines first: the error is the last line
        print(f"kclpy-spark: error: {redact(message)}", file=sys.stderr)
        return
    import logging

    logging.getLogger("kclpy_spark.cli").error(message)


if __name__ == "__main__":
    sys.exit(main())
