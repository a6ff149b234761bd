"""The global tree as a fitted scikit-learn ``Pipeline``: an encoder of the schema's columns, then a
``DecisionTreeClassifier`` whose ``tree_`` is built node by node from ours (nothing is re-learned).

Duck-typed on the estimator (``tree_``, ``classes_``, ``data_schema``, ``encoding``): it imports no model
module, so ``GlobalTree.to_sklearn`` importing this module is the one direction of the edge.

The encoder is a ``ColumnTransformer`` of one transformer per schema column, in schema order:

* numeric: :class:`Float32Snap` (below), or passed through with ``portable=True`` (NaN = missing);
* ordinal: ``OrdinalEncoder`` with the schema's levels, a missing or unlisted value NaN;
* categorical: ``OneHotEncoder`` with the schema's categories, a missing or unknown value all zeros.

scikit-learn's trees are binary, ours are not, so each node of ours becomes a small subtree:

* a numeric node with k intervals: a balanced chain of ``x <= t`` tests on our own thresholds; a NaN goes,
  at each test, towards the side holding the node's ``missing`` child (``missing_go_to_left``);
* a NaN that our node stops (no ``missing``), or a missing-only child: first a ``x <= inf`` test that sends
  every number left and only NaN right (scikit-learn's own "missing or not" split), to a leaf with the node's
  own counts (it stops there) or to the missing-only child;
* an ID3 categorical node: a chain of one-hot tests ``col=value <= 0.5``, one per value the node has a child
  for; a category the node has no child for goes to a leaf with the node's own counts (it stops there); what
  is left (missing, unknown, and the value of the ``missing`` child) reaches the ``missing`` child, tested
  last so no subtree is copied; without ``missing`` it stops.

Every leaf's value is our node's probability vector itself (scikit-learn 1.9 stores fractions and
``predict_proba`` returns them as they are), so probabilities are bit-for-bit ours. Thresholds are ours as
float64, but scikit-learn casts its input to float32: a float64 value within half a float32 step of a threshold
could cross it. ``Float32Snap`` rounds each numeric column to a float32 on the same side of every threshold of
that column, so the pipeline is exact for every input (``portable=True``, scikit-learn's classes only: exact for
float32 inputs, e.g. integers up to 2**24). The sample counts shown by ``plot_tree``/``export_text`` are summed
from the leaves up, so a chain's nodes split their node's counts.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from ..trees.learners import CATEGORY_CODES, ONE_HOT, encoding_of
from ..trees.tree import LEAF, NUMERIC

__all__ = ["ExportError", "Float32Snap", "to_sklearn", "encoder_columns"]

_NODE_FIELDS = ("left_child", "right_child", "feature", "threshold", "impurity", "n_node_samples",
                "weighted_n_node_samples", "missing_go_to_left")


class ExportError(ValueError):
    """The model cannot be exported exactly; the message says why."""


def _float32_neighbours(t: float) -> tuple[float, float]:
    """(largest float32 <= t, smallest float32 > t), as float64."""
    f = np.float32(t)
    lo = f if float(f) <= t else np.nextafter(f, np.float32(-np.inf))
    hi = np.nextafter(lo, np.float32(np.inf))
    return float(lo), float(hi)


class Float32Snap(TransformerMixin, BaseEstimator):
    """One numeric column, rounded to float32 so that it falls on the same side of every threshold as the
    float64 value does (scikit-learn's trees cast their input to float32; without this, a value within half
    a float32 step of a threshold could cross it). A float32 input is returned unchanged, NaN stays NaN.
    ``thresholds``: the sorted thresholds the tree tests this column against."""

    def __init__(self, thresholds=()):
        self.thresholds = thresholds

    def fit(self, X=None, y=None):
        t = np.asarray(self.thresholds, dtype=np.float64)
        pairs = [_float32_neighbours(v) for v in t]
        self.lo_ = np.array([p[0] for p in pairs], dtype=np.float64)
        self.hi_ = np.array([p[1] for p in pairs], dtype=np.float64)
        close = np.nonzero(self.hi_[:-1] > self.lo_[1:])[0]
        if close.size:
            i = int(close[0])
            raise ExportError(f"thresholds {t[i]!r} and {t[i + 1]!r} of one column are closer than float32 "
                              "precision: scikit-learn's trees compare in float32 and cannot tell them apart")
        self.n_features_in_ = 1
        return self

    def transform(self, X):
        x = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
        z = x.astype(np.float32).astype(np.float64)
        for t, lo, hi in zip(np.asarray(self.thresholds, dtype=np.float64), self.lo_, self.hi_):
            with np.errstate(invalid="ignore"):
                z = np.where(x <= t, np.minimum(z, lo), np.maximum(z, hi))
        return np.where(np.isnan(x), np.nan, z)

    def get_feature_names_out(self, input_features=None):
        return np.asarray(list(input_features) if input_features is not None else ["x0"], dtype=object)


def column_thresholds(tree) -> dict[int, list[float]]:
    """Our encoded column -> the sorted thresholds its numeric nodes test."""
    out: dict[int, set] = {}
    for n in range(tree.n_nodes):
        if tree.kind[n] == NUMERIC and len(tree.split_points[n]):
            out.setdefault(int(tree.feature[n]), set()).update(float(t) for t in tree.split_points[n])
    return {j: sorted(v) for j, v in out.items()}


def encoder_columns(schema, encoding: str) -> list[dict]:
    """Per schema feature, in order: name, kind, the encoder's output columns (one, or one per category)."""
    out = []
    for f in schema.features:
        if f.kind == "categorical":
            out.append({"name": f.name, "kind": f.kind, "categories": list(f.categories),
                        "n_out": len(f.categories)})
        else:
            out.append({"name": f.name, "kind": f.kind,
                        "categories": list(f.categories) if f.kind == "ordinal" else None, "n_out": 1})
    try:
        encoding = encoding_of(encoding)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    return out


