"""Run existing amazon-kclpy applications without Java: the MultiLangDaemon's role in Python.

``kclpy-spark multilang --properties app.properties`` reads the application's ``.properties`` file
(``properties``), starts ``executableName`` once per lease and speaks the MultiLang JSON-lines
protocol with it (``protocol``, ``subprocess_processor``), or, with ``--in-process``, runs the
application's amazon_kclpy processor class inside the worker without a child process
(``inprocess``). ``runner`` ties them to the worker; ``cli`` is the subcommand.

Import-light on purpose: nothing is imported here, so ``kclpy_spark.multilang.properties`` can be
used without pulling in the worker, boto3 or asyncio subprocess machinery.
"""
