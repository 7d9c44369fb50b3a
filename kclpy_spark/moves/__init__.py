"""Where leases move: taking, leader assignment, balancing, graceful handoff and handing out at
stop. The pure rules are in ``rules`` (scans and figures in, plans out); the loops that apply
them (``taking``, ``assigning``, ``stopping``) see the worker as a ``LeaseWorker``."""
