"""The tools around the jobs (prepare, schema, psi, predict, export, report, site): ``treeflare <tool>``."""
