"""One decision-tree representation for local ID3 trees, converted CART trees and the global tree.

A tree is a flat list of nodes; node 0 is the root and every child has a larger index than its
parent (pre-order or breadth-first), so no traversal needs recursion and a payload cannot
describe a cycle. Three node kinds:

- ``leaf``;
- ``numeric``: sorted finite ``thresholds`` t_0 < ... < t_{k-2} and k children; child i receives
  t_{i-1} < x <= t_i (t_{-1} = -inf, t_{k-1} = +inf). A CART split is the case k = 2
  (x <= t left, x > t right); ID3 on a binned numeric feature gives k intervals;
- ``categorical``: sorted integer category codes ``values`` and one child per code.

Every node keeps ``counts``: its sample-weighted class counts over the global class list.

Missing values (NaN). An internal node may name the child position ``missing`` that a NaN in its
feature follows (a CART split learns it: scikit-learn's ``missing_go_to_left``; a refined split
chooses it from the summed counts). The node may also have one extra, last child that only NaN
reaches (``missing`` = its position): scikit-learn's "missing vs not missing" split, which it
writes as a threshold of +inf, is a numeric node with no threshold (child 0 takes every number)
and that missing-only child. A node without ``missing`` (ID3, version-1 files) stops a NaN at the
node, which predicts it from its own counts. A category the node has no child for always stops there.
Schema version 2 added ``missing``; version-1 payloads (no ``missing``) still load.
"""

from __future__ import annotations

import numpy as np

from .validate import TREE_SCHEMA, TREE_SCHEMA_VERSION, TreePayloadError, validate_tree_dict

__all__ = ["Tree", "LEAF", "NUMERIC", "CATEGORICAL"]

LEAF, NUMERIC, CATEGORICAL = 0, 1, 2
_KIND_NAMES = ("leaf", "numeric", "categorical")
_KIND_CODES = {name: code for code, name in enumerate(_KIND_NAMES)}


