"""Centralised plaintext reference: the same algorithm on the *joined* columns, with no
parties, no messages and no cipher.  Used by the tests as an independent check that the
federated protocol builds the tree a centralised learner would build on the same quantised
integers (same binning per column, same exact gains, same tie-break: party, feature, bin)."""
from __future__ import annotations

import math

import numpy as np

from .gains import make_criterion
from .parties import _cum_candidates, _PlainHist
from .params import VerticalParams
from .quantize import apply_bins, fit_bins, to_fixed


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
    y = np.asarray(data.y, dtype=np.int64)
    n = len(y)
    crit = make_criterion(P, data.n_classes)
    F = None
    base = 0.0
    if P.model == "gbdt":
        prior = float(np.clip(y.mean(), 1e-6, 1 - 1e-6))
        base = math.log(prior / (1 - prior))
        F = np.full(n, base)
    trees = []
    for _t in range(P.n_trees):
        if P.model == "tree":
            chan = [[int(v) for v in (y == c)] for c in range(data.n_classes)]
            lo, hi = [0] * data.n_classes, [1] * data.n_classes
        else:
            pr = 1.0 / (1.0 + np.exp(-F))
            one = 1 << P.precision
            chan = [to_fixed(pr - y, P.precision), to_fixed(pr * (1 - pr), P.precision)]
            lo, hi = [-one, 0], [one, one >> 2]
        st = _PlainHist(chan, lo, hi)
        nodes = []
        stack = [(0, 0, np.arange(n))]
        while stack:
            nid, depth, idx = stack.pop(0)
            cnt, tot = st.total(idx)
            best_gain, best = None, None
            if depth < P.max_depth and cnt >= 2 and crit.node_ok(tot):
                for p, j, nm, edges, b in cols:
                    nb = len(edges) + 1
                    if nb < 2:
                        continue
                    bc, bv = st.sums(idx, b[idx], nb)
                    for bb, _nl, left in _cum_candidates(bc, bv):
                        g = crit.gain(left, tot)
                        if g is not None and (best_gain is None or g > best_gain):
                            best_gain, best = g, (p, j, nm, edges, b, bb)
            if best is not None and best_gain > 0:
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
                    F[idx] += val
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
    if P.model == "gbdt":
        Ft = np.full(nt, base)
        for nodes, leaf in zip(trees, leaves):
            vals = {d["nid"]: d["value"] for d in nodes if d["leaf"]}
            Ft += np.array([vals[int(v)] for v in leaf])
        return trees, (Ft > 0).astype(np.int64), 1.0 / (1.0 + np.exp(-Ft))
    vals = {d["nid"]: d["value"] for d in trees[0] if d["leaf"]}
    pred = np.array([int(np.argmax(vals[int(v)])) for v in leaves[0]], dtype=np.int64)
    prob = np.array([np.asarray(vals[int(v)], float) / sum(vals[int(v)]) for v in leaves[0]])
    return trees, pred, prob
