"""The ICDTA4FL job's FLARE glue: ``controller`` (server), ``executor`` (site), and the ``protocol`` both import."""
