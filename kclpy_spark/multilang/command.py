"""``kclpy-spark multilang``: run an amazon-kclpy application from its .properties file.

    kclpy-spark multilang --properties app.properties            # like the MultiLangDaemon
    kclpy-spark multilang -p app.properties --in-process          # the app's class, in-process
    kclpy-spark multilang app.properties --in-process app:RecordProcessor

The MultiLangDaemon's own spellings are accepted: ``--properties-file``/``-p`` or the file as the
only argument (and ``--log-configuration``/``-l``, which is ignored with a warning: logging is
Python's). Also runnable alone: ``python -m kclpy_spark.multilang.command ...``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from checkpoint.base.errors import ConfigError, KclpySparkError
from kclpy_spark.logs import level_argument

log = logging.getLogger(__name__)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", nargs="?", help="the .properties file (or use --properties)")
    p.add_argument(
        "--properties", "--properties-file", "-p", dest="properties", help="the .properties file"
    )
    p.add_argument(
        "--in-process",
        nargs="?",
        const="",
        default=None,
        metavar="module:Class",
        help="run the app's amazon_kclpy processor class in the worker (no child processes); "
        "without a value the class is found in the executableName script",
    )
    p.add_argument(
        "--retry-failed-batches",
        action="store_true",
        help="in-process: an exception from the processor retries the batch (and parks the "
        "lease after repeated failures) instead of being logged and passed over as amazon-kclpy "
        "does",
    )
    p.add_argument("--endpoint-url", help="a local endpoint (LocalStack) for Kinesis and DynamoDB")
    p.add_argument("--lease-store", help="dynamodb (default), sqlite:<path> or memory")
    p.add_argument("--worker-id", help="overrides the file's workerId")
    p.add_argument("--log-configuration", "-l", help=argparse.SUPPRESS)
    # Also accepted after the subcommand, as for `kclpy-spark run`.
    p.add_argument("--log-level", type=level_argument, default=argparse.SUPPRESS)
    p.add_argument("--log-format", choices=("text", "json"), default=argparse.SUPPRESS)


def add_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``multilang`` to the ``kclpy-spark`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "multilang",
        help="run an amazon-kclpy application from its .properties file (no Java)",
        description="Run an amazon-kclpy (MultiLangDaemon) application from its .properties file.",
    )
    configure(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; raises ConfigError (the caller prints it and exits 2)."""
    from kclpy_spark.multilang.runner import run_properties

    if args.in_process and ":" not in args.in_process and not args.file:
        # `--in-process app.properties`: argparse gave the file to the flag (its value is
        # optional); a processor is module:Class
        args.file, args.in_process = args.in_process, ""
    if args.file and args.properties and args.file != args.properties:
        log.warning("the --properties file wins over %s", args.file)
    path = args.properties or args.file
    if not path:
        raise ConfigError("a .properties file is required: --properties FILE")
    if args.log_configuration:
        log.warning("--log-configuration %s is ignored (logback is Java's)", args.log_configuration)
    overrides = {
        "endpoint_url": args.endpoint_url,
        "lease_store": args.lease_store,
        "worker_id": args.worker_id,
    }
    in_process = args.in_process is not None
    run_properties(
        path,
        in_process=in_process,
        processor=args.in_process or None,
        overrides=overrides,
        retry_failed_batches=args.retry_failed_batches,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kclpy_spark.multilang.command``: the subcommand on its own."""
    from kclpy_spark.logs import configure as configure_logging

    parser = argparse.ArgumentParser(
        prog="kclpy-spark multilang", description=(__doc__ or "").splitlines()[0]
    )
    configure(parser)
    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "INFO"), getattr(args, "log_format", "text"))
    try:
        return run(args)
    except KclpySparkError as exc:
        from kclpy_spark.cli import _say_error, exit_code

        _say_error(str(exc), getattr(args, "log_format", "text"))
        return exit_code(exc)  # as `kclpy-spark multilang` exits
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
