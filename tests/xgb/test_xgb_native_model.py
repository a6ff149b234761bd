"""The engine's model writer (``engine/native_model.py``): hand-built trees and XGBoost's own trees rewritten through
``model_document`` load through the validator (``model_file.load_checked_booster``) and predict, in the installed
XGBoost, what the trees say: missing values by their default direction, each tree into its class, from the base score
as XGBoost applies it. Other XGBoost versions: ``scripts/check_xgb_versions.py``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from treeflare.xgb.engine.native_model import base_margin, margins, model_bytes, model_document
from treeflare.xgb.model_file import ModelError, check_model, load_checked_booster

xgb = pytest.importorskip("xgboost")
F32 = np.float32
NAN = np.nan
KEYS = ("left_children", "right_children", "parents", "split_indices", "split_conditions", "default_left",
        "base_weights", "loss_changes", "sum_hessian")


def tree(left, right, feature, cond, default_left):
    """Node arrays with made-up statistics (XGBoost does not predict with them); no ``parents``: the writer derives
    them."""
    n = len(left)
    return {"left_children": left, "right_children": right, "split_indices": feature, "split_conditions": cond,
            "default_left": default_left, "base_weights": [0.1] * n, "loss_changes": [1.0] * n,
            "sum_hessian": [float(n - k) for k in range(n)]}


# x0 < 0.5 (missing: left) ? (x1 < -1 (missing: right) ? 0.25 : -0.5) : 1.0
STUMPY = tree([1, 3, -1, -1, -1], [2, 4, -1, -1, -1], [0, 1, 0, 0, 0], [0.5, -1.0, 1.0, 0.25, -0.5],
              [1, 0, 0, 0, 0])
# x1 < 0.3 (missing: left) ? -0.125 : 0.75
SECOND = tree([1, -1, -1], [2, -1, -1], [1, 0, 0], [0.3, -0.125, 0.75], [1, 0, 0])
ROWS = np.array([[0.0, -2.0], [0.0, 0.0], [1.0, 0.0], [NAN, -2.0], [NAN, NAN], [0.0, NAN], [NAN, 5.0], [0.5, -1.0]],
                dtype=F32)
# the leaves each row reaches, worked out by hand from the trees above
STUMPY_LEAF = np.array([0.25, -0.5, 1.0, 0.25, -0.5, -0.5, -0.5, 1.0], dtype=F32)
SECOND_LEAF = np.array([-0.125, -0.125, -0.125, -0.125, -0.125, -0.125, 0.75, -0.125], dtype=F32)


def load(tmp_path, doc, name="model.json"):
    path = tmp_path / name
    path.write_bytes(model_bytes(doc))
    return load_checked_booster(path)


def predict(booster, X, **kw):
    return booster.predict(xgb.DMatrix(X, missing=np.nan, feature_names=booster.feature_names),
                           **kw).reshape(len(X), -1)


def test_binary_trees_route_missing_values_by_default_left(tmp_path):
    doc = model_document([STUMPY, SECOND], [0, 0], n_features=2, objective="binary:logistic", num_class=0,
                         base_score=0.25)
    booster = load(tmp_path, doc)
    margin = predict(booster, ROWS, output_margin=True)[:, 0]
    start = F32(-np.log(3.0))  # logit(0.25): XGBoost's float32 -logf(1/p - 1)
    assert base_margin(doc) == start
    assert np.array_equal(margin, (start + STUMPY_LEAF) + SECOND_LEAF)  # float32, in tree order, as XGBoost adds
    assert np.array_equal(margin, margins(doc, ROWS)[:, 0])
    np.testing.assert_allclose(predict(booster, ROWS)[:, 0], 1 / (1 + np.exp(-margin.astype(np.float64))), rtol=1e-6)


def test_multiclass_trees_go_to_their_class_from_a_margin_of_base_score(tmp_path):
    leaf = [tree([-1], [-1], [0], [v], [0]) for v in (0.5, -0.25, 2.0)]
    trees = [STUMPY, SECOND, leaf[0], leaf[1], STUMPY, leaf[2]]
    info = [0, 1, 2, 2, 1, 0]  # a round's trees in any class order
    doc = model_document(trees, info, n_features=2, objective="multi:softprob", num_class=3, base_score=0.5)
    booster = load(tmp_path, doc)
    margin = predict(booster, ROWS, output_margin=True)
    half = F32(0.5)  # multi:softprob starts every class at base_score itself (no link function)
    expect = np.stack([(half + STUMPY_LEAF) + F32(2.0), (half + SECOND_LEAF) + STUMPY_LEAF,
                       np.full(len(ROWS), (half + F32(0.5)) + F32(-0.25), dtype=F32)], axis=1)
    assert np.array_equal(margin, expect)
    assert np.array_equal(margin, margins(doc, ROWS))
    m = margin.astype(np.float64)
    np.testing.assert_allclose(predict(booster, ROWS), np.exp(m) / np.exp(m).sum(axis=1, keepdims=True), rtol=1e-6)
    # iteration_indptr: the first round is trees 0..2
    first = predict(booster, ROWS, output_margin=True, iteration_range=(0, 1))
    assert np.array_equal(first[:, 0], half + STUMPY_LEAF) and (first[:, 2] == half + F32(0.5)).all()


def test_regression_trees_add_to_base_score(tmp_path):
    doc = model_document([STUMPY, SECOND], [0, 0], n_features=2, objective="reg:squarederror", num_class=0,
                         base_score=3.0, feature_names=["a", "b"], feature_types=["q", "float"])
    booster = load(tmp_path, doc)
    expect = (F32(3.0) + STUMPY_LEAF) + SECOND_LEAF
    assert np.array_equal(predict(booster, ROWS, output_margin=True)[:, 0], expect)
    assert np.array_equal(predict(booster, ROWS)[:, 0], expect)
    assert booster.feature_names == ["a", "b"]


def test_the_document_is_in_the_spelling_every_xgboost_from_2_0_reads():
    doc = model_document([STUMPY, SECOND], [0, 0], n_features=2, objective="binary:logistic", num_class=0,
                         base_score=0.3)
    text = model_bytes(doc).decode()
    param = doc["learner"]["learner_model_param"]
    # 2.x read base_score with a float parser that keeps 0.5, silently, on "[...]" or more than 9 digits
    assert param["base_score"] == "3E-1" and param["boost_from_average"] == "0"
    assert doc["version"] == [2, 0, 0] and "cats" not in doc["learner"]["gradient_booster"]["model"]
    written = doc["learner"]["gradient_booster"]["model"]["trees"][0]
    assert written["tree_param"]["size_leaf_vector"] == "1" and written["parents"] == [2147483647, 0, 0, 1, 1]
    assert written["default_left"] == [1, 0, 0, 0, 0]
    # float arrays hold float32 values written as floats: XGBoost's reader takes "1" for an integer
    second = doc["learner"]["gradient_booster"]["model"]["trees"][1]
    assert second["split_conditions"][0] == float(F32(0.3)) != 0.3
    assert all(type(v) is float and v == float(F32(v)) for t in (written, second) for key in  # noqa: E721
               ("split_conditions", "base_weights", "loss_changes", "sum_hessian") for v in t[key])
    assert '"split_conditions":[0.5,-1.0,1.0,0.25,-0.5]' in text and "NaN" not in text
    multi = model_document([STUMPY] * 2, [0, 1], n_features=2, objective="multi:softprob", num_class=2,
                           base_score=0.5)
    assert multi["learner"]["learner_model_param"]["base_score"] == "5E-1"
    assert multi["learner"]["objective"]["softmax_multiclass_param"] == {"num_class": "2"}


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob", "reg:squarederror"])
def test_xgboost_models_rebuilt_from_their_arrays_predict_the_same(tmp_path, objective):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(300, 5)).astype(F32)
    X[rng.random(X.shape) < 0.25] = np.nan  # so that XGBoost learns default directions
    signal = np.nan_to_num(X[:, 0]) + np.nan_to_num(X[:, 1]) * 0.5
    k = 3 if objective == "multi:softprob" else 0
    y = {"binary:logistic": signal > 0.2, "multi:softprob": np.digitize(signal, [-0.5, 0.5]),
         "reg:squarederror": signal * 3 + 1}[objective].astype(np.float64)
    params = {"objective": objective, "tree_method": "hist", "max_depth": 3, "eta": 0.3, "seed": 0}
    if k:  # the engine starts every class at 0.5; XGBoost >= 3.2 would otherwise fit a per-class intercept
        params |= {"num_class": k, "base_score": 0.5}
    trained = xgb.train(params, xgb.DMatrix(X, y), 5)
    raw = json.loads(trained.save_raw("json"))
    model = raw["learner"]["gradient_booster"]["model"]
    assert any(any(t["default_left"]) for t in model["trees"])
    base = float(raw["learner"]["learner_model_param"]["base_score"].strip("[]").split(",")[0])
    doc = model_document([{key: t[key] for key in KEYS} for t in model["trees"]], model["tree_info"],
                         n_features=5, objective=objective, num_class=k, base_score=base)
    booster = load(tmp_path, doc)
    for margin in (True, False):
        np.testing.assert_allclose(predict(booster, X, output_margin=margin),
                                   predict(trained, X, output_margin=margin), rtol=0, atol=1e-6)
    assert np.array_equal(predict(booster, X, output_margin=True), margins(doc, X))


@pytest.mark.parametrize("change, message", [
    (dict(objective="reg:logistic"), "objective must be one of"),
    (dict(num_class=3), "num_class is 0 for binary:logistic"),
    (dict(base_score=1.0), "not a probability"),
    (dict(trees=[{**STUMPY, "defualt_left": [0] * 5}]), "unknown key 'defualt_left'"),
    (dict(trees=[{**STUMPY, "split_conditions": [0.5, NAN, 1.0, 0.25, -0.5]}]), "not a finite float32"),
    (dict(trees=[{**STUMPY, "right_children": [2, 4, 1, -1, -1]}]), "right_children[2]"),  # the validator's word
    (dict(trees=[{**STUMPY, "split_indices": [0, 2, 0, 0, 0]}]), "split_indices[1]: 2 is not a feature"),
    (dict(tree_info=[1]), "tree_info[0]"),
    (dict(feature_types=["q", "c"]), "numeric splits only"),
])
def test_the_writer_refuses_what_xgboost_would_misread(change, message):
    args = dict(trees=[STUMPY], tree_info=[0], n_features=2, objective="binary:logistic", num_class=0,
                base_score=0.5) | change
    with pytest.raises(ValueError, match=None) as info:
        model_document(args.pop("trees"), args.pop("tree_info"), **args)
    assert message in str(info.value)


def test_the_validator_reads_regression_and_hands_xgboost_a_base_score_every_version_reads(tmp_path, monkeypatch):
    doc = model_document([STUMPY], [0], n_features=2, objective="reg:squarederror", num_class=0, base_score=2.0)
    bad = json.loads(model_bytes(doc))
    bad["learner"]["learner_model_param"]["num_class"] = "3"
    with pytest.raises(ModelError, match="num_class: 3 classes for a reg:squarederror"):
        check_model(bad)
    multi = model_document([STUMPY] * 2, [0, 1], n_features=2, objective="multi:softprob", num_class=2,
                           base_score=0.5)
    param = multi["learner"]["learner_model_param"]
    param["base_score"] = "[5E-1,5E-1]"  # as 3.1+ write it: one number when all are equal, which 2.x read too
    check_model(multi)
    assert param["base_score"] == "5E-1"
    param["base_score"] = "[0.25,0.123456789012]"  # distinct: kept as a list, each number as float32 text
    check_model(multi)
    assert param["base_score"] == "[2.5E-1,1.2345679E-1]"
    (tmp_path / "m.json").write_text(json.dumps(multi))
    monkeypatch.setattr(xgb, "__version__", "3.0.5")  # it would read the list as 0.5 for every class
    with pytest.raises(ModelError, match="per-class base scores"):
        load_checked_booster(tmp_path / "m.json")
    monkeypatch.setattr(xgb, "__version__", "3.1.0")
    assert load_checked_booster(tmp_path / "m.json").num_boosted_rounds() == 1
