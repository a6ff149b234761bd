"""The shared tree representation, its JSON form and the validation of received payloads."""

import json

import numpy as np
import pytest

from treeflare.trees import (CATEGORICAL, LEAF, NUMERIC, Tree, TreePayloadError, default_min_samples_split,
                             fit_cart, fit_id3, validate_tree_dict)


def small_tree():
    # root: categorical x1 in {0, 2}; child for 0: numeric x0 <= 1.5 / > 1.5
    return Tree(["numeric", "categorical"], 3,
                kind=[CATEGORICAL, NUMERIC, LEAF, LEAF, LEAF],
                feature=[1, 0, -1, -1, -1],
                split_points=[np.array([0.0, 2.0]), np.array([1.5]), None, None, None],
                children=[np.array([1, 4]), np.array([2, 3]), None, None, None],
                counts=[[10, 20, 30], [8, 2, 0], [8, 0, 0], [0, 2, 0], [2, 18, 30]],
                n_categories=[None, 3])


def test_predict_routes_numeric_categorical_and_falls_back_to_node():
    t = small_tree()
    X = np.array([[1.0, 0], [1.5, 0], [2.0, 0], [9.0, 2], [1.0, 1], [np.nan, 0], [1.0, np.nan]])
    # 1.5 <= 1.5 goes left; code 1 has no child and NaN codes stop at the root (its majority 2);
    # a NaN numeric value stops at node 1 (majority 0)
    np.testing.assert_array_equal(t.apply(X), [2, 2, 3, 4, 0, 1, 0])
    np.testing.assert_array_equal(t.predict(X), [0, 0, 1, 2, 2, 0, 2])
    np.testing.assert_allclose(t.predict_proba(X)[4], [1 / 6, 2 / 6, 3 / 6])
    assert t.depth == 2 and t.n_leaves == 3
    assert t.decision_path([2.0, 0]) == [0, 1, 3]
    assert t.decision_path([2.0, 1]) == [0]


def test_json_round_trip_is_plain_json():
    t = small_tree()
    d = t.to_dict()
    text = json.dumps(d, allow_nan=False)
    t2 = Tree.from_dict(json.loads(text))
    X = np.array([[1.0, 0], [3.0, 0], [0.0, 2], [0.0, 1]])
    np.testing.assert_array_equal(t2.predict_proba(X), t.predict_proba(X))
    assert t2.to_dict() == d


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["nodes"][1].__setitem__("thresholds", [float("nan")]), "nodes[1].thresholds[0]"),
    (lambda d: d["nodes"][1].__setitem__("thresholds", [float("inf")]), "nodes[1].thresholds[0]"),
    (lambda d: d["nodes"][1].__setitem__("thresholds", [None]), "nodes[1].thresholds[0]"),
    (lambda d: d["nodes"][2].__setitem__("counts", [1.0, 2.0]), "nodes[2].counts"),
    (lambda d: d["nodes"][2].__setitem__("counts", [1.0, -2.0, 0.0]), "nodes[2].counts[1]"),
    (lambda d: d["nodes"][2].__setitem__("counts", [1.0, True, 0.0]), "nodes[2].counts[1]"),
    (lambda d: d["nodes"][1].__setitem__("feature", 7), "nodes[1].feature"),
    (lambda d: d["nodes"][1].__setitem__("feature", 1), "nodes[1].feature"),  # numeric split on categorical
    (lambda d: d["nodes"][0].__setitem__("values", [0, 5]), "nodes[0].values[1]"),  # code >= n_categories
    (lambda d: d["nodes"][0].__setitem__("values", [2, 0]), "nodes[0].values"),
    (lambda d: d["nodes"][1].__setitem__("children", [0, 3]), "nodes[1].children[0]"),  # cycle to root
    (lambda d: d["nodes"][1].__setitem__("children", [4, 3]), "nodes[1].children[0]"),  # two parents
    (lambda d: d["nodes"].append({"kind": "leaf", "counts": [0, 0, 1]}), "nodes[5]"),  # orphan
    (lambda d: d.__setitem__("n_classes", "3"), "n_classes"),
    (lambda d: d.__setitem__("version", 99), "version"),
    (lambda d: d.__setitem__("schema", "other"), "schema"),
    (lambda d: d.__setitem__("nodes", {"0": {}}), "nodes"),
    (lambda d: d["nodes"].__setitem__(3, [1, 2]), "nodes[3]"),
])
def test_validation_rejects_malformed_payloads(mutate, field):
    d = small_tree().to_dict()
    mutate(d)
    with pytest.raises(TreePayloadError) as exc:
        Tree.from_dict(d)
    assert exc.value.field == field
    assert isinstance(exc.value, ValueError)


