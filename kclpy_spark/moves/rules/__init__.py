"""The pure rules of lease moves: what the KCL 2.x taker takes (``take_rule``), what a leader
assigns (``assign_rule``), load by throughput or CPU (``load``, ``cpu_load``) and when another
worker's lease has expired (``observer``). No I/O: scans, figures and times in, plans out."""

from kclpy_spark.moves.rules.observer import LeaseObserver, ObservedLease, ObservedScan
from kclpy_spark.moves.rules.take_rule import UNLIMITED, TakePlan, plan_takes

__all__ = ["UNLIMITED", "LeaseObserver", "ObservedLease", "ObservedScan", "TakePlan", "plan_takes"]
