"""``python -m kclpy_spark``: the ``kclpy-spark`` command."""

import sys

from kclpy_spark.cli import main

if __name__ == "__main__":
    sys.exit(main())
