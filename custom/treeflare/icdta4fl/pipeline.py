"""ICDTA4FL step by step, on numpy arrays; the FLARE glue and the benchmark call these steps.

1. site:   ``train_local_tree(X, y, ...)`` -> tree dict (JSON-able, ``Tree.to_dict``)
2. server: sends every tree dict to every site
3. site:   ``score_trees(tree_dicts, X_test, y_test)`` -> {"accuracy": [..], "macro_f1": [..]}
4. server: ``select_trees(acc_matrix, f1_matrix)`` -> (selected indices, thresholds report)
5. server: ``aggregate(tree_dicts, selected, ...)`` -> (GlobalTree, stats)

The protocol that chains them (and the refinement rounds) is written once, in ``server`` and ``site``; it runs
through FLARE (``treeflare.flare.icdta4fl``) or in process (``driver``; with FLARE's serializer,
``treeflare.flare.icdta4fl.inprocess.run_in_process``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time

import numpy as np
from sklearn.metrics import f1_score

from ..trees.learners import get_learner
from ..trees.tree import Tree
from . import selection
from .merge import DEFAULT_MAX_RULES, UnusableTreeError, merge_rule_sets
from .model import GlobalTree
from .rebuild import grow_tree
from .rules import RuleSet, extract_rules
from .simplify import collapse_same_class, onehot_groups_from_names, simplify_rules

__all__ = [
    "train_local_tree", "score_trees", "select_trees", "aggregate", "check_aggregate_params", "refine_start",
    "tree_digest",
    "macro_f1", "DEFAULT_LOCAL_PARAMS", "DEFAULT_AGGREGATE_PARAMS", "DEFAULT_MAX_LEAVES", "UnusableTreeError",
]

log = logging.getLogger(__name__)

DEFAULT_LOCAL_PARAMS = {
    "max_depth": 5,
    "min_samples_split": None,  # CART: max(2, int(0.02 n)); ID3: 2
    "criterion": "gini",        # CART only
    "random_state": 42,         # CART only
    "n_bins": 4,                # ID3 only: quantile bins per numeric column
    "min_gain": 1e-7,           # ID3 only
}

# The global tree's default leaf budget, for both learners, in the in-process pipeline and the FLARE job alike: a
# size a person reads, whatever the local trees grew to (local ID3 trees reach thousands of leaves). Chosen on the
# accuracy-against-size front (scripts/bench_icdta4fl_front.py, budgets 8/16/32/64): see docs/icdta4fl.md.
DEFAULT_MAX_LEAVES = 32

DEFAULT_AGGREGATE_PARAMS = {
    "max_rules": DEFAULT_MAX_RULES,  # cap of the conjunction set
    "cap_by": "refine",              # cap by refining the most impure rules only ("entropy": the reference)
    "fallback_support": 1.0,         # pseudo-support of rules for categories unseen at a node
    "tree_weighting": "samples",     # "equal": every selected tree's class mass rescaled to one total
    "max_leaves": DEFAULT_MAX_LEAVES,  # "auto": 2 x the largest selected tree's leaves (or the local median's),
                                       # the budget before issue 24; None = no cap
    "max_depth": "auto",             # the selected trees' max depth (at least the local median's) + 2; None = unlimited
    "criterion": "entropy",
    "weighting": "support",          # "uniform" = the reference's unweighted means
    "simplify": True,
    "onehot": "auto",                # one-hot groups from "attribute=value" names
    "eps": None,                     # interval overlap; None = 0 (0.001 with reference_compat)
    "reference_compat": False,       # the reference's merge arithmetic, cap and unweighted rebuild
}


def check_aggregate_params(params) -> dict:
    """The aggregation options with defaults filled in; a bad budget or name is a ``ValueError`` now,
    not after every site has trained."""
    p = _with_defaults(DEFAULT_AGGREGATE_PARAMS, params)
    for key in ("max_leaves", "max_depth"):
        v = p[key]
        if v not in ("auto", None) and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"aggregation {key} must be 'auto', None or an integer >= 1, got {v!r}")
    if p["max_rules"] is None or isinstance(p["max_rules"], bool) or int(p["max_rules"]) < 1:
        raise ValueError(f"aggregation max_rules must be an integer >= 1, got {p['max_rules']!r}")
    if p["criterion"] not in ("entropy", "gini"):
        raise ValueError(f"aggregation criterion must be 'entropy' or 'gini', got {p['criterion']!r}")
    return p


def _with_defaults(defaults: dict, params) -> dict:
    unknown = set(params or {}) - set(defaults)
    if unknown:  # a misspelt option must not be silently ignored
        raise ValueError(f"unknown parameters {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **(params or {})}


def train_local_tree(X, y, *, algorithm, n_classes, feature_kinds=None, n_categories=None,
                     params=None) -> dict:
    """Fit a local tree with the learner named ``algorithm`` (``trees.learners``); returns ``Tree.to_dict()``.

    ``y`` holds indices into the global class list. ID3 takes the codes matrix (mixed kinds),
    CART a numeric (one-hot) matrix.
    """
    p = _with_defaults(DEFAULT_LOCAL_PARAMS, params)
    X = np.asarray(X, dtype=np.float64)
    kinds = list(feature_kinds) if feature_kinds is not None else ["numeric"] * X.shape[1]
    tree = get_learner(algorithm).fit(X, y, n_classes=n_classes, feature_kinds=kinds, n_categories=n_categories,
                                      params=p)
    return tree.to_dict()


def macro_f1(y_true, y_pred) -> float:
    """scikit-learn's macro F1 over the classes present in y_true or y_pred."""
    return float(f1_score(y_true, y_pred, average="macro", zero_division=0))


