"""GlobalTree as a scikit-learn estimator of a model the federation fitted: classifier tags, clone, set_params,
scorers, FrozenEstimator, joblib, the check_estimator checks that apply without refitting, and decision_path as
scikit-learn's node indicator."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import joblib
import numpy as np
import pytest
from scipy.sparse import csr_matrix
from sklearn.base import clone, is_classifier
from sklearn.frozen import FrozenEstimator
from sklearn.metrics import accuracy_score, get_scorer, log_loss
from sklearn.model_selection import KFold, cross_val_score
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils import get_tags
from sklearn.utils.estimator_checks import check_estimator
from sklearn.utils.validation import check_is_fitted

from export_helpers import MIXED, hand_made_id3, mixed_rows
from treeflare.data.csv_io import features_table
from treeflare.icdta4fl.encoding import encode, feature_space
from treeflare.icdta4fl.model import GlobalTree
from treeflare.trees.cart import tree_from_sklearn
from treeflare.trees.tree import LEAF

# the check_estimator checks that cannot apply to a model that is fitted when made and never refitted (listed in
# ClassCodesClassifier's docstring); every other check that fails must fail only because it calls fit
NOT_APPLICABLE = {
    "check_no_attributes_set_in_init": "the constructor's parameters are the fitted model",
    "check_do_not_raise_errors_in_init_or_set_params": "the parameters are checked when given",
    "check_n_features_in": "n_features_in_ exists before any fit",
}


def cart_model():
    """(a GlobalTree converted from scikit-learn's CART on MIXED's rows, that CART, new rows, their labels)."""
    frame, y = mixed_rows(600, 1)
    clf = DecisionTreeClassifier(max_depth=5, random_state=0).fit(encode(features_table(frame, MIXED), "cart"), y)
    model = GlobalTree(tree_from_sklearn(clf, n_classes=3), MIXED.classes, feature_space(MIXED, "cart")[0],
                       data_schema=MIXED, encoding="cart")
    rows, codes = mixed_rows(500, 7)
    return model, clf, rows, np.asarray(MIXED.classes, dtype=object)[codes]


def test_a_fitted_classifier_to_scikit_learn():
    model = cart_model()[0]
    assert is_classifier(model)
    check_is_fitted(model)
    tags = get_tags(model)
    assert not tags.requires_fit and tags.input_tags.allow_nan and tags.input_tags.string
    bare = GlobalTree(model.tree_, model.classes_)  # no schema: encoded arrays only
    assert not get_tags(bare).input_tags.string
    assert list(bare.feature_names_in_) == [f"x{j}" for j in range(model.n_features_in_)]
    assert model.n_outputs_ == 1 and model.n_classes_ == 3 and list(model.classes_) == ["a", "b", "c"]
    assert model.n_features_in_ == len(model.feature_names_in_) == len(feature_space(MIXED, "cart")[0])


def test_score_and_scorers_agree_with_scikit_learns_metrics():
    model, _, rows, labels = cart_model()
    predicted = model.predict(rows)
    accuracy = accuracy_score(labels, predicted)
    assert 0.5 < accuracy < 1.0
    assert get_scorer("accuracy")(model, rows, labels) == pytest.approx(accuracy)
    assert model.score(rows, labels) == pytest.approx(accuracy)
    weights = np.linspace(0.1, 2.0, len(labels))
    assert model.score(rows, labels, sample_weight=weights) == pytest.approx(
        accuracy_score(labels, predicted, sample_weight=weights))
    assert get_scorer("neg_log_loss")(model, rows, labels) == pytest.approx(
        -log_loss(labels, model.predict_proba(rows), labels=model.classes_))


def test_clone_is_an_equal_model_that_shares_nothing():
    model, _, rows, _ = cart_model()
    copy = clone(model)
    assert copy is not model and copy.tree_ is not model.tree_ and copy.data_schema == model.data_schema
    assert json.dumps(copy.to_dict()) == json.dumps(model.to_dict())
    assert np.array_equal(copy.predict_proba(rows), model.predict_proba(rows))
    copy.tree_.counts[0] += 1.0  # a deep copy: the original's tree is untouched
    assert not np.array_equal(copy.tree_.counts[0], model.tree_.counts[0])
    assert sorted(model.get_params()) == ["category_names", "classes", "data_schema", "encoding", "feature_names",
                                          "info", "tree"]


def test_set_params_swaps_the_tree_and_a_refused_value_changes_nothing():
    model, clf, rows, _ = cart_model()
    stump = DecisionTreeClassifier(max_depth=1, random_state=0).fit(encode(features_table(rows, MIXED), "cart"),
                                                                    np.arange(len(rows)) % 3)
    model.set_params(tree=tree_from_sklearn(stump, n_classes=3))
    assert model.get_n_leaves() == 2 and model.tree_ is model.tree
    assert np.array_equal(model.predict_codes(rows), stump.predict(encode(features_table(rows, MIXED), "cart")))
    before = model.get_params(deep=False)
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        model.set_params(classes=["a", "b"])
    after = model.get_params(deep=False)
    assert all(after[k] is before[k] for k in before) and list(model.classes_) == ["a", "b", "c"]


def test_fit_refuses_and_frozen_estimator_scores_folds():
    model, _, rows, labels = cart_model()
    with pytest.raises(NotImplementedError, match="the federation trained"):
        model.fit(rows, labels)
    with pytest.raises(NotImplementedError, match="FrozenEstimator"):
        cross_val_score(model, rows, labels, cv=3, error_score="raise")
    scores = cross_val_score(FrozenEstimator(model), rows, labels, cv=KFold(3))
    folds = [accuracy_score(labels[test], model.predict(rows.iloc[test])) for _, test in KFold(3).split(rows)]
    assert np.allclose(scores, folds)


def test_joblib_round_trip_and_repr(tmp_path):
    model, _, rows, _ = cart_model()
    joblib.dump(model, tmp_path / "model.joblib")  # a user's own file; the package itself never pickles
    again = joblib.load(tmp_path / "model.joblib")
    assert type(again) is GlobalTree and np.array_equal(again.predict_proba(rows), model.predict_proba(rows))
    assert repr(model) == f"GlobalTree(n_leaves={model.get_n_leaves()}, depth={model.get_depth()}, " \
                          "classes=['a', 'b', 'c'])"
    assert "GlobalTree" in model._repr_html_()  # scikit-learn's notebook view reads get_params


def assert_checks_apply(model):
    """check_estimator: the NOT_APPLICABLE checks fail, every other failing check fails because it calls fit, and
    the checks that need no fit pass."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checks' own warnings about what they try
        results = check_estimator(model, expected_failed_checks=NOT_APPLICABLE, on_fail=None, on_skip=None)
    passed = set()
    for r in results:
        name, status = r["check_name"], r["status"]
        if name in NOT_APPLICABLE:
            assert status == "xfail", name  # still fails, so the docstring's list is still true
        elif status == "failed":
            chain, e = [], r["exception"]
            while e is not None:
                chain.append(e)
                e = e.__cause__ or e.__context__
            assert any("the federation trained" in str(x) for x in chain), (name, r["exception"])
        elif status == "passed":
            passed.add(name)
    assert {"check_estimator_cloneable", "check_estimator_repr", "check_get_params_invariance", "check_set_params",
            "check_parameters_default_constructible", "check_mixin_order", "check_valid_tag_types"} <= passed


