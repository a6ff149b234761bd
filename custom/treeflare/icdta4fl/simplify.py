"""Lossless simplification of rule sets and trees.

Rule sets (before the rebuild):

- rules with no support or no class mass are dropped (they add nothing to any distribution);
- one-hot columns (numeric 0/1 columns named ``attribute=value``, grouped by attribute): rules
  that no valid one-hot row can meet (two columns of a group both 1, or a condition no 0/1 value
  meets) have no support and are dropped. The conditions of the kept rules are left as they are:
  writing the implied ones out ("attribute = v" implies "attribute = u is 0") was measured to
  hurt the rebuild, whose spanning rules then look like full-weight copies on every column of
  the group;
- rules that became identical are merged (masses and supports added).

Trees (after the rebuild): a subtree whose every node (leaves, and internal nodes where a
missing or unseen value stops) predicts the same class is collapsed into one leaf. Predicted
classes never change (a kept node keeps its ``missing`` child); probabilities of the collapsed
region become the subtree root's.
"""

from __future__ import annotations

import numpy as np

from ..data.schema import split_onehot_name
from ..trees.tree import LEAF, Tree
from .merge import deduplicate
from .rules import MISSING_ONLY, RuleSet

__all__ = ["onehot_groups_from_names", "simplify_rules", "collapse_same_class", "onehot_true_column"]

def onehot_groups_from_names(feature_names, feature_kinds) -> list[list[int]]:
    """Groups of numeric columns named ``attribute=value`` sharing the attribute (``Schema.onehot_names``: an
    "=" in the attribute is escaped, so a column named ``a=b`` is not taken for one of ``a``'s)."""
    groups: dict[str, list[int]] = {}
    for j, (name, kind) in enumerate(zip(feature_names, feature_kinds)):
        attribute, value = split_onehot_name(str(name))
        if kind == "numeric" and value is not None:
            groups.setdefault(attribute, []).append(j)
    return [cols for cols in groups.values()]


def _allows(lower, upper, value):
    return (lower < value) & (value <= upper)


def onehot_true_column(rules: RuleSet, group: list[int]) -> np.ndarray:
    """Per rule, the position in ``group`` of the column the rule requires to be 1, else -1
    (-2 when the rule requires two columns to be 1)."""
    cols = np.asarray(group)
    only_one = _allows(rules.lower[:, cols], rules.upper[:, cols], 1.0) & \
        ~_allows(rules.lower[:, cols], rules.upper[:, cols], 0.0)
    n_true = only_one.sum(axis=1)
    out = np.where(n_true == 1, np.argmax(only_one, axis=1), -1)
    return np.where(n_true > 1, -2, out)


def _onehot_satisfiable(rules: RuleSet, groups) -> np.ndarray:
    """Mask of the rules some valid one-hot row can meet."""
    lower, upper = rules.lower, rules.upper
    possible = np.ones(rules.n_rules, dtype=bool)
    for group in groups:
        cols = np.asarray(group)
        allow0 = _allows(lower[:, cols], upper[:, cols], 0.0)
        allow1 = _allows(lower[:, cols], upper[:, cols], 1.0)
        possible &= (allow0 | allow1).all(axis=1)
        possible &= ~(rules.missing[:, cols] == MISSING_ONLY).any(axis=1)  # one-hot columns hold no NaN
        only1 = allow1 & ~allow0
        n_true = only1.sum(axis=1)
        possible &= n_true <= 1
        # a column required to be 1 forces the rest of its group to 0
        only0 = (allow0 & ~allow1) | ((n_true == 1)[:, None] & ~only1)
        possible &= ~(only0 & ~allow0).any(axis=1)
    return possible


def simplify_rules(rules: RuleSet, *, onehot_groups=None) -> RuleSet:
    """Lossless simplification (see module docstring); the result is canonically sorted."""
    keep = (rules.support > 0) & (rules.mass.sum(axis=1) > 0)
    keep &= np.all(rules.lower < rules.upper, axis=1)
    if onehot_groups:
        keep &= _onehot_satisfiable(rules, onehot_groups)
    return deduplicate(rules.take(np.flatnonzero(keep))).sorted()


def collapse_same_class(tree: Tree) -> Tree:
    """Collapse every subtree in which all nodes predict the same class into a leaf."""
    pred = np.argmax(tree.node_proba(), axis=1)
    n = tree.n_nodes
    uniform = np.ones(n, dtype=bool)  # whole subtree predicts pred[node]
    for node in range(n - 1, -1, -1):  # children have larger indices: bottom-up
        kids = tree.children[node]
        if kids is not None:
            uniform[node] = bool(np.all(uniform[kids]) and np.all(pred[kids] == pred[node]))
    # keep nodes reachable without passing through a collapsed node
    kept = np.zeros(n, dtype=bool)
    make_leaf = np.zeros(n, dtype=bool)
    kept[0] = True
    for node in range(n):
        if not kept[node] or tree.children[node] is None:
            continue
        if uniform[node]:
            make_leaf[node] = True
        else:
            kept[tree.children[node]] = True
    new_index = np.cumsum(kept) - 1
    kind, feature, points, children, missing = [], [], [], [], []
    for node in np.flatnonzero(kept):
        if make_leaf[node] or tree.kind[node] == LEAF:
            kind.append(LEAF), feature.append(-1), points.append(None), children.append(None)
            missing.append(-1)
        else:
            kind.append(tree.kind[node]), feature.append(tree.feature[node])
            points.append(tree.split_points[node]), children.append(new_index[tree.children[node]])
            missing.append(tree.missing[node])
    return Tree(tree.feature_kinds, tree.n_classes, kind, feature, points, children,
                tree.counts[kept], tree.n_categories, missing=missing)
