"""A site's row work, as operations of a worker pool (``crypto.workers``: this process, local processes, or the
site's own Dask cluster with ``--workers``): each worker holds a block of the site's binned rows, their gradients and
their node positions, applies the level's splits and returns its block's histograms; the blocks' integer histograms
add up exactly, so any number of workers gives the same model. No pickle: args are JSON, arrays travel as bytes."""

from __future__ import annotations

import numpy as np

from . import fixed_point

MODULES = ("treeflare.xgb.engine.site_ops",)


def _array(blob, dtype, shape):
    return np.frombuffer(blob, dtype=dtype).reshape(shape).copy()


def rows_op(state, args, blobs):
    """This worker's block of binned rows (int32, rows x features)."""
    state["binned"] = _array(blobs[0], np.int32, (int(args["rows"]), int(args["features"])))
    return {"rows": int(args["rows"])}, []


def grads_op(state, args, blobs):
    """The block's fixed-point gradients and hessians (int64, rows x groups); every row back at the root."""
    n, k = state["binned"].shape[0], int(args["groups"])
    state["g"], state["h"] = _array(blobs[0], np.int64, (n, k)), _array(blobs[1], np.int64, (n, k))
    state["pos"] = np.zeros((k, n), dtype=np.int32)
    return {}, []


def level_op(state, args, blobs):
    """Apply ``splits`` ([group, node, feature, bin, default_left, left, right]) to the block's positions, then its
    histograms of ``build`` ([group, node] in order): [C | G | H] per node over all features' bins (``ptr``)."""
    binned, pos = state["binned"], state["pos"]
    for k, node, f, b, default_left, left, right in args["splits"]:
        rows = np.flatnonzero(pos[k] == node)
        v = binned[rows, f]
        go_left = np.where(v < 0, bool(default_left), v <= b)
        pos[k, rows[go_left]] = left
        pos[k, rows[~go_left]] = right
    ptr = np.asarray(args["ptr"], dtype=np.int64)
    out = [histograms(binned, pos[k], state["g"][:, k], state["h"][:, k], [node], ptr) for k, node in args["build"]]
    return {}, [(np.concatenate(out) if out else np.zeros(0, np.int64)).astype(np.int64).tobytes()]


def sum_op(state, args, blobs):
    """Merge two replies: their histograms added (exact, int64)."""
    left, right = blobs[:args["split"]], blobs[args["split"]:]
    return {}, [(np.frombuffer(left[0], np.int64) + np.frombuffer(right[0], np.int64)).tobytes()]


def histograms(binned, pos, g, h, nodes, ptr) -> np.ndarray:
    """Counts, gradient and hessian sums per bin of the rows in ``nodes``, node after node: [C | G | H] each."""
    B = int(ptr[-1])
    slot = np.full(max(int(pos.max(initial=0)), max(nodes)) + 1, -1, dtype=np.int64)
    slot[nodes] = np.arange(len(nodes))
    s = slot[pos]
    rows = np.flatnonzero(s >= 0)
    v = binned[rows]
    present = v >= 0
    index = (s[rows][:, None] * B + ptr[:-1][None, :] + v)[present]
    rep = np.broadcast_to(rows[:, None], v.shape)[present]
    size = len(nodes) * B
    c = np.bincount(index, minlength=size).astype(np.int64)
    gs = fixed_point.bincount_int(index, g[rep], size)
    hs = fixed_point.bincount_int(index, h[rep], size)
    return np.concatenate([np.stack([c[j * B:(j + 1) * B], gs[j * B:(j + 1) * B], hs[j * B:(j + 1) * B]]).ravel()
                           for j in range(len(nodes))])


OPS = {"engine_rows": rows_op, "engine_grads": grads_op, "engine_level": level_op, "engine_sum": sum_op}