def test_check_estimator_passes_every_check_that_does_not_refit():
    assert_checks_apply(cart_model()[0])


def test_decision_path_is_scikit_learns_indicator():
    model, clf, rows, _ = cart_model()
    X = encode(features_table(rows, MIXED), "cart")
    assert np.isnan(X).any()
    path = model.decision_path(rows)
    assert isinstance(path, csr_matrix) and path.shape == (len(rows), model.tree_.n_nodes)
    # tree_from_sklearn keeps scikit-learn's node ids, so the indicators are equal entry for entry
    assert np.array_equal(path.toarray(), clf.decision_path(X).toarray())
    assert np.array_equal(model.decision_path(X).toarray(), path.toarray())
    assert model.decision_path(X[:0]).shape == (0, model.tree_.n_nodes)


@pytest.mark.parametrize("missing_pos", [-1, 2])
def test_decision_path_ends_where_apply_stops(missing_pos):
    """An ID3 tree whose nodes stop some rows (a category with no child, a NaN with no missing child)."""
    model = hand_made_id3(missing_pos)
    rows, _ = mixed_rows(400, 3)
    stops, path, tree = model.apply(rows), model.decision_path(rows), model.tree_
    assert (tree.kind[stops] != LEAF).any()  # some rows stop at an internal node
    for i in range(len(rows)):
        nodes = path.indices[path.indptr[i]:path.indptr[i + 1]]
        assert nodes[0] == 0 and nodes[-1] == stops[i]
        assert all(child in tree.children[parent] for parent, child in zip(nodes, nodes[1:]))  # root down
    assert path.data.sum() == (tree.node_depths()[stops] + 1).sum()


def test_the_estimator_modules_import_no_exporter():
    """scikit-learn's rule: exporters import the estimator, never the reverse: not when the estimator is imported,
    and not inside any of its functions either (the import graph counts those too)."""
    code = ("import sys, treeflare.base, treeflare.icdta4fl.model, treeflare.xgb.model; "
            "print([m for m in sys.modules if m.startswith('treeflare') and 'export' in m])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
    from test_import_graph import import_graph
    from test_layering import reachable

    graph = import_graph()
    for estimator in ("treeflare.base", "treeflare.icdta4fl.model", "treeflare.xgb.model"):
        assert not [m for m in reachable(graph, estimator) if "export" in m], estimator
