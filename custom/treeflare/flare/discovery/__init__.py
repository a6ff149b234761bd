"""Schema discovery, a small FLARE job of its own: ``controller`` (server: merge the sites' profiles), ``executor``
(sites: profile the bound training file), the ``protocol`` both import, and ``job`` (build and run it, read a
reviewed schema file: what the job scripts and ``treeflare schema`` call)."""
