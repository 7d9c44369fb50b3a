"""How a lease is held: renewed on time, written under fencing, released or handed over, and put
back when its item vanished (``holder``, ``held_lease``, ``renewal_rules``, ``vanished``), with
the timing every lease rule shares (``timing``). Which worker should hold which lease is decided
above, in ``kclpy_spark.moves``."""

from checkpoint.leasing.timing import LeaseTiming

__all__ = ["LeaseTiming"]