def _column_transformer(columns, snaps):
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder

    steps = []
    for i, c in enumerate(columns):
        if c["kind"] == "numeric":
            step = Float32Snap(snaps[i]) if i in snaps else "passthrough"
        elif c["kind"] == "ordinal":
            step = OrdinalEncoder(categories=[c["categories"]], handle_unknown="use_encoded_value",
                                  unknown_value=np.nan, encoded_missing_value=np.nan, dtype=np.float32)
        else:
            step = OneHotEncoder(categories=[c["categories"]], handle_unknown="ignore", sparse_output=False,
                                 dtype=np.float32)  # codes and 0/1: exact in float32, as the tree reads them
        steps.append((f"f{len(steps)}", step, [c["name"]]))
    ct = ColumnTransformer(steps, remainder="drop", verbose_feature_names_out=False)
    # The categories are given, so fitting learns nothing from the rows: one row of known values fixes the
    # column names and dtypes (numbers float64, categories text).
    row = pd.DataFrame({c["name"]: pd.Series([0.0] if c["kind"] == "numeric" else [(c["categories"] or [""])[0]],
                                             dtype=np.float64 if c["kind"] == "numeric" else object)
                        for c in columns})
    return ct.fit(row)


def _feature_map(columns, encoding, tree):
    """Per column of our encoded matrix: (first sklearn column, whether it can be NaN, one-hot width or None)."""
    out = []
    start = 0
    for c in columns:
        if c["kind"] == "categorical" and encoding_of(encoding) == ONE_HOT:  # our matrix is one-hot too: column for column
            out += [(start + i, False, None) for i in range(c["n_out"])]
        elif c["kind"] == "categorical":  # ID3 codes -> one-hot block
            out.append((start, False, c["n_out"]))
        else:
            out.append((start, True, None))
        start += c["n_out"]
    if len(out) != tree.n_features:
        raise ExportError(f"the tree reads {tree.n_features} columns, the schema's {encoding} encoding has {len(out)}")
    for j, (kind, (_, _, width)) in enumerate(zip(tree.feature_kinds, out)):
        if (kind == "categorical") != (width is not None):
            raise ExportError(f"column {j} of the tree is {kind}, the schema's {encoding} encoding disagrees")
    return out, start


class _Builder:
    """scikit-learn nodes in pre-order: a parent's index is reserved before its children's (skl2onnx needs
    children after parents)."""

    def __init__(self, tree, proba, criterion):
        self.tree, self.proba, self.criterion = tree, proba, criterion
        self.rows = []  # per sklearn node: [left, right, feature, threshold, missing_left, source node, stops]

    def reserve(self, source: int) -> int:
        self.rows.append([-1, -1, -2, -2.0, 0, source, 0])
        return len(self.rows) - 1

    def split(self, slot, feature, threshold, missing_left, source):
        left, right = self.reserve(source), self.reserve(source)
        self.rows[slot][:5] = [left, right, int(feature), float(threshold), int(bool(missing_left))]
        return left, right


