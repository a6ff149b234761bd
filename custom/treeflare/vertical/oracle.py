"""Centralised plaintext reference: the same algorithm on the *joined* columns, with no
parties, no messages and no cipher.  Used by the tests as an independent check that the
federated protocol builds the tree a centralised learner would build on the same quantised
integers (same binning per column, same exact gains, same tie-break: party, feature, bin, and the same rule
that no split leaves a child below the minimum rows per node)."""
from __future__ import annotations

import numpy as np

from .gains import make_criterion, select
from .objectives import make_objective, tree_channels
from .params import VerticalParams
from .quantize import apply_bins, fit_bins
from .stats import PlainHist, cum_candidates


def centralized_build(data, params: VerticalParams, active_name="site-1"):
    """-> (trees as joint_model() lists, test predictions, test scores)."""
    P = params.validate()
    parties = [active_name] + data.passive_names
    blocks = [data.X_active] + list(data.X_passive)
    tblocks = [data.X_active_test] + list(data.X_passive_test)
    names = [data.names_active] + list(data.names_passive)
    cols = []   # (party, local feature index, name, edges, bins)
    for p, X, nm in zip(parties, blocks, names):
        edges = fit_bins(X, P.bins)
        bins = apply_bins(X, edges)
        for j in range(X.shape[1]):
            cols.append((p, j, nm[j], edges[j], bins[:, j]))
    obj = None
    if P.model == "gbdt":
        obj = make_objective(P.objective, data.n_classes)
        y = np.asarray(data.y, dtype=np.float64 if P.objective == "squared_error" else np.int64)
    else:
        y = np.asarray(data.y, dtype=np.int64)
    n = len(y)
    K = obj.n_outputs if obj else 1
    crit = make_criterion(P, data.n_classes, K)
    F, base = None, None
    if obj is not None:
        base = obj.base_score(y)
        F = np.tile(base, (n, 1))
    trees = []
    min_rows = max(2, P.min_rows_node)
    for _t in range(P.n_trees):
        chan, lo, hi = tree_channels(y, data.n_classes) if obj is None else obj.channels(F, y, P.precision)
        st = PlainHist(chan, lo, hi)
        nodes = []
        stack = [(0, 0, np.arange(n))]
        while stack:
            nid, depth, idx = stack.pop(0)
            cnt, tot = st.total(idx)
            best = None
            if depth < P.max_depth and cnt >= min_rows and crit.node_ok(tot):
                lefts, keys = [], []
                for p, j, nm, edges, b in cols:
                    nb = len(edges) + 1
                    if nb < 2:
                        continue
                    bc, bv = st.sums(idx, b[idx], nb)
                    for bb, _nl, left in cum_candidates(bc, bv, min_rows):     # no child below the minimum
                        lefts.append(left)
                        keys.append((p, j, nm, edges, b, bb))
                gain, winners = select(lefts, tot, crit)
                if gain is not None and gain > 0:
                    best = keys[winners[0]]
            if best is not None:
                p, j, nm, edges, b, bb = best
                go = b[idx] <= bb
                nodes.append({"nid": nid, "depth": depth, "leaf": False, "n": cnt, "owner": p,
                              "left": 2 * nid + 1, "right": 2 * nid + 2, "feature": nm,
                              "feature_index": j, "bin": int(bb), "threshold": float(edges[bb])})
                stack.append((2 * nid + 1, depth + 1, idx[go]))
                stack.append((2 * nid + 2, depth + 1, idx[~go]))
            else:
                val = crit.leaf(tot)
                nodes.append({"nid": nid, "depth": depth, "leaf": True, "n": cnt, "value": val})
                if F is not None:
                    F[idx] += np.asarray(val, dtype=np.float64)
        trees.append(sorted(nodes, key=lambda d: d["nid"]))
    # predictions on the joined test columns
    col_of = {(p, j): tb[:, j] for p, tb in zip(parties, tblocks) for j in range(tb.shape[1])}
    nt = len(tblocks[0])
    leaves = []
    for nodes in trees:
        by = {d["nid"]: d for d in nodes}
        cur = np.zeros(nt, dtype=np.int64)
        for nid in sorted(by):
            d = by[nid]
            if d["leaf"]:
                continue
            m = cur == nid
            with np.errstate(invalid="ignore"):
                go = col_of[(d["owner"], d["feature_index"])] <= d["threshold"]
            cur[m] = np.where(go[m], d["left"], d["right"])
        leaves.append(cur)
    if obj is not None:
        Ft = np.tile(base, (nt, 1))
        for nodes, leaf in zip(trees, leaves):
            vals = {d["nid"]: d["value"] for d in nodes if d["leaf"]}
            Ft += np.array([np.asarray(vals[int(v)], dtype=np.float64).reshape(-1) for v in leaf])
        pred, score = obj.transform(Ft)
        return trees, pred, score
    vals = {d["nid"]: d["value"] for d in trees[0] if d["leaf"]}
    pred = np.array([int(np.argmax(vals[int(v)])) for v in leaves[0]], dtype=np.int64)
    prob = np.array([np.asarray(vals[int(v)], float) / sum(vals[int(v)]) for v in leaves[0]])
    return trees, pred, prob
