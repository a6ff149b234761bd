"""How a learner sees a table: its encoding (``trees.learners``): ``one_hot`` (CART) or ``category_codes`` (ID3).

Every function takes an encoding's name or a learner's (the learner's encoding is meant).

Both encodings come from the shared schema, so every site (and the server) builds the same columns.
Ordinal features (ordered categories) are one column of their codes 0..k-1 for both learners, split by
threshold like a number; the tree kind of such a column is "numeric".

``tree_limits`` is what the server accepts from a site: it is derived from the server's own schema and
the requested depth, never from what a site's payload says about itself.
"""

from __future__ import annotations

import numpy as np

from ..data import Schema, Table
from ..data.schema import onehot_name
from ..trees.learners import CATEGORY_CODES, LEARNERS, ONE_HOT, encoding_of

ALGORITHMS = tuple(LEARNERS)  # the learners' names (the jobs' --algorithm)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# A tree the server validates, stores and turns into rules: large enough for honest ID3 trees at depth 7
# on 600k rows (about 24,000 nodes), small enough that checking it stays under a few seconds.
HARD_MAX_TREE_NODES = 250_000


def feature_space(schema: Schema, algorithm: str) -> tuple[list[str], list[str], list]:
    """(names, kinds, n_categories) of the matrix :func:`encode` builds; kinds are tree kinds."""
    encoding = encoding_of(algorithm)
    if encoding == ONE_HOT:
        names = schema.onehot_names()
        return names, ["numeric"] * len(names), [None] * len(names)
    if encoding == CATEGORY_CODES:
        kinds = ["categorical" if f.kind == "categorical" else "numeric" for f in schema.features]
        # escaped like CART's names, so a column named "a=b" is never taken for one-hot column b of a
        return ([onehot_name(n) for n in schema.feature_names], kinds,
                [len(f.categories) if k == "categorical" else None for f, k in zip(schema.features, kinds)])
    raise AssertionError(encoding)  # encoding_of names one of ENCODINGS


def threshold_bounds(schema: Schema, algorithm: str) -> list:
    """Per encoded column, the (lo, hi) range a numeric threshold must lie in (None for categorical)."""
    one_hot = encoding_of(algorithm) == ONE_HOT
    out = []
    for f in schema.features:
        kind = f.kind
        if kind == "numeric":
            out.append((-FLOAT32_MAX, FLOAT32_MAX))
        elif kind == "ordinal":
            out.append((0.0, float(max(len(f.categories) - 1, 0))))
        elif one_hot:  # one 0/1 column per category
            out.extend([(0.0, 1.0)] * len(f.categories))
        else:
            out.append(None)
    return out


def max_tree_nodes(schema: Schema, algorithm: str, max_depth: int, n_bins: int = 4) -> int:
    """The most nodes an honest local tree of ``max_depth`` can have, capped at HARD_MAX_TREE_NODES."""
    learner = LEARNERS.get(algorithm)
    if (learner is not None and not learner.multiway) or encoding_of(algorithm) == ONE_HOT:
        arity = 2
    else:
        _, kinds, n_cats = feature_space(schema, algorithm)
        arity = max([2, int(n_bins)] + [k for k in n_cats if k is not None])
    nodes, level = 0, 1
    for _ in range(int(max_depth) + 1):
        nodes += level
        level *= arity
        if nodes >= HARD_MAX_TREE_NODES:
            return HARD_MAX_TREE_NODES
    return nodes


def tree_limits(schema: Schema, algorithm: str, *, max_depth: int, n_bins: int = 4) -> dict:
    """Keyword arguments of ``Tree.from_dict`` that check a site's tree against this schema."""
    names, kinds, n_categories = feature_space(schema, algorithm)
    return {"n_features": len(names), "n_classes": len(schema.classes), "feature_kinds": kinds,
            "n_categories": n_categories, "threshold_bounds": threshold_bounds(schema, algorithm),
            "max_nodes": max_tree_nodes(schema, algorithm, max_depth, n_bins), "max_depth": int(max_depth)}


def category_names(schema: Schema, algorithm: str) -> list | None:
    """Per encoded column, the category names its codes stand for (for rules text and pictures): ID3's
    categorical and ordinal columns, CART's ordinal columns; None elsewhere (and None if no column has any)."""
    codes = encoding_of(algorithm) == CATEGORY_CODES
    out = []
    for f in schema.features:
        kind = f.kind
        if kind == "ordinal" or (kind == "categorical" and codes):
            out.append(list(f.categories))
        elif kind == "categorical":  # one 0/1 column per category, named "attribute=value"
            out.extend([None] * len(f.categories))
        else:
            out.append(None)
    return out if any(c is not None for c in out) else None


def encode(table: Table, algorithm: str) -> np.ndarray:
    """``table``'s feature matrix in the encoding ``algorithm`` names (a learner's or an encoding's name)."""
    return table.onehot()[0] if encoding_of(algorithm) == ONE_HOT else table.codes()[0]