def _as_tree(tree) -> Tree:
    return tree if isinstance(tree, Tree) else Tree.from_dict(tree)


def score_trees(trees, X_test, y_test) -> dict:
    """Accuracy and macro-F1 of each tree (dict or Tree) on a site's test set.

    An empty test set gives None scores (the server's filter ignores them).
    """
    X_test = np.asarray(X_test, dtype=np.float64)
    y_test = np.asarray(y_test, dtype=np.int64)
    acc, f1 = [], []
    for tree in trees:
        tree = _as_tree(tree)
        if len(y_test) == 0:
            acc.append(None), f1.append(None)
            continue
        pred = tree.predict(X_test)
        acc.append(float(np.mean(pred == y_test)))
        f1.append(macro_f1(y_test, pred))
    return {"accuracy": acc, "macro_f1": f1}


def select_trees(accuracy, macro_f1, *, statistic="percentile", q=75.0, trees=None):
    """(n_sites, n_trees) score matrices -> (selected tree indices, thresholds report).

    None entries (sites that did not score) are ignored. ``trees`` (dicts or ``Tree``), when given, break
    ties by a digest of their content rather than by position.
    """
    acc = np.array(accuracy, dtype=np.float64)  # None -> nan
    f1 = np.array(macro_f1, dtype=np.float64)
    keys = None if trees is None else [tree_digest(t) for t in trees]
    return selection.select_trees(acc, f1, statistic=statistic, q=q, tie_keys=keys)