class Tree:
    """Decision tree over a mixed numeric/categorical feature matrix.

    Parameters
    ----------
    feature_kinds : list of str
        "numeric" or "categorical" per input column.
    n_classes : int
        Length of the global class list; ``counts`` has this many columns.
    kind, feature : array of int, shape (n_nodes,)
        Node kind (LEAF, NUMERIC, CATEGORICAL) and split feature (-1 for leaves).
    split_points : list of (array or None)
        Thresholds for numeric nodes, category codes for categorical nodes, None for leaves.
    children : list of (array of int or None)
    counts : array of float, shape (n_nodes, n_classes)
    n_categories : list of (int or None), optional
        Number of codes of each categorical column (None for numeric columns or unknown).
    missing : array of int, shape (n_nodes,), optional
        Child position a NaN follows at each internal node; -1 (the default) stops it at the node.
    """

    def __init__(self, feature_kinds, n_classes, kind, feature, split_points, children, counts,
                 n_categories=None, missing=None):
        self.feature_kinds = [str(k) for k in feature_kinds]
        self.n_features = len(self.feature_kinds)
        self.n_classes = int(n_classes)
        self.kind = np.asarray(kind, dtype=np.int8)
        self.feature = np.asarray(feature, dtype=np.int64)
        self.split_points = [None if s is None else np.asarray(s) for s in split_points]
        self.children = [None if c is None else np.asarray(c, dtype=np.int64) for c in children]
        self.counts = np.asarray(counts, dtype=np.float64).reshape(len(self.kind), self.n_classes)
        if n_categories is None:
            n_categories = [None] * self.n_features
        self.n_categories = [None if k is None else int(k) for k in n_categories]
        self.missing = (np.full(len(self.kind), -1, dtype=np.int64) if missing is None
                        else np.asarray(missing, dtype=np.int64).reshape(len(self.kind)))

    # ------------------------------------------------------------------ structure
    @property
    def n_nodes(self) -> int:
        return len(self.kind)

    @property
    def n_leaves(self) -> int:
        return int(np.sum(self.kind == LEAF))

    def node_depths(self) -> np.ndarray:
        depth = np.zeros(self.n_nodes, dtype=np.int64)
        for node in range(self.n_nodes):  # parents precede children
            if self.children[node] is not None:
                depth[self.children[node]] = depth[node] + 1
        return depth

    @property
    def depth(self) -> int:
        return int(self.node_depths().max()) if self.n_nodes else 0

    def parents(self) -> np.ndarray:
        parent = np.full(self.n_nodes, -1, dtype=np.int64)
        for node in range(self.n_nodes):
            if self.children[node] is not None:
                parent[self.children[node]] = node
        return parent

    def n_branches(self, node: int) -> int:
        """Children an internal node's thresholds or values define (a missing-only child comes after them)."""
        return len(self.split_points[node]) + (1 if self.kind[node] == NUMERIC else 0)

    def missing_only(self, node: int) -> bool:
        """Whether the node's last child is reached by NaN only."""
        return self.children[node] is not None and len(self.children[node]) > self.n_branches(node)

    # ------------------------------------------------------------------ prediction
    def _route(self, node: int, x: np.ndarray) -> np.ndarray:
        """Child position for each value of x at an internal node; -1 stops at the node."""
        points = self.split_points[node]
        missing = np.isnan(x)
        if self.kind[node] == NUMERIC:
            pos = np.searchsorted(points, x, side="left")  # x <= t_0 -> 0, t_0 < x <= t_1 -> 1, ...
        else:
            pos = np.searchsorted(points, x, side="left")
            inside = pos < len(points)
            matched = np.zeros(len(x), dtype=bool)
            matched[inside] = points[pos[inside]] == x[inside]
            pos = np.where(matched, pos, -1)
        return np.where(missing, self.missing[node], pos)

    def apply(self, X) -> np.ndarray:
        """Index of the node each row stops at: a leaf, or the node whose split it cannot follow (a NaN
        where the node names no ``missing`` child, a category it has no child for)."""
        X = self._check_X(X)
        out = np.zeros(len(X), dtype=np.int64)
        stack = [(0, np.arange(len(X)))]
        while stack:
            node, rows = stack.pop()
            if rows.size == 0:
                continue
            if self.kind[node] == LEAF:
                out[rows] = node
                continue
            pos = self._route(node, X[rows, self.feature[node]])
            out[rows[pos < 0]] = node
            for i, child in enumerate(self.children[node]):
                stack.append((int(child), rows[pos == i]))
        return out

    def node_proba(self) -> np.ndarray:
        totals = self.counts.sum(axis=1, keepdims=True)
        uniform = np.full_like(self.counts, 1.0 / max(self.n_classes, 1))
        with np.errstate(invalid="ignore", divide="ignore"):
            proba = np.where(totals > 0, self.counts / np.where(totals > 0, totals, 1.0), uniform)
        return proba

    def predict_proba(self, X) -> np.ndarray:
        return self.node_proba()[self.apply(X)]

    def predict(self, X) -> np.ndarray:
        """Class index (into the global class list) per row."""
        return np.argmax(self.predict_proba(X), axis=1)

    def decision_path(self, x) -> list[int]:
        """Nodes visited by one input row, root first."""
        x = self._check_X(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]
        path, node = [0], 0
        while self.kind[node] != LEAF:
            pos = int(self._route(node, x[[self.feature[node]]])[0])
            if pos < 0:
                break
            node = int(self.children[node][pos])
            path.append(node)
        return path

    def _check_X(self, X) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise ValueError(f"X must have shape (n, {self.n_features}); got {X.shape}")
        return X

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        nodes = []
        for node in range(self.n_nodes):
            entry = {"kind": _KIND_NAMES[self.kind[node]],
                     "counts": [float(c) for c in self.counts[node]]}
            if self.kind[node] == NUMERIC:
                entry["feature"] = int(self.feature[node])
                entry["thresholds"] = [float(t) for t in self.split_points[node]]
                entry["children"] = [int(c) for c in self.children[node]]
            elif self.kind[node] == CATEGORICAL:
                entry["feature"] = int(self.feature[node])
                entry["values"] = [int(v) for v in self.split_points[node]]
                entry["children"] = [int(c) for c in self.children[node]]
            if self.kind[node] != LEAF and self.missing[node] >= 0:
                entry["missing"] = int(self.missing[node])
            nodes.append(entry)
        return {
            "schema": TREE_SCHEMA,
            "version": TREE_SCHEMA_VERSION,
            "n_features": self.n_features,
            "n_classes": self.n_classes,
            "feature_kinds": list(self.feature_kinds),
            "n_categories": [None if k is None else int(k) for k in self.n_categories],
            "nodes": nodes,
        }

    @classmethod
    def from_dict(cls, payload, **limits) -> "Tree":
        """Build a tree from a dict made by ``to_dict``, after validating it (see validate.py).

        ``limits`` go to ``validate_tree_dict``; when they give ``n_categories`` (the receiver's
        schema), the tree keeps those, not the payload's own declaration."""
        validate_tree_dict(payload, **limits)
        nodes = payload["nodes"]
        kind, feature, points, children = [], [], [], []
        missing = [-1 if entry.get("missing") is None else entry["missing"] for entry in nodes]
        for entry in nodes:
            code = _KIND_CODES[entry["kind"]]
            kind.append(code)
            if code == LEAF:
                feature.append(-1)
                points.append(None)
                children.append(None)
            else:
                feature.append(entry["feature"])
                key = "thresholds" if code == NUMERIC else "values"
                # codes as floats too: inputs are float arrays, compared without casting
                points.append(np.asarray(entry[key], dtype=np.float64))
                children.append(np.asarray(entry["children"], dtype=np.int64))
        counts = np.asarray([entry["counts"] for entry in nodes], dtype=np.float64)
        return cls(payload["feature_kinds"], payload["n_classes"], kind, feature, points, children,
                   counts, n_categories=limits.get("n_categories", payload.get("n_categories")), missing=missing)

    def __repr__(self) -> str:
        return (f"Tree(n_nodes={self.n_nodes}, n_leaves={self.n_leaves}, depth={self.depth}, "
                f"n_features={self.n_features}, n_classes={self.n_classes})")


def leaf_tree(feature_kinds, counts, n_categories=None) -> Tree:
    """A single-leaf tree (e.g. a site whose data has one class)."""
    counts = np.asarray(counts, dtype=np.float64).reshape(1, -1)
    return Tree(feature_kinds, counts.shape[1], [LEAF], [-1], [None], [None], counts, n_categories)


__all__ += ["leaf_tree", "TreePayloadError"]
