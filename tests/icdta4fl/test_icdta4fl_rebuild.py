"""Rebuilding the global tree from rules: semantics, budget, lossless simplification, determinism."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from test_icdta4fl_helpers import random_inputs, random_rules, rules
from treeflare.icdta4fl import collapse_same_class, grow_tree, merge_rule_sets, simplify_rules
from treeflare.icdta4fl.simplify import onehot_groups_from_names
from treeflare.trees import CATEGORICAL, NUMERIC

NUM2 = ["numeric", "numeric"]
CAT2 = ["categorical", "categorical"]


def ruleset_predict(r, X):
    """Class of the support-weighted mix of the rules covering each row; -1 if none covers."""
    cover = r.covers(X).astype(float)
    mix = cover @ (r.dist * r.support[:, None])
    return np.where(cover.sum(axis=1) > 0, np.argmax(mix, axis=1), -1)


def test_rebuild_of_two_cart_trees_matches_their_conjunction():
    a = rules(NUM2, [({0: (None, 5.0)}, [0.9, 0.1], 50), ({0: (5.0, None)}, [0.2, 0.8], 50)])
    b = rules(NUM2, [({1: (None, 2.0)}, [0.7, 0.3], 40), ({1: (2.0, None)}, [0.1, 0.9], 60)])
    merged, _ = merge_rule_sets([a, b])
    tree, _ = grow_tree(merged)
    assert tree.n_leaves == 4 and tree.depth == 2
    X = np.array([[1.0, 1.0], [1.0, 3.0], [6.0, 1.0], [6.0, 3.0], [5.0, 2.0]])
    np.testing.assert_array_equal(tree.predict(X), ruleset_predict(merged, X))
    # leaf distributions: support-weighted class mass of the rule in the leaf
    leaf = tree.apply(X[:1])[0]
    np.testing.assert_allclose(tree.node_proba()[leaf], [(45 + 28) / 90, (5 + 12) / 90])


def test_id3_rules_rebuild_into_multiway_tree_with_node_fallback():
    A = rules(CAT2, [({0: 0}, [0.9, 0.1], 100), ({0: 1}, [0.2, 0.8], 100)])
    B = rules(CAT2, [({1: 0}, [0.8, 0.2], 80), ({1: 1}, [0.3, 0.7], 120)])
    merged, _ = merge_rule_sets([A, B])
    tree, _ = grow_tree(merged, n_categories=[3, 2])
    assert tree.kind[0] == CATEGORICAL and tree.n_leaves == 4
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], dtype=float)
    np.testing.assert_array_equal(tree.predict(X), ruleset_predict(merged, X))
    # unseen code 2 and a missing value stop at the root: the root's own distribution
    root = tree.node_proba()[0]
    np.testing.assert_allclose(tree.predict_proba(np.array([[2.0, 0.0]]))[0], root)
    np.testing.assert_allclose(tree.predict_proba(np.array([[np.nan, 1.0]]))[0], root)


def test_rules_spanning_a_threshold_go_to_both_sides_with_a_share_of_their_weight():
    r = rules(NUM2, [({0: (None, 5.0)}, [1.0, 0.0], 30), ({0: (5.0, None)}, [0.0, 1.0], 30),
                     ({1: (None, 1.0)}, [0.5, 0.5], 10)], n_classes=2)
    tree, _ = grow_tree(r, max_depth=1)
    assert tree.kind[0] == NUMERIC and tree.feature[0] == 0 and tree.split_points[0][0] == 5.0
    # the x1 rule spans x0 = 5; the two x0 cells weigh the same (30 each), so it sends half of
    # its weight (10, p = [.5, .5]) to each side and the children add up to the root
    np.testing.assert_allclose(tree.counts[1], [32.5, 2.5])
    np.testing.assert_allclose(tree.counts[2], [2.5, 32.5])
    np.testing.assert_allclose(tree.counts[1] + tree.counts[2], tree.counts[0])


def test_multiclass_five_classes():
    rng = np.random.default_rng(7)
    r = random_rules(rng, 60, ["numeric", "categorical", "numeric"], n_classes=5)
    tree, _ = grow_tree(r, n_categories=[None, 3, None])
    assert tree.counts.shape[1] == 5
    X = random_inputs(rng, 500, ["numeric", "categorical", "numeric"])
    proba = tree.predict_proba(X)
    assert proba.shape == (500, 5)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert len(np.unique(tree.predict(X))) >= 3


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n_rules=st.integers(1, 40), n_classes=st.integers(2, 5),
       budget=st.sampled_from([None, 4, 12]))
def test_simplification_never_changes_a_prediction(seed, n_rules, n_classes, budget):
    rng = np.random.default_rng(seed)
    kinds = ["numeric", "categorical", "numeric"]
    r = random_rules(rng, n_rules, kinds, n_classes)
    X = random_inputs(rng, 300, kinds)
    # rules: dropping unsupported rules and merging duplicates keeps the rule-set prediction
    s = simplify_rules(r)
    covered = ruleset_predict(r, X) >= 0
    supported = r.covers(X)[:, r.support > 0].any(axis=1)
    both = covered & supported
    np.testing.assert_array_equal(ruleset_predict(s, X)[both], ruleset_predict(r, X)[both])
    # trees: collapsing same-class subtrees keeps every predicted class
    tree, _ = grow_tree(r, max_leaves=budget, max_nodes=5000)
    small = collapse_same_class(tree)
    assert small.n_leaves <= tree.n_leaves
    np.testing.assert_array_equal(small.predict(X), tree.predict(X))


def test_onehot_simplification_drops_only_unsatisfiable_rules():
    names = ["a=x", "a=y", "a=z", "b"]
    kinds = ["numeric"] * 4
    groups = onehot_groups_from_names(names, kinds)
    assert groups == [[0, 1, 2]]
    r = rules(kinds, [({0: (0.5, None), 1: (0.5, None)}, [1, 0], 5),     # a=x and a=y: impossible
                      ({0: (0.5, None), 1: (None, 0.5)}, [0, 1], 5),     # a=x (a=y implied 0)
                      ({2: (None, 0.5), 3: (1.0, 2.0)}, [1, 0], 5),
                      ({0: (0.2, 0.7)}, [1, 0], 5)])                    # no 0/1 value fits
    s = simplify_rules(r, onehot_groups=groups)
    assert s.n_rules == 2
    valid = np.array([[1, 0, 0, 1.5], [0, 1, 0, 1.5], [0, 0, 1, 0.0], [0, 0, 0, 1.7]], dtype=float)
    np.testing.assert_array_equal(ruleset_predict(s, valid), ruleset_predict(r, valid))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), max_leaves=st.integers(1, 20), max_depth=st.integers(1, 6))
def test_budget_is_respected(seed, max_leaves, max_depth):
    rng = np.random.default_rng(seed)
    kinds = ["numeric", "categorical", "numeric", "categorical"]
    r = random_rules(rng, 80, kinds, 3)
    tree, _ = grow_tree(r, max_leaves=max_leaves, max_depth=max_depth)
    assert tree.n_leaves <= max_leaves
    assert tree.depth <= max_depth
    X = random_inputs(rng, 200, kinds)
    assert tree.predict(X).shape == (200,)  # every input gets a prediction


def test_budget_growth_is_best_first():
    # one strong split (x0) and a weak one (x1): with 2 leaves the strong one is taken
    r = rules(NUM2, [({0: (None, 0.0), 1: (None, 0.0)}, [1.0, 0.0], 50),
                     ({0: (None, 0.0), 1: (0.0, None)}, [0.9, 0.1], 50),
                     ({0: (0.0, None), 1: (None, 0.0)}, [0.0, 1.0], 50),
                     ({0: (0.0, None), 1: (0.0, None)}, [0.2, 0.8], 50)])
    tree, _ = grow_tree(r, max_leaves=2)
    assert tree.n_leaves == 2 and tree.feature[0] == 0


def test_rebuild_is_deterministic():
    rng = np.random.default_rng(11)
    r = random_rules(rng, 100, ["numeric", "categorical", "numeric"], 3)
    t1, _ = grow_tree(r.sorted(), max_leaves=16)
    t2, _ = grow_tree(r.take(rng.permutation(r.n_rules)).sorted(), max_leaves=16)
    assert t1.to_dict() == t2.to_dict()