def tree_digest(tree) -> str:
    """SHA-256 of a tree's canonical JSON: the same tree gives the same key wherever it comes from."""
    payload = tree.to_dict() if isinstance(tree, Tree) else tree
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def aggregate(trees, selected, *, classes, feature_names=None, category_names=None,
              params=None) -> tuple[GlobalTree, dict]:
    """Merge the selected trees' rules and rebuild the global tree.

    ``trees`` are tree dicts (validated here) or ``Tree`` objects, all on the shared schema;
    ``selected`` indexes into them. Returns the ``GlobalTree`` and a stats dict (rule counts
    before and after simplification, budgets, leaves, depth, timings). A tree that cannot be used
    (its rules cannot be extracted, or merging it exceeds the memory bounds) raises
    ``UnusableTreeError`` with its index, so the caller can drop it and aggregate the rest. The model's
    ``grown_tree_`` is the rebuilt tree before same-class collapse (``refine_start``).
    """
    p = check_aggregate_params(params)
    t0 = time.perf_counter()
    selected = sorted(set(int(i) for i in selected))
    if not selected:
        raise ValueError("no tree selected")
    chosen = [_as_tree(trees[i]) for i in selected]
    first = chosen[0]
    for t in chosen[1:]:
        if t.feature_kinds != first.feature_kinds or t.n_classes != first.n_classes:
            raise ValueError("selected trees do not share one schema")
    if len(classes) != first.n_classes:
        raise ValueError(f"{len(classes)} class names for {first.n_classes} classes")
    reference = bool(p["reference_compat"])
    rule_sets = []
    for i, t in zip(selected, chosen):
        try:
            rule_sets.append(extract_rules(t, fallback_support=p["fallback_support"]))
        except (ValueError, OverflowError, MemoryError) as exc:
            raise UnusableTreeError(i, f"its rules cannot be extracted ({type(exc).__name__}: {exc})") from None
    if p["tree_weighting"] == "equal":
        # sample-weighted within a tree, but each tree brings the same total class mass
        totals = [max(float(r.mass.sum()), 1e-12) for r in rule_sets]
        mean_total = float(np.mean(totals))
        rule_sets = [RuleSet(r.lower, r.upper, r.equals, r.mass * (mean_total / t), r.support,
                             r.n_sources, r.feature_kinds, r.missing) for r, t in zip(rule_sets, totals)]
    elif p["tree_weighting"] != "samples":
        raise ValueError(f"tree_weighting must be 'samples' or 'equal', got {p['tree_weighting']!r}")
    t_extract = time.perf_counter()
    cap_by = "entropy" if reference and p["cap_by"] == "refine" else p["cap_by"]
    try:
        merged, merge_stats = merge_rule_sets(rule_sets, max_rules=p["max_rules"], eps=p["eps"],
                                              reference_compat=reference, cap_by=cap_by)
    except UnusableTreeError as exc:  # positions in rule_sets -> indices into trees
        raise UnusableTreeError(selected[exc.position], exc.reason) from None
    t_merge = time.perf_counter()

    groups = []
    if p["onehot"] == "auto" and feature_names is not None:
        groups = onehot_groups_from_names(feature_names, first.feature_kinds)
    elif isinstance(p["onehot"], (list, tuple)):
        groups = [list(g) for g in p["onehot"]]
    rules = simplify_rules(merged, onehot_groups=groups) if p["simplify"] else merged
    if rules.n_rules == 0:  # everything was unsatisfiable: fall back to the merged rules
        rules = merged

    local_leaves, local_depth = _budget_base(trees, chosen)
    max_leaves = 2 * local_leaves if p["max_leaves"] == "auto" else p["max_leaves"]
    max_depth = local_depth + 2 if p["max_depth"] == "auto" else p["max_depth"]
    weighting = "uniform" if reference and p["weighting"] == "support" else p["weighting"]
    tree, grow_stats = grow_tree(rules, n_categories=first.n_categories, max_leaves=max_leaves,
                                 max_depth=max_depth, criterion=p["criterion"], weighting=weighting)
    leaves_grown, grown = tree.n_leaves, tree
    if p["simplify"]:
        tree = collapse_same_class(tree)
    t_end = time.perf_counter()
    stats = {
        "selected": selected,
        "merge_order": [selected[i] for i in merge_stats["order"]],
        "skipped": [selected[i] for i in merge_stats["skipped"]],
        "capped_steps": len(merge_stats["capped"]),
        "n_rules_local": [int(r.n_rules) for r in rule_sets],
        "n_rules_merged": int(merged.n_rules),
        "n_rules": int(rules.n_rules),
        "local_max_leaves": int(local_leaves),
        "local_max_depth": int(local_depth),
        "max_leaves": None if max_leaves is None else int(max_leaves),
        "max_depth": None if max_depth is None else int(max_depth),
        "n_leaves_grown": int(leaves_grown),
        "n_leaves": int(tree.n_leaves),
        "depth": int(tree.depth),
        "truncated": bool(grow_stats["truncated"]),
        "time_s": {"extract": t_extract - t0, "merge": t_merge - t_extract,
                   "rebuild": t_end - t_merge, "total": t_end - t0},
    }
    model = GlobalTree(tree, classes, feature_names, category_names,
                       info={k: v for k, v in stats.items() if k != "time_s"})
    # what a refinement grows from: collapsed splits (children that predict alike) are where the sums find the
    # next split (adult, ID3, label skew, 32 leaves: the collapsed one-round tree was one leaf, 75.9% after a
    # round; the tree before collapse, 83.7%)
    model.grown_tree_ = grown
    return model, stats


def _budget_base(trees, chosen) -> tuple[int, int]:
    """Leaves and depth the "auto" budget doubles / adds 2 to: the largest selected tree's, floored by the median of
    all valid local trees (a tree that does not validate is no site's evidence). When the filter keeps one weak
    tree (german credit, 4 sites, label skew 0.5: 6 leaves kept, the others 10-16) the selected trees alone allowed
    a handful of leaves. Measured against the largest of all trees (CART, german/default_credit_card/adult/synthetic,
    label skew 0.5 and IID, 4 and 5 sites, 5 seeds): the same mean macro-F1 after one round in 15 of 16 cells (german,
    label skew, 5 sites: 1.5 points lower, from one seed) and within 0.6 points after three rounds on german; the
    median is kept because one site's oversized tree cannot raise it."""
    sizes = []
    for t in trees:
        try:
            t = _as_tree(t)
        except ValueError:
            continue
        sizes.append((t.n_leaves, t.depth))
    leaves = max(max(t.n_leaves for t in chosen), int(np.median([n for n, _ in sizes])) if sizes else 1)
    depth = max(max(t.depth for t in chosen), int(np.median([d for _, d in sizes])) if sizes else 0)
    return leaves, depth


def refine_start(model: GlobalTree) -> Tree:
    """The one-round tree a refinement grows from: before same-class collapse where ``aggregate`` kept it (the
    same predictions, more places to split)."""
    return getattr(model, "grown_tree_", None) or model.tree_
