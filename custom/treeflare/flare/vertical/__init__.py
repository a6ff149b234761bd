"""The vertical tree job's FLARE glue: ``controller`` (server: a message router), ``executor`` (sites: the parties),
the ``protocol`` both import, and ``predict`` (the job script's prediction run)."""
