"""Each job's command line: its options, how it prepares data, runs its recipe (:mod:`treeflare.flare`) where
``--env`` says, and writes its report. ``treeflare <job>`` runs one; ``jobs/<job>/job.py`` is a thin wrapper."""
