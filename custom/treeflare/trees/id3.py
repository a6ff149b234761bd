"""ID3: information-gain decision trees with multiway splits.

Categorical columns (integer codes, NaN = missing) get one child per code present at the node.
A code that has no child at a node (unseen there) stops at that node and is predicted from the
node's own class counts (its majority class).

Missing values (NaN, in any column). At fit, the rows missing the chosen feature stay at the node:
they are in its counts, no child receives them, and the gain scores them as a group of their own.
At predict, a NaN stops at the same node (the tree names no ``missing`` child) and is predicted
from the node's counts, which are the rows training left there with the rows sent on: prediction
does what fit did. (A missing-only child per split was not taken: with a few missing cells it
would be a leaf of one or two rows.)

Numeric columns are discretised before learning into at most ``n_bins`` quantile bins, with
edges learned **per site from its own training data** (``np.nanquantile``). A split on a binned
numeric column is stored as a numeric multiway split on the raw values: child i receives
e_{i-1} < x <= e_i, with the site's bin edges between the bins present at the node. The rules
extracted from such trees are therefore interval conditions in raw units, comparable across sites
whose bin edges differ, and the tree predicts raw (unbinned) inputs directly.

As in textbook ID3 a feature is used at most once on a path (a multiway split exhausts it).
Stops at ``max_depth``, at nodes with fewer than ``min_samples_split`` samples (weighted), on
pure nodes and when the best information gain is below ``min_gain``.
"""

from __future__ import annotations

import numpy as np

from .impurity import entropy
from .tree import CATEGORICAL, LEAF, NUMERIC, Tree

__all__ = ["fit_id3", "quantile_bin_edges"]


def quantile_bin_edges(column: np.ndarray, n_bins: int) -> np.ndarray:
    """Distinct inner quantile edges of the finite values (at most n_bins - 1 of them)."""
    finite = column[np.isfinite(column)]
    if finite.size == 0 or n_bins < 2:
        return np.empty(0)
    edges = np.unique(np.quantile(finite, np.linspace(0.0, 1.0, n_bins + 1)[1:-1]))
    return edges[edges < finite.max()]  # an edge at the maximum would leave an empty last bin


def fit_id3(X, y, *, n_classes, feature_kinds, n_categories=None, max_depth=5,
            min_samples_split=2, min_gain=1e-7, n_bins=4, sample_weight=None) -> Tree:
    """Fit an ID3 tree; ``y`` holds class indices into the global class list."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    n, d = X.shape
    if len(feature_kinds) != d:
        raise ValueError(f"feature_kinds has {len(feature_kinds)} entries for {d} columns")
    if y.shape != (n,) or (n and (y.min() < 0 or y.max() >= n_classes)):
        raise ValueError("y must hold class indices in [0, n_classes)")
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    n_categories = list(n_categories) if n_categories is not None else [None] * d
    max_depth = np.inf if max_depth is None else max_depth

    # codes[:, j] in 0..n_codes[j]-1, -1 = missing; numeric columns binned by site quantiles
    codes = np.full((n, d), -1, dtype=np.int64)
    n_codes = np.zeros(d, dtype=np.int64)
    bin_edges: list[np.ndarray | None] = [None] * d
    for j, kind in enumerate(feature_kinds):
        col = X[:, j]
        known = ~np.isnan(col)
        if kind == "numeric":
            edges = quantile_bin_edges(col, n_bins)
            bin_edges[j] = edges
            codes[known, j] = np.searchsorted(edges, col[known], side="left")
            n_codes[j] = len(edges) + 1
        elif kind == "categorical":
            values = col[known]
            if values.size and (np.any(values != np.round(values)) or values.min() < 0):
                raise ValueError(f"categorical column {j} must hold non-negative integer codes")
            codes[known, j] = values.astype(np.int64)
            seen = int(values.max()) + 1 if values.size else 1
            k = n_categories[j]
            if k is not None and seen > k:
                raise ValueError(f"categorical column {j} has code {seen - 1} >= n_categories {k}")
            n_codes[j] = k if k is not None else seen
        else:
            raise ValueError(f"unknown feature kind {kind!r}")

    kind_out, feature_out, points_out, children_out, counts_out = [], [], [], [], []

    def new_node(rows):
        counts_out.append(np.bincount(y[rows], weights=w[rows], minlength=n_classes))
        kind_out.append(LEAF)
        feature_out.append(-1)
        points_out.append(None)
        children_out.append(None)
        return len(kind_out) - 1

    root = new_node(np.arange(n))
    stack = [(root, np.arange(n), 0, np.ones(d, dtype=bool))]
    while stack:
        node, rows, depth, available = stack.pop()
        counts = counts_out[node]
        total = counts.sum()
        if (depth >= max_depth or total < min_samples_split or np.count_nonzero(counts) <= 1
                or not available.any()):
            continue
        parent_entropy = entropy(counts, bits=True)
        best_gain, best_j, best_table = -np.inf, -1, None
        for j in np.flatnonzero(available):
            k = int(n_codes[j])
            table = np.bincount((codes[rows, j] + 1) * n_classes + y[rows], weights=w[rows],
                                minlength=(k + 1) * n_classes).reshape(k + 1, n_classes)
            sizes = table.sum(axis=1)
            if np.count_nonzero(sizes[1:]) < 2:  # fewer than two values present: no split
                continue
            # missing values form their own group for the gain but get no child
            gain = parent_entropy - np.sum(sizes / total * entropy(table, bits=True))
            if gain > best_gain + 1e-12:
                best_gain, best_j, best_table = gain, j, table
        if best_j < 0 or best_gain < min_gain:
            continue
        present = np.flatnonzero(best_table[1:].sum(axis=1) > 0)  # codes present at the node
        col_codes = codes[rows, best_j]
        child_available = available.copy()
        child_available[best_j] = False
        children = []
        for code in present:
            child_rows = rows[col_codes == code]
            child = new_node(child_rows)
            children.append(child)
            stack.append((child, child_rows, depth + 1, child_available))
        feature_out[node] = best_j
        children_out[node] = np.asarray(children)
        if feature_kinds[best_j] == "numeric":
            kind_out[node] = NUMERIC
            # upper edge of every present bin but the last: the intervals cover the real line
            points_out[node] = bin_edges[best_j][present[:-1]]
        else:
            kind_out[node] = CATEGORICAL
            points_out[node] = present.astype(np.float64)

    # the stack is LIFO, so children are numbered after their parent but not in pre-order;
    # the representation only needs parent < child, which holds.
    return Tree(feature_kinds, n_classes, kind_out, feature_out, points_out, children_out,
                np.asarray(counts_out, dtype=np.float64).reshape(-1, n_classes),
                n_categories=[n_categories[j] if feature_kinds[j] == "categorical" else None
                              for j in range(d)])