def test_validation_caps_size_and_depth_without_recursion():
    # a chain 5000 deep: validated iteratively and rejected by the depth cap, not by the stack
    # node k at index 2k, its left leaf at 2k+1, its right child at 2k+2
    n = 5000
    flat = []
    for k in range(n):
        flat.append({"kind": "numeric", "feature": 0, "thresholds": [0.5],
                     "children": [2 * k + 1, 2 * k + 2], "counts": [1.0, 1.0]})
        flat.append({"kind": "leaf", "counts": [1.0, 0.0]})
    flat.append({"kind": "leaf", "counts": [0.0, 1.0]})
    d = {"schema": "treeflare.tree", "version": 1, "n_features": 1, "n_classes": 2,
         "feature_kinds": ["numeric"], "n_categories": [None], "nodes": flat}
    with pytest.raises(TreePayloadError, match="depth"):
        validate_tree_dict(d)
    with pytest.raises(TreePayloadError, match="limit"):
        validate_tree_dict(d, max_nodes=100)
    validate_tree_dict(d, max_depth=n + 1)  # fine when allowed
    t = Tree.from_dict(d, max_depth=n + 1)
    assert t.depth == n
    assert t.predict(np.array([[1.0]]))[0] == 1  # traversal is iterative too


def test_validation_checks_shared_schema():
    d = small_tree().to_dict()
    with pytest.raises(TreePayloadError, match="n_classes"):
        validate_tree_dict(d, n_classes=4)
    with pytest.raises(TreePayloadError, match="feature_kinds"):
        validate_tree_dict(d, feature_kinds=["numeric", "numeric"])


def test_id3_multiway_categorical_and_unseen_value_falls_back_to_node_majority():
    rng = np.random.default_rng(0)
    x0 = rng.integers(0, 3, 300).astype(float)
    x1 = rng.integers(0, 2, 300).astype(float)
    y = np.where(x0 == 0, 0, np.where(x0 == 1, 1, 2 + (x1 == 1)))  # 4 classes
    X = np.column_stack([x0, x1])
    t = fit_id3(X, y, n_classes=5, feature_kinds=["categorical", "categorical"], n_categories=[4, 2],
                max_depth=3)
    assert t.kind[0] == CATEGORICAL and t.feature[0] == 0
    assert list(t.split_points[0]) == [0, 1, 2]
    assert np.all(t.predict(X) == y)
    # code 3 was never seen: stops at the root, whose majority class is the largest one
    root_majority = int(np.argmax(np.bincount(y, minlength=5)))
    assert t.predict(np.array([[3.0, 0.0]]))[0] == root_majority
    assert t.counts.shape == (t.n_nodes, 5) and np.all(t.counts[:, 4] == 0)


def test_id3_numeric_bins_become_raw_intervals():
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 100, 400)
    y = (x > 50).astype(int)
    t = fit_id3(x[:, None], y, n_classes=2, feature_kinds=["numeric"], n_bins=4, max_depth=2)
    assert t.kind[0] == NUMERIC
    edges = t.split_points[0]
    assert len(edges) == 3  # 4 quantile bins -> 4 intervals
    np.testing.assert_allclose(edges, np.quantile(x, [0.25, 0.5, 0.75]))
    assert np.mean(t.predict(x[:, None]) == y) > 0.97
    t2 = fit_id3(x[:, None], y, n_classes=2, feature_kinds=["numeric"], max_depth=2, min_samples_split=1000)
    assert t2.n_nodes == 1


def test_id3_respects_min_gain_and_depth():
    X = np.array([[0.0], [1.0], [0.0], [1.0]])
    y = np.array([0, 0, 1, 1])  # x0 carries no information
    assert fit_id3(X, y, n_classes=2, feature_kinds=["categorical"]).n_nodes == 1
    rng = np.random.default_rng(2)
    X = rng.integers(0, 3, (500, 6)).astype(float)
    y = (X.sum(axis=1) % 2).astype(int)
    assert fit_id3(X, y, n_classes=2, feature_kinds=["categorical"] * 6, max_depth=2).depth == 2


def test_cart_maps_site_classes_onto_global_list_and_default_min_samples_split():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3))
    y = np.where(X[:, 0] > 0, 4, 1)  # the site only has global classes 1 and 4
    t = fit_cart(X, y, n_classes=5, max_depth=3)
    assert t.counts.shape[1] == 5
    assert np.all(t.counts[:, [0, 2, 3]] == 0)
    np.testing.assert_allclose(t.counts[0], [0, np.sum(y == 1), 0, 0, np.sum(y == 4)])
    assert set(np.unique(t.predict(X))) <= {1, 4}
    assert np.mean(t.predict(X) == y) == 1.0
    assert default_min_samples_split(50) == 2  # the reference's float 1.0 quirk is gone
    assert default_min_samples_split(1000) == 20
    # a 60-row site still splits below the root
    y_small = (X[:60, 0] > 0).astype(int) + 2 * (X[:60, 1] > 0)
    assert fit_cart(X[:60], y_small, n_classes=4, max_depth=3).depth >= 2


def test_cart_single_class_site_gives_a_leaf():
    t = fit_cart(np.zeros((5, 2)), np.full(5, 2), n_classes=3)
    assert t.n_nodes == 1 and t.predict(np.zeros((1, 2)))[0] == 2
