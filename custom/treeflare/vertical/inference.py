"""Collaborative inference: the one code path that routes rows through a vertical model, used at the end of
training (the test rows) and by prediction-only runs (:mod:`.prediction`).

No party holds the whole model.  The active party holds the tree structure, the leaf values and its own splits;
a passive party holds the thresholds of its splits, known to the others only by opaque ids.  The active party
routes the rows layer by layer over all trees (:func:`route_layers`): its own splits it evaluates itself, and for
a passive split it asks the owner one bit per row that reaches the split (``predict`` messages).  The passive
party answers through :class:`PredictionAnswers`, which checks every request against its own splits and its own
earlier answers.  :func:`leaf_outputs` turns the leaves reached into predictions.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from .messages import ProtocolError, check_split_id, expect_reply, int_array, require


# ------------------------------------------------------------------------------------------- active side
def route_layers(trees: list, X: np.ndarray, me: str):
    """Generator: the leaf id of every row of ``X`` (this party's columns) in every tree.

    Yields ``{passive: predict request}`` once per depth at which a passive split is reached and expects the
    replies to be sent back; returns the list of leaf-id arrays (one per tree)."""
    n = len(X)
    by_tree = [{nd["nid"]: nd for nd in tree["nodes"]} for tree in trees]
    cur = [np.zeros(n, dtype=np.int64) for _ in trees]
    depth_max = max((nd["depth"] for tree in trees for nd in tree["nodes"]), default=0)
    for depth in range(depth_max + 1):
        asks = defaultdict(list)      # passive -> [(tree, node, split id, rows)]
        for t, nodes in enumerate(by_tree):
            for nid, nd in nodes.items():
                if nd["depth"] != depth or nd["leaf"] or nd["owner"] == me:
                    continue
                rows = np.flatnonzero(cur[t] == nid)
                if rows.size:
                    asks[nd["owner"]].append((t, nid, nd["split_id"], rows))
        decisions = {}
        if asks:
            replies = yield {p: {"type": "predict", "depth": depth,
                                 "nodes": [{"id": sid, "rows": rows.astype(np.int32)} for _t, _n, sid, rows in v]}
                             for p, v in asks.items()}
            for p, v in asks.items():
                got = require(expect_reply(replies, p, "predictions"), "nodes", list)
                if len(got) != len(v):
                    raise ProtocolError(f"{p}: prediction reply does not match the request")
                for (t, nid, sid, rows), g in zip(v, got):
                    if require(g, "id", str) != sid:
                        raise ProtocolError(f"{p}: prediction reply does not match the request")
                    bits = int_array(g, "bits", (rows.size + 7) // 8, 0, 255).astype(np.uint8)
                    decisions[(t, nid)] = np.unpackbits(bits)[:rows.size].astype(bool)
        for t, nodes in enumerate(by_tree):
            for nid, nd in nodes.items():
                if nd["depth"] != depth or nd["leaf"]:
                    continue
                rows = np.flatnonzero(cur[t] == nid)
                if not rows.size:
                    continue
                if nd["owner"] == me:
                    with np.errstate(invalid="ignore"):       # a missing value goes right, as in training
                        go = X[rows, nd["feature_index"]] <= nd["threshold"]
                else:
                    go = decisions[(t, nid)]
                cur[t][rows] = np.where(go, nd["left"], nd["right"])
    return cur


def leaf_outputs(trees: list, leaves: list, objective, base_score, n_classes: int) -> tuple:
    """(predictions, scores) from the leaves every row reached: boosted raw scores through the objective
    (``objective`` given), or the class distribution of the single tree's leaf."""
    n = len(leaves[0]) if leaves else 0
    if objective is not None:
        F = np.tile(np.asarray(base_score, dtype=np.float64).reshape(-1), (n, 1))
        for tree, leaf in zip(trees, leaves):
            vals = {nd["nid"]: nd["value"] for nd in tree["nodes"] if nd["leaf"]}
            if n:
                F += np.array([np.asarray(vals[int(v)], dtype=np.float64).reshape(-1) for v in leaf])
        return objective.transform(F)
    counts = {nd["nid"]: nd["value"] for nd in trees[0]["nodes"] if nd["leaf"]}
    prob = np.zeros((n, n_classes))
    for i, nid in enumerate(leaves[0]):
        c = np.asarray(counts[int(nid)], dtype=np.float64)
        prob[i] = c / c.sum()
    pred = np.array([int(np.argmax(counts[int(nid)])) for nid in leaves[0]], dtype=np.int64)
    return pred, prob


# ------------------------------------------------------------------------------------------ passive side
class PredictionAnswers:
    """A passive party's answers to ``predict`` requests about its rows ``X`` (its own columns), one bit per
    row: is the row's value at or below the split's threshold.  Every request is checked:

    * only this party's splits, each asked for once, at its own depth;
    * the rows asked about are distinct and, within one tree and depth, asked at one node only;
    * at a tree's root every row; below a split this party owns, exactly the rows its answer sent there (and the
      parent is asked first), so the active party cannot choose which rows a chain of this party's splits sees.
    """

    def __init__(self, splits: dict, X: np.ndarray):
        self.splits = splits          # split id -> {feature_index, threshold, tree, node, depth, ...}
        self.X = X
        self.n = len(X)
        self._answered: dict = {}     # (tree, node) -> (rows, left mask)

    def answer(self, msg) -> dict:
        depth = require(msg, "depth", int)
        nodes = require(msg, "nodes", list)
        if not nodes:
            raise ProtocolError("prediction request without nodes")
        own = {(s["tree"], s["node"]) for s in self.splits.values()}
        seen = set()
        per_tree = defaultdict(list)
        todo = []
        for entry in nodes:
            sid = check_split_id(require(entry, "id", str))
            if sid not in self.splits:
                raise ProtocolError(f"unknown split id {sid!r}")
            s = self.splits[sid]
            key = (s["tree"], s["node"])
            if key in self._answered or sid in seen:
                raise ProtocolError(f"split {sid} was already asked for")
            seen.add(sid)
            if s["depth"] != depth:
                raise ProtocolError(f"split {sid} is not at depth {depth}")
            rows = int_array(entry, "rows", None, 0, self.n - 1)
            if rows.size == 0 or np.unique(rows).size != rows.size:
                raise ProtocolError(f"split {sid}: rows empty or repeated")
            par = (s["node"] - 1) // 2
            if s["node"] == 0:
                if rows.size != self.n:
                    raise ProtocolError("every row reaches the root")
            elif (s["tree"], par) in self._answered:
                prow, pleft = self._answered[(s["tree"], par)]
                expect = prow[pleft] if s["node"] == 2 * par + 1 else prow[~pleft]
                if not np.array_equal(np.sort(rows), np.sort(expect)):
                    raise ProtocolError(f"split {sid}: rows differ from those this party sent down from node {par}")
            elif (s["tree"], par) in own:
                raise ProtocolError(f"split {sid}: asked before node {par} above it, which this party owns")
            per_tree[s["tree"]].append(rows)
            todo.append((sid, key, rows, s))
        for tree, lists in per_tree.items():
            allr = np.concatenate(lists)
            if np.unique(allr).size != allr.size:
                raise ProtocolError(f"tree {tree}: a row asked for at two nodes of one depth")
        out = []
        for sid, key, rows, s in todo:
            with np.errstate(invalid="ignore"):
                go = self.X[rows, s["feature_index"]] <= s["threshold"]
            self._answered[key] = (rows, go)
            out.append({"id": sid, "bits": np.packbits(go.astype(np.uint8))})
        return {"type": "predictions", "nodes": out}
