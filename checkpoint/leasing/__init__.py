"""Lease taking and expiry: pure rules (the KCL 2.x taker), fed by scans of the lease table.

Import-light: only the standard library and the lease value types.
"""

from checkpoint.leasing.observer import LeaseObserver, ObservedLease, ObservedScan
from checkpoint.leasing.take_rule import UNLIMITED, TakePlan, plan_takes
from checkpoint.leasing.timing import LeaseTiming

__all__ = [
    "UNLIMITED",
    "LeaseObserver",
    "LeaseTiming",
    "ObservedLease",
    "ObservedScan",
    "TakePlan",
    "plan_takes",
]
