"""What every crypto worker pool shares (:mod:`.workers`' local processes and :mod:`.dask_pool`'s cluster): the
operations tables they run, the request of a merge operation, and the error a failed worker raises."""
from __future__ import annotations

import importlib


class WorkerError(RuntimeError):
    """A worker process failed (its error message, or its exit)."""


def load_ops(modules) -> dict:
    """The ``OPS`` tables of ``modules``, which must be ``treeflare.*`` modules (no operation from elsewhere)."""
    ops = {}
    for name in modules:
        if not name.startswith("treeflare."):
            raise ValueError(f"worker operations must come from the treeflare package, not {name!r}")
        ops.update(importlib.import_module(name).OPS)
    return ops


def merge_request(merge_args: dict, left: tuple, right: tuple) -> dict:
    """The args of a merge operation: its own ``merge_args`` plus the two replies' results and where the first
    reply's blobs end (its blobs are the two replies' blobs, one after the other)."""
    return {**merge_args, "results": [left[0], right[0]], "split": len(left[1])}


def per_worker(n: int, args_list, blobs_list=None) -> tuple:
    """A pool's one-request-per-worker call checked and completed: ``n`` args, and ``n`` blob lists (empty when
    none are given)."""
    args_list = list(args_list)
    if len(args_list) != n:
        raise ValueError(f"{len(args_list)} requests for {n} workers")
    return args_list, list(blobs_list) if blobs_list is not None else [[] for _ in range(n)]
