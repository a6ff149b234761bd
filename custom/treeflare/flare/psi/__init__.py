"""The PSI phase of the vertical jobs, on NVFlare's DH-PSI: ``controller`` (server: our check and result workflows
around NVFlare's ``DhPSIController``), ``executor`` (sites: the party's ids, NVFlare's DH-PSI task handler metered,
our check/result tasks), the ``protocol`` both import, ``job`` (``add_psi``, and the phase as a job of its own for
``treeflare psi``) and ``audit`` (a server filter recording what crosses the server, for tests and reviews)."""
