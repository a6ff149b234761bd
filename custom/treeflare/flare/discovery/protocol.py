"""What the schema discovery job's server and sites both name: its one task. The request (``label``, ``id_column``,
``categorical``, ``ordinal``, ``min_category_rows``) goes out under ``request``; the site's profile (checked by
:func:`treeflare.data.discovery.check_profile`) comes back under ``profile``."""

TASK = "treeflare_discover_schema"
