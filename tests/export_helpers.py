"""Models and rows shared by tests/models/test_export_sklearn.py and tests/models/test_export_onnx.py: small global trees of
both learners on every embedded data set (through the ICDTA4FL pipeline, three sites), rows with missing values
and unknown categories, and trees whose nodes name ``missing`` children or stop NaN. Cached: each is built once
per process."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
from sklearn.tree import DecisionTreeClassifier

from treeflare.data import DATASETS, Feature, Schema, load_dataset
from treeflare.icdta4fl.encoding import category_names, encode, feature_space
from treeflare.icdta4fl.model import GlobalTree
from treeflare.flare.icdta4fl.inprocess import run_in_process
from treeflare.icdta4fl.pipeline import train_local_tree
from treeflare.trees.cart import tree_from_sklearn
from treeflare.trees.tree import CATEGORICAL, LEAF, NUMERIC, Tree

UNSEEN = "(a category never seen in training)"
N_ROWS = 2400


def with_holes(frame: pd.DataFrame, schema: Schema, seed: int = 0, rate: float = 0.08) -> pd.DataFrame:
    """A copy with missing cells in every column and unknown categories in the categorical ones."""
    rng = np.random.default_rng(seed)
    out = frame.copy()
    for f in schema.features:
        hole = rng.random(len(out)) < rate
        col = out[f.name].astype(np.float64 if f.kind == "numeric" else object)
        col[hole] = np.nan if f.kind == "numeric" else None
        if f.kind == "categorical":
            col[(rng.random(len(out)) < rate) & ~hole] = UNSEEN
        out[f.name] = col
    return out


@functools.lru_cache(maxsize=None)
def embedded(dataset: str, algorithm: str, refine_rounds: int = 0):
    """(global tree carrying its schema, test rows: the held-out rows as they are and again with holes) on the
    first rows of an embedded data set. ``refine_rounds``: the refined tree, as the job returns it (its default
    is one round), instead of the one-round tree."""
    table = load_dataset(dataset)
    table = table.subset(np.arange(min(N_ROWS, len(table.y))))
    n_train = len(table.y) * 2 // 3
    X, y = encode(table, algorithm), table.y_codes()
    names, kinds, n_cat = feature_space(table.schema, algorithm)
    sites = [{"X_train": X[i:n_train:3], "y_train": y[i:n_train:3], "X_test": X[n_train + i::3],
              "y_test": y[n_train + i::3]} for i in range(3)]
    out = run_in_process(sites, algorithm=algorithm, classes=list(table.schema.classes), schema=table.schema,
                         feature_kinds=kinds,
                         feature_names=names, n_categories=n_cat,
                         category_names=category_names(table.schema, algorithm), local_params={"max_depth": 4},
                         refine_rounds=refine_rounds, refine_from="one_round" if refine_rounds else None)
    model = out["model"]
    if refine_rounds:  # the job's global tree after refinement: the refined tree under the one-round model's names
        model = GlobalTree(out["refined"]["tree"], table.schema.classes, names, category_names(table.schema, algorithm))
    elif model.get_n_leaves() < 4:  # on so few rows the global tree may collapse (car, CART): a local tree instead
        tree = Tree.from_dict(train_local_tree(X[:n_train], y[:n_train], algorithm=algorithm,
                                               n_classes=len(table.schema.classes), feature_kinds=kinds,
                                               n_categories=n_cat, params={"max_depth": 4}))
        model = GlobalTree(tree, table.schema.classes, names, category_names(table.schema, algorithm))
    model.set_data_schema(table.schema, algorithm)
    test = table.subset(np.arange(n_train, len(table.y))).frame
    return model, pd.concat([test, with_holes(test, table.schema)], ignore_index=True)


EMBEDDED = [(d, a) for d in DATASETS for a in ("cart", "id3")]

MIXED = Schema((Feature("u", "numeric"), Feature("v", "numeric"), Feature("colour", "categorical",
                                                                          ("red", "green", "blue", "grey")),
                Feature("size", "ordinal", ("S", "M", "L"))), "y", ("a", "b", "c"))


def mixed_rows(n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows of MIXED with missing cells and unknown colours; NaN in v means class c."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"u": rng.normal(size=n), "v": rng.normal(size=n),
                          "colour": pd.Series(rng.choice(MIXED.features[2].categories, n), dtype=object),
                          "size": pd.Series(rng.choice(MIXED.features[3].categories, n), dtype=object)})
    y = ((frame["u"] + frame["v"] + (frame["colour"] == "red")) > 0.5).to_numpy().astype(np.int64)
    frame = with_holes(frame, MIXED, seed, rate=0.1)
    y[frame["v"].isna().to_numpy()] = 2
    return frame, y


@functools.lru_cache(maxsize=None)
def cart_with_missing_children() -> GlobalTree:
    """scikit-learn's CART on rows with NaN: every split names the child a NaN follows, and some are
    'missing or not' splits (a numeric node with no threshold and a missing-only child)."""
    from treeflare.data.csv_io import features_table

    frame, y = mixed_rows(600, 1)
    clf = DecisionTreeClassifier(max_depth=5, random_state=0).fit(encode(features_table(frame, MIXED), "cart"), y)
    return GlobalTree(tree_from_sklearn(clf, n_classes=3), MIXED.classes, feature_space(MIXED, "cart")[0],
                      data_schema=MIXED, encoding="cart")


def hand_made_id3(missing_pos: int) -> GlobalTree:
    """An ID3 tree over MIXED's codes. The root splits colour into red and blue (no child for green or grey:
    they stop there); a NaN (missing or unknown colour) follows child ``missing_pos``: -1 stops it, 2 is a
    missing-only child. Red splits u into three intervals (a NaN in u stops); blue splits size (ordinal) at M,
    a missing size following the L side."""
    kinds = ["numeric", "numeric", "categorical", "numeric"]
    kind = [CATEGORICAL, NUMERIC, NUMERIC, LEAF, LEAF, LEAF, LEAF, LEAF]
    feature = [2, 0, 3, -1, -1, -1, -1, -1]
    points = [np.array([0.0, 2.0]), np.array([-0.5, 0.5]), np.array([1.0]), None, None, None, None, None]
    children = [[1, 2], [3, 4, 5], [6, 7], None, None, None, None, None]
    counts = [[30, 20, 10], [20, 5, 5], [3, 12, 5], [9, 1, 0], [6, 3, 1], [1, 1, 4], [1, 8, 1], [0, 2, 3]]
    missing = [missing_pos, -1, 1, -1, -1, -1, -1, -1]
    if missing_pos == 2:  # a child only NaN reaches, after the values' children
        kind.append(LEAF)
        feature.append(-1)
        points.append(None)
        children.append(None)
        counts.append([0, 0, 5])
        missing.append(-1)
        children[0] = [1, 2, 8]
    tree = Tree(kinds, 3, kind, feature, points, [None if c is None else np.array(c) for c in children], counts,
                n_categories=[None, None, 4, None], missing=missing)
    return GlobalTree(tree, MIXED.classes, feature_space(MIXED, "id3")[0], data_schema=MIXED, encoding="id3")


def deep_id3() -> GlobalTree:
    """An ID3 tree over MIXED's codes whose deepest leaves need red, size L, v in (5, 5 + 1e-6] and u on a side
    of 1e-6 at once: random rows near the thresholds rarely reach them."""
    kind = [CATEGORICAL, NUMERIC, NUMERIC, NUMERIC] + [LEAF] * 6
    feature = [2, 3, 1, 0] + [-1] * 6
    points = [np.array([0.0]), np.array([1.0]), np.array([5.0, 5.000001]), np.array([0.0, 1e-6])] + [None] * 6
    children = [[1], [4, 2], [5, 3, 6], [7, 8, 9]] + [None] * 6
    counts = [[40, 40, 40], [30, 30, 30], [20, 20, 20], [10, 10, 10], [9, 1, 0], [1, 9, 0], [0, 1, 9], [8, 1, 1],
              [1, 8, 1], [1, 1, 8]]
    tree = Tree(["numeric", "numeric", "categorical", "numeric"], 3, kind, feature, points,
                [None if c is None else np.array(c) for c in children], counts, n_categories=[None, None, 4, None],
                missing=[-1] * 10)
    return GlobalTree(tree, MIXED.classes, feature_space(MIXED, "id3")[0], data_schema=MIXED, encoding="id3")