def _grow(model, fmap, builder):
    tree = model.tree_
    stack = [(builder.reserve(0), ("node", 0))]
    while stack:
        slot, task = stack.pop()
        what, n = task[0], task[1]
        builder.rows[slot][5] = n
        if what == "stop":  # a leaf with node n's own counts: where our tree stops the row
            builder.rows[slot][6] = 1
            continue
        if what == "node":
            kind = int(tree.kind[n])
            if kind == LEAF:
                continue
            col, nanable, width = fmap[int(tree.feature[n])]
            children = [int(c) for c in tree.children[n]]
            k, m = tree.n_branches(n), int(tree.missing[n])
            if kind == NUMERIC:
                if width is not None:
                    raise ExportError(f"node {n}: a numeric split on a categorical column")
                inner = ("interval", n, 0, k - 1, m if m < k else -1)
                if nanable and (m < 0 or tree.missing_only(n)):
                    nan_task = ("stop", n) if m < 0 else ("node", children[m])
                    left, right = builder.split(slot, col, np.inf, False, n)  # numbers left, NaN right
                    stack += [(right, nan_task), (left, inner)]
                else:
                    stack.append((slot, inner))
                continue
            if width is None:
                raise ExportError(f"node {n}: a categorical split on a numeric column")
            values = [int(v) for v in tree.split_points[n]]
            if any(v < 0 or v >= width for v in values):
                raise ExportError(f"node {n}: category codes outside the schema's {width} categories")
            items = [(col + v, ("node", children[i])) for i, v in enumerate(values) if i != m]
            if m < 0:
                final = ("stop", n)
            else:  # unlisted categories stop; missing, unknown and the missing child's own value reach it
                items += [(col + u, ("stop", n)) for u in range(width) if u not in set(values)]
                final = ("node", children[m])
            stack.append((slot, ("chain", n, items, final)))
        elif what == "interval":
            _, _, lo, hi, m = task
            if lo == hi:
                stack.append((slot, ("node", int(tree.children[n][lo]))))
                continue
            mid = (lo + hi) // 2  # branches lo..mid are x <= t_mid
            col = fmap[int(tree.feature[n])][0]
            left, right = builder.split(slot, col, tree.split_points[n][mid], lo <= m <= mid, n)
            stack += [(right, ("interval", n, mid + 1, hi, m)), (left, ("interval", n, lo, mid, m))]
        elif what == "chain":
            _, _, items, final = task
            if not items:
                stack.append((slot, final))
                continue
            (col, hit), rest = items[0], items[1:]
            left, right = builder.split(slot, col, 0.5, False, n)  # one-hot: 0 left, 1 right; never NaN
            stack += [(right, hit), (left, ("chain", n, rest, final))]


def _impurity(proba, criterion):
    if criterion == "entropy":
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.sum(np.where(proba > 0, proba * np.log2(np.where(proba > 0, proba, 1.0)), 0.0), axis=1)
    return 1.0 - np.sum(proba ** 2, axis=1)


def _sk_tree(builder, n_features, n_classes, counts):
    from sklearn.tree import _tree

    dtype = getattr(_tree, "NODE_DTYPE", None)
    if dtype is None or any(f not in dtype.names for f in _NODE_FIELDS):
        import sklearn

        raise ExportError(f"scikit-learn {sklearn.__version__}'s tree layout is not the one this export writes "
                          f"(fields {_NODE_FIELDS}); the pinned scikit-learn is 1.9")
    rows = builder.rows
    nodes = np.zeros(len(rows), dtype=dtype)
    source = np.array([r[5] for r in rows], dtype=np.int64)
    nodes["left_child"] = [r[0] for r in rows]
    nodes["right_child"] = [r[1] for r in rows]
    nodes["feature"] = [r[2] for r in rows]
    nodes["threshold"] = [r[3] for r in rows]
    nodes["missing_go_to_left"] = [r[4] for r in rows]
    # Leaves predict their node's probabilities (exactly ours). The sample counts shown, and the impurities that
    # feature_importances_ adds up, are summed from the leaves up, so a chain's nodes split their node's counts:
    # an original leaf has its counts, a stop leaf what its node holds beyond its children (usually nothing).
    tree = builder.tree
    own = np.zeros((len(rows), n_classes))
    counted = set()  # a node with several stop leaves (one per unlisted category) counts its residue once
    for i, r in enumerate(rows):
        if r[0] < 0 and not (r[6] and r[5] in counted):
            n = r[5]
            own[i] = (np.maximum(counts[n] - counts[tree.children[n]].sum(axis=0), 0.0) if r[6] else counts[n])
            if r[6]:
                counted.add(n)
    for i in range(len(rows) - 1, -1, -1):  # children come after parents
        if rows[i][0] >= 0:
            own[i] = own[rows[i][0]] + own[rows[i][1]]
    total = own.sum(axis=1)
    shares = np.where(total[:, None] > 0, own / np.where(total > 0, total, 1.0)[:, None], builder.proba[source])
    leaf = np.array([r[0] < 0 for r in rows])
    nodes["impurity"] = _impurity(shares, builder.criterion)
    nodes["weighted_n_node_samples"] = total
    nodes["n_node_samples"] = np.rint(total).astype(np.int64)
    values = np.where(leaf[:, None], builder.proba[source], shares)
    values = np.ascontiguousarray(values.reshape(len(rows), 1, n_classes), dtype=np.float64)
    depth = np.zeros(len(rows), dtype=np.int64)
    for i, (left, right, *_rest) in enumerate(rows):  # parents come first
        if left >= 0:
            depth[[left, right]] = depth[i] + 1
    sk = _tree.Tree(n_features, np.array([n_classes], dtype=np.intp), 1)
    sk.__setstate__({"max_depth": int(depth.max()), "node_count": len(rows), "nodes": nodes, "values": values})
    return sk


