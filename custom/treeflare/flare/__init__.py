"""FLARE glue: thin controllers, executors and job runners over the pure cores.

Only this subpackage imports NVFlare.
"""
