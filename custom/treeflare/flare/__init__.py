"""FLARE glue: thin controllers, executors and job runners over the pure cores.

One folder per job (``icdta4fl``, ``xgb``, ``vertical``, ``discovery``), each with the server's ``controller``, the
sites' ``executor`` and the ``protocol`` both import (never each other); shared by every job: ``runner`` (run or
export a job), ``workflow`` and ``site_executor`` (the two sides' bases), ``site_config`` (a site's data binding),
``progress``, and the POC and admin helpers. Only this subpackage imports NVFlare.
"""