def to_sklearn(model, *, criterion: str | None = None, portable: bool = False):
    """A fitted ``Pipeline([("encode", ColumnTransformer), ("tree", DecisionTreeClassifier)])`` that predicts
    exactly as ``model`` (a ``GlobalTree`` carrying its data schema) on a DataFrame of the schema's columns:
    numbers for numeric columns, the category names for categorical and ordinal ones, NaN or None for missing.
    ``criterion`` only labels the impurity shown in plots (default: entropy for ID3, gini for CART).
    Numeric columns go through :class:`Float32Snap` (exact for every float64 input);
    ``portable=True`` passes them through instead, for a pipeline of scikit-learn's classes only (loads without
    treeflare), exact where the numeric inputs are float32 values (e.g. integers below 2**24).
    Caveat: the pipeline's encoders match category text exactly, while ``GlobalTree`` strips surrounding spaces
    (" red" is red to the model, an unknown category to the pipeline): strip category text before predicting."""
    from sklearn.pipeline import Pipeline
    from sklearn.tree import DecisionTreeClassifier

    schema, encoding = getattr(model, "data_schema", None), getattr(model, "encoding", None)
    if schema is None:
        raise ExportError("the model carries no data schema (written before models carried one): attach it with "
                          "set_data_schema, so the exported encoder reads raw columns as the tree does")
    columns = encoder_columns(schema, encoding)
    tree = model.tree_
    fmap, n_out = _feature_map(columns, encoding, tree)
    criterion = criterion or ("entropy" if encoding_of(encoding) == CATEGORY_CODES else "gini")
    if criterion not in ("gini", "entropy"):
        raise ExportError(f"criterion must be 'gini' or 'entropy', got {criterion!r}")
    proba = np.ascontiguousarray(tree.node_proba(), dtype=np.float64)
    builder = _Builder(tree, proba, criterion)
    _grow(model, fmap, builder)
    clf = DecisionTreeClassifier(criterion=criterion)
    clf.n_features_in_ = n_out
    clf.n_outputs_ = 1
    clf.classes_ = np.asarray(model.classes_, dtype=object)
    clf.n_classes_ = len(clf.classes_)
    clf.max_features_ = n_out
    clf.tree_ = _sk_tree(builder, n_out, clf.n_classes_, tree.counts)
    # per scikit-learn node, the node of ours it comes from (named by the ONNX export's refusals)
    clf.treeflare_nodes_ = np.array([r[5] for r in builder.rows], dtype=np.int64)
    snaps = {}
    if not portable:  # our column j of a numeric feature -> its schema position
        schema_pos = _schema_positions(columns, encoding)
        thresholds = {schema_pos[j]: t for j, t in column_thresholds(tree).items()}
        snaps = {i: thresholds.get(i, []) for i, c in enumerate(columns) if c["kind"] == "numeric"}
    return Pipeline([("encode", _column_transformer(columns, snaps)), ("tree", clf)])


def _schema_positions(columns, encoding) -> list[int]:
    """Per column of our encoded matrix, the schema feature it comes from."""
    out = []
    for i, c in enumerate(columns):
        out += [i] * (c["n_out"] if c["kind"] == "categorical" and encoding_of(encoding) == ONE_HOT else 1)
    return out
