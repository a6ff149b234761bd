"""CART through scikit-learn's ``DecisionTreeClassifier``, converted to the shared ``Tree``.

Every column is treated as numeric (the data layer passes a one-hot matrix for CART). The default
``min_samples_split`` is 2% of the site's training rows as an integer, at least 2: the reference
wrote ``max(1.0, int(0.02 * n))``, which is the float 1.0 for sites under 100 rows and which
scikit-learn reads as a fraction (100% of the node), so only the root could split.

Class counts are mapped from the fitted ``classes_`` (a site may lack classes) onto the global
class list and are sample-weighted (``weighted_n_node_samples``).

Missing values are routed as scikit-learn routes them (``tree_.missing_go_to_left``, set at every
split: learned where the node's training rows had NaN, else towards the child with more rows). Its
"missing vs not missing" split (threshold +inf, NaN to the right) becomes a numeric node with no
threshold and a missing-only child, so every threshold stays finite. One difference remains:
scikit-learn compares inputs cast to float32 with its float64 thresholds, the shared tree compares
float64 inputs, so a value within float32 rounding of a threshold may take the other side.
"""

from __future__ import annotations

import numpy as np
from sklearn.tree import DecisionTreeClassifier

from .tree import LEAF, NUMERIC, Tree, leaf_tree

__all__ = ["fit_cart", "tree_from_sklearn", "default_min_samples_split"]


def default_min_samples_split(n_rows: int) -> int:
    return max(2, int(0.02 * n_rows))


def fit_cart(X, y, *, n_classes, criterion="gini", max_depth=5, min_samples_split=None,
             random_state=42, sample_weight=None, feature_kinds=None) -> Tree:
    """Fit a CART tree; ``y`` holds class indices into the global class list."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if min_samples_split is None:
        min_samples_split = default_min_samples_split(len(y))
    kinds = ["numeric"] * X.shape[1] if feature_kinds is None else list(feature_kinds)
    if any(k != "numeric" for k in kinds):
        raise ValueError("CART treats every column as numeric; pass a one-hot/numeric matrix")
    if len(np.unique(y)) < 2:  # scikit-learn fits a single leaf anyway; skip it
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, float)
        return leaf_tree(kinds, np.bincount(y, weights=w, minlength=n_classes))
    clf = DecisionTreeClassifier(criterion=criterion, max_depth=max_depth,
                                 min_samples_split=min_samples_split, random_state=random_state)
    clf.fit(X, y, sample_weight=sample_weight)
    return tree_from_sklearn(clf, n_classes=n_classes, feature_kinds=kinds)


def tree_from_sklearn(clf: DecisionTreeClassifier, *, n_classes, feature_kinds=None) -> Tree:
    """Convert a fitted single-output classifier whose ``classes_`` are global class indices."""
    t = clf.tree_
    classes = np.asarray(clf.classes_)
    if classes.dtype.kind not in "iu" or classes.min() < 0 or classes.max() >= n_classes:
        raise ValueError("clf.classes_ must be global class indices in [0, n_classes)")
    n_features = clf.n_features_in_
    kinds = ["numeric"] * n_features if feature_kinds is None else list(feature_kinds)
    value = t.value[:, 0, :]
    # recent scikit-learn stores fractions, older versions counts: normalise, then weight
    fractions = value / value.sum(axis=1, keepdims=True)
    local_counts = fractions * t.weighted_n_node_samples[:, None]
    counts = np.zeros((t.node_count, n_classes))
    counts[:, classes] = local_counts
    is_leaf = t.children_left < 0
    kind = np.where(is_leaf, LEAF, NUMERIC)
    feature = np.where(is_leaf, -1, t.feature)
    # scikit-learn < 1.3 had no missing-value routing (and refused NaN): stop at the node there
    go_left = getattr(t, "missing_go_to_left", None)
    missing = np.full(t.node_count, -1, dtype=np.int64)
    points: list = [None] * t.node_count
    children: list = [None] * t.node_count
    for i in np.flatnonzero(~is_leaf):
        children[i] = np.array([t.children_left[i], t.children_right[i]])
        threshold = float(t.threshold[i])
        if go_left is not None:
            missing[i] = 0 if go_left[i] else 1
        if np.isposinf(threshold):  # every number left, NaN right: no threshold, a missing-only child
            if go_left is None or go_left[i]:
                raise ValueError(f"node {i}: a threshold of +inf that does not send NaN right")
            points[i] = np.empty(0)
        elif not np.isfinite(threshold):
            raise ValueError(f"node {i}: threshold {threshold} is not finite")
        else:
            points[i] = np.array([threshold])
    return Tree(kinds, n_classes, kind, feature, points, children, counts, missing=missing)
