"""Where leases move: taking, leader assignment, balancing, graceful handoff and handing out at
stop. The pure rules are in ``rules`` (scans and figures in, plans out); the loops that apply
them (``taking`` and ``assigning``) see the worker as a ``LeaseWorker``, report through
``reports.TakeReports`` and place what they take with ``lease_worker.Placement``; ``stopping``
sees a stopping worker of its own (``StoppingWorker``)."""
